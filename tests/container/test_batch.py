"""Reading many objects at once (ztensor/container/batch.py): the same arrays as reading them
one by one, owned and independent, on every thread count; the column form of the
plain-view rule agrees with formats/dense.py's."""
import os

import numpy as np
import pytest

import ztensor
from ztensor import kernels
from ztensor.container import manifest_table
from ztensor.formats import dense

RNG = np.random.default_rng(7)
TENSORS = {
    "f32": RNG.standard_normal((30, 7)).astype(np.float32),
    "big": RNG.standard_normal(400_000).astype(np.float32),        # > 1 MiB: own memory
    "i8": RNG.integers(-100, 100, 77).astype(np.int8),
    "scalar": np.float64(2.5),
    "empty": np.zeros((0, 4), np.int16),
    "bool": RNG.integers(0, 2, 13).astype(bool),
    "u64": np.arange(9, dtype=np.uint64) << 60,
    "c64": (RNG.standard_normal(5) + 1j).astype(np.complex64),     # logical type
    "be": np.arange(6, dtype=">i4"),                               # stored little-endian
}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("batch") / "m.zt"
    with ztensor.Writer(str(path)) as w:
        for name, arr in TENSORS.items():
            w.write_numpy(name, arr)
        w.write_numpy("zstd", np.arange(5000, dtype=np.float32), compress=True)
        w.write_numpy("bf16", np.linspace(-2, 2, 8, dtype=np.float32), type="bf16")
    return str(path)


@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_batch_equals_one_by_one(path, threads):
    with ztensor.Reader(path) as r:
        names = r.keys()
        one_by_one = {n: r.read_numpy(n, copy=True) for n in names}
        together = r.read_numpy(names, copy=True, threads=threads)
    assert list(together) == names
    for n in names:
        a, b = together[n], one_by_one[n]
        assert a.dtype == b.dtype and a.shape == b.shape, n
        np.testing.assert_array_equal(a, b)
        assert a.flags.writeable and a.dtype.isnative


@pytest.mark.parametrize("seed", range(4))
def test_any_subset_in_any_order(path, seed):
    # the shared allocation is laid out in the caller's order, not the file's
    rng = np.random.default_rng(seed)
    with ztensor.Reader(path) as r:
        names = list(rng.permutation(r.keys())[:rng.integers(1, len(r.keys()) + 1)])
        names += names[:2]  # repeated names come back once
        got = r.read_numpy(names, copy=True, threads=int(rng.integers(1, 4)))
        assert list(got) == list(dict.fromkeys(names))
        for n, a in got.items():
            want = r.read_numpy(n, copy=True)
            assert a.dtype == want.dtype and a.shape == want.shape, n
            np.testing.assert_array_equal(a, want)
    for a in got.values():  # each its own bytes: filling one leaves the others
        before = {n: b.copy() for n, b in got.items()}
        a[...] = 0
        for n, b in got.items():
            if b is not a:
                np.testing.assert_array_equal(b, before[n])


def test_arrays_are_independent_and_outlive_the_reader(path):
    with ztensor.Reader(path) as r:
        out = r.read_tensors(["f32", "i8", "big"], copy=True)
    out["f32"][...] = 0
    out["big"][:10] = -1
    np.testing.assert_array_equal(out["i8"], TENSORS["i8"])
    np.testing.assert_array_equal(out["big"][10:], TENSORS["big"][10:])
    with ztensor.Reader(path) as r:  # the file is untouched
        np.testing.assert_array_equal(r.read_numpy("f32"), TENSORS["f32"])


def test_missing_and_repeated_names(path):
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.ObjectNotFoundError):
            r.read_numpy(["f32", "nope"], copy=True)
        out = r.read_numpy(["i8", "i8"], copy=True)
        assert list(out) == ["i8"]
        assert r.read_numpy([], copy=True) == {}
        with pytest.raises(ValueError):
            r.read_numpy(["i8"], copy=True, threads=0)


def test_verify_and_unmapped_readers_take_the_per_object_path(path):
    for kw in ({"verify": True}, {"mmap": False}):
        with ztensor.Reader(path, **kw) as r:
            out = r.read_numpy(r.keys(), copy=True)
        np.testing.assert_array_equal(out["big"], TENSORS["big"])


def test_load_file_copy_uses_the_batch(path):
    from ztensor.numpy import load_file
    out = load_file(path, copy=True, threads=2)
    np.testing.assert_array_equal(out["u64"], TENSORS["u64"])
    assert all(a.flags.writeable for a in out.values())


def test_read_into_many_in_threads(path):
    with ztensor.Reader(path) as r:
        dst = {n: np.empty_like(np.asarray(TENSORS[n]).astype(TENSORS[n].dtype.newbyteorder("=")))
               for n in ("f32", "big", "i8")}
        dst["zstd"] = np.empty(5000, np.float32)
        r.read_into(dst, threads=2)
    np.testing.assert_array_equal(dst["big"], TENSORS["big"])
    np.testing.assert_array_equal(dst["zstd"], np.arange(5000, dtype=np.float32))


def test_plain_views_agree_with_view_plan(path):
    with ztensor.Reader(path) as r:
        specs = r.internals.specs
        if not isinstance(specs, manifest_table.TableSpecs):
            pytest.skip("the numpy fallback reads manifests the general way")
        rows = np.arange(len(specs))
        storage, offsets, lengths, shapes, mask = specs.plain_views(rows)
        chosen = iter(zip(storage, offsets.tolist(), lengths.tolist(), shapes))
        for name, ok in zip(r.keys(), mask.tolist()):
            plan = dense.view_plan(r.metadata(name))
            assert bool(plan) == ok, name
            if ok:
                dt, off, ln, shape = next(chosen)
                assert (dt, ln // dt.itemsize, off) == plan and shape == r.metadata(name).shape
            # the reader's per-name shortcut (read_numpy without building a spec)
            view = specs.view_of(name)
            assert view == ((*plan, r.metadata(name).shape) if plan else None), name


def _evict(path):
    """Drop a file's pages from the page cache (clean pages, no other mapping)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is POSIX-only")
@pytest.mark.parametrize("cached", [True, False])
def test_large_objects_from_a_cached_or_an_evicted_file(tmp_path, cached):
    """Source.reading copies a piece from the mapping when its pages are cached and
    preads it when not: both give the file's bytes (pieces of 16 MiB: one object
    spans several, and a piece may be cached while its neighbour is not)."""
    rng = np.random.default_rng(3)
    arrays = {f"t{i}": rng.integers(0, 1 << 30, (5 << 20) + i, dtype=np.int32) for i in range(3)}
    path = str(tmp_path / "large.zt")
    with ztensor.Writer(path) as w:
        for name, arr in arrays.items():
            w.write_numpy(name, arr)
    with ztensor.Reader(path) as r:
        if not cached:
            _evict(path)
            view = r.read_numpy("t1")  # a zero-copy view, not touched
            assert kernels.range_resident(view.view(np.uint8)) in (False, None)
            del view
        else:
            r.read_numpy(list(arrays), copy=True)  # warm
        out = r.read_numpy(list(arrays), copy=True, threads=2)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(out[name], arr)


def test_range_resident_answers():
    """kernels.range_resident: True for memory just written, and for an empty range;
    the numpy fallback says it cannot tell (None) for anything else."""
    touched = np.ones(1 << 20, np.uint8)
    expected = True if ztensor.backend == "c" and os.name == "posix" else None
    assert kernels.range_resident(touched[1:]) is expected
    assert kernels.range_resident(touched[:0]) is True
    assert kernels.range_resident(b"") is True

