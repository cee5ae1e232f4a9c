"""Session 21: what helper 19 found (bytes read under many names, copies made at
open, an empty shape numpy cannot make, NUL in GGUF names).  Each test names the one
function that keeps its rule."""
import collections
import hashlib
import io
import os
import pickle
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest
from v2files import build

import ztensor
from ztensor import spec


# ------------------------------------------------------------------ hand-made torch.save
def _torch_zip(path, views, storage_bytes, *, order="little", deflate=False, storage=None,
               itemsize=1):
    """A torch.save zip of one storage (``storage_bytes``, member ``data/0``, of the
    class ``storage`` of ``itemsize``-byte elements: torch.UntypedStorage by default)
    and ``views``: name ->
    (rebuild function, its arguments after the storage).  Laid out as torch.save lays
    it out; ``deflate`` compresses the storage member."""
    torch = pytest.importorskip("torch")
    storage = storage or torch.UntypedStorage
    numel = len(storage_bytes) // itemsize
    ref = object()

    class View:
        def __init__(self, fn, args):
            self.fn, self.args = fn, args

        def __reduce__(self):
            return (self.fn, (ref, *self.args))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if obj is ref:
                return ("storage", storage, "0", "cpu", numel)
            return None

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump({k: View(*v) for k, v in views.items()})
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", order)
        method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
        z.writestr("archive/data/0", storage_bytes, compress_type=method)
        z.writestr("archive/version", "3\n")
    return path


def test_a_deflated_storage_lifts_the_visits_budget_no_more_than_its_file_bytes(tmp_path):
    """Rule: spec.check_visits (through pytorch._check_visits) counts the decoded
    storage once and holds the rest to the bytes its member takes in the file: two
    overlapping (2**14, 2**14) views with strides (1, 1) of a deflated 16 MiB storage
    of zeros (a 17 KB file) read 512 MiB, 64x the decoded bytes, and passed the budget
    that counted decoded bytes."""
    torch = pytest.importorskip("torch")
    n = 16 << 20
    geometry = ((2**14, 2**14), (1, 1), False, collections.OrderedDict())
    views = {f"v{i}": (torch._utils._rebuild_tensor_v2, (i, *geometry)) for i in range(2)}
    path = _torch_zip(tmp_path / "deflated.pt", views, bytes(n), deflate=True)
    assert os.path.getsize(path) < 64 << 10
    with pytest.raises(ztensor.LimitError, match="read 536870912 bytes") as err:
        ztensor.Reader(str(path))
    assert str(path) in str(err.value)
    # stored, the same two views of the same 16 MiB are within the budget: the file
    # holds the bytes they read again (16 MiB + 64 x 16 MiB + 64 MiB)
    stored = _torch_zip(tmp_path / "stored.pt", views, bytes(n), deflate=False)
    with ztensor.Reader(str(stored)) as r:
        assert r.read_numpy("v1").shape == (2**14, 2**14)
        assert int(r.read_numpy("v1")[0, :4].sum()) == 0


def test_visits_budget_edges():
    """spec.check_visits: the decoded bytes once, 64 times the file's bytes, and
    64 MiB; one byte more is refused, naming the input."""
    limits = ztensor.DEFAULT_LIMITS
    allowed = 1000 + limits.max_reads_per_file_byte * 10 + spec.VISITS_ALLOWED
    spec.check_visits("f.bin", allowed, 1000, 10, limits)
    with pytest.raises(ztensor.LimitError, match="f.bin"):
        spec.check_visits("f.bin", allowed + 1, 1000, 10, limits)


_DTYPES = ("float64", "float32", "float16", "bfloat16", "int8", "int16", "int32", "int64",
           "uint8", "complex64", "complex128")


@pytest.mark.parametrize("order", ["big", "little"])
def test_views_of_one_storage_under_many_dtypes_copy_nothing_at_open(tmp_path, order):
    """Rule: pytorch._entry swaps (big-endian) and resolves (lazy neg/conj bits) a
    tensor's own elements when it is loaded, never a whole storage per dtype at open:
    23 one-element views of a 128 MiB storage under every dtype and bit held 3.5 GB
    before a tensor was read.  The values are torch.load's."""
    torch = pytest.importorskip("torch")
    n = 8 << 20
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    views = {}
    for i, name in enumerate(_DTYPES):
        dt = getattr(torch, name)
        for tag, meta in (("p", None), ("n", {"neg": True})):
            views[f"{tag}{i}"] = (torch._utils._rebuild_tensor_v3,
                                  (i * 16, (4,), (1,), False, collections.OrderedDict(), dt, meta))
    for i, name in enumerate(("complex64", "complex128")):
        dt = getattr(torch, name)
        views[f"c{i}"] = (torch._utils._rebuild_tensor_v3,
                          (8, (3,), (1,), False, collections.OrderedDict(), dt, {"conj": True}))
    path = _torch_zip(tmp_path / f"{order}.pt", views, raw, order=order)
    tracemalloc.start()
    try:
        reader = ztensor.Reader(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * n, peak  # the storage, not a copy per dtype and bits
    want = torch.load(str(path), weights_only=True)
    reader_values = {}
    with reader:
        for key, t in want.items():
            t = t.resolve_neg().resolve_conj()
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            got = reader_values[key] = reader.read_numpy(key)
            expect = t.numpy()
            assert got.shape == expect.shape, key
            assert got.tobytes() == expect.astype(expect.dtype.newbyteorder("<")).tobytes(), key
    # a part swaps and resolves its own rows only (the entry's read_rows), with the
    # same values
    with ztensor.safe_open(str(path), framework="np") as f:
        for key in ("n1", "c0", "n9"):
            part = f.get_slice(key)[1:3]
            assert part.tobytes() == reader_values[key][1:3].tobytes(), key


def test_a_big_endian_view_of_a_storage_of_another_width_is_refused(tmp_path):
    """pytorch._entry: torch.load swaps a big-endian storage as its reference's
    elements and then views them as the tensor's type; torch.save never writes such a
    view (it refuses one storage under two types), and a swap of 4-byte elements read
    as 8-byte ones is no value torch gives.  A view of the storage's own type reads as
    torch.load gives it."""
    torch = pytest.importorskip("torch")
    raw = np.arange(8, dtype=">f4").tobytes()
    args = ((0, (2,), (1,), False, collections.OrderedDict()))
    wide = {"w": (torch._utils._rebuild_tensor_v3, (*args, torch.float64, None))}
    path = _torch_zip(tmp_path / "wide.pt", wide, raw, order="big", storage=torch.FloatStorage,
                      itemsize=4)
    with pytest.raises(ztensor.FormatError, match="views a storage of"):
        ztensor.Reader(str(path))
    own = {"f": (torch._utils._rebuild_tensor_v3, (*args, torch.float32, {"neg": True}))}
    path = _torch_zip(tmp_path / "own.pt", own, raw, order="big", storage=torch.FloatStorage,
                      itemsize=4)
    with ztensor.Reader(str(path)) as r:
        assert r.read_numpy("f").tolist() == [-0.0, -1.0]
    assert torch.load(str(path), weights_only=True)["f"].tolist() == [-0.0, -1.0]


def test_an_empty_torch_tensor_of_a_shape_numpy_cannot_make_is_a_format_error(tmp_path):
    """Rule: pytorch._Load.rebuild holds every shape to objects.shape_problem, as the
    other readers do: a (0, 2**61) float64 tensor (no element, so past the size
    checks) reached np.zeros and its bare ValueError."""
    torch = pytest.importorskip("torch")
    views = {"e": (torch._utils._rebuild_tensor_v2,
                   (0, (0, 2**61), (1, 1), False, collections.OrderedDict())),
             "ok": (torch._utils._rebuild_tensor_v2,
                    (0, (2,), (1,), False, collections.OrderedDict()))}
    # a float64 storage: a v2 rebuild's dtype is its storage's
    path = _torch_zip(tmp_path / "empty.pt", views, bytes(16), storage=torch.DoubleStorage,
                      itemsize=8)
    with pytest.raises(ztensor.FormatError, match=r"2\*\*63") as err:
        ztensor.Reader(str(path))
    assert str(path) in str(err.value)
    run = subprocess.run([sys.executable, "-m", "ztensor", "ls", str(path)],
                         capture_output=True, text=True)
    assert run.returncode != 0 and len(run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr and "ValueError" not in run.stderr


# ------------------------------------------------------------------ v2 blobs, HDF5 links
def _v2_shared(count, blob):
    part = {"dtype": "u8", "blob": [4096, len(blob)],
            "digest": "sha256:" + hashlib.sha256(blob).hexdigest()}
    obj = {"shape": [len(blob)], "layout": "dense", "parts": {"data": part}}
    return build({f"t{i}": obj for i in range(count)}, [(4096, blob)])


def test_v2_objects_that_share_one_blob_are_held_to_the_bytes_present(tmp_path):
    """Rule: spec.check_visits (through v2's _Schema.check_visits): identical blob
    references are legal (tied weights), but 2,000 objects over one 16 MiB blob made
    ``verify`` hash 32 GiB and ``stats`` run for minutes.  Two names of one blob read
    as two equal arrays."""
    blob = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    many = tmp_path / "many.zt"
    many.write_bytes(_v2_shared(200, blob))  # 200 MiB read from 1 MiB: past 1 + 64 + 64 MiB
    with pytest.raises(ztensor.LimitError, match="read 209715200 bytes"):
        ztensor.Reader(str(many))
    run = subprocess.run([sys.executable, "-m", "ztensor", "verify", str(many)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    tied = tmp_path / "tied.zt"
    tied.write_bytes(_v2_shared(2, blob))
    with ztensor.Reader(str(tied)) as r:
        assert r.read_numpy("t0").tobytes() == blob == r.read_numpy("t1").tobytes()


def test_hdf5_hard_links_to_one_dataset_are_held_to_the_bytes_present(tmp_path):
    """Rule: spec.check_visits (through hdf5_file._entries): every hard link to a
    dataset is a tensor (tied weights keep both names), but 2,000 links to one 16 MiB
    dataset made ``stats`` read 32 GiB."""
    h5py = pytest.importorskip("h5py")
    data = np.arange(1 << 18, dtype="<f4")  # 1 MiB
    many = tmp_path / "many.h5"
    with h5py.File(many, "w") as f:
        d = f.create_dataset("a", data=data)
        for i in range(200):
            f[f"l{i}"] = d
    with pytest.raises(ztensor.LimitError, match="names that read the same bytes") as err:
        ztensor.Reader(str(many))
    assert str(many) in str(err.value)
    tied = tmp_path / "tied.h5"
    with h5py.File(tied, "w") as f:
        f["b"] = f.create_dataset("a", data=data)
    with ztensor.Reader(str(tied)) as r:
        assert sorted(r.keys()) == ["a", "b"]
        assert np.array_equal(r.read_numpy("b"), data)


# ------------------------------------------------------------------ GGUF export names
@pytest.mark.parametrize("where", ["tensor", "key"])
def test_a_gguf_export_refuses_a_nul_in_a_name_or_key_before_writing(tmp_path, where):
    """Rule: foreign/export._gguf_no_nul: llama.cpp reads GGUF tensor names and keys
    as C strings, so ``a\\0b`` and ``a\\0c`` would both be ``a`` there (gguf-py keeps
    them whole): refused, and no output file is left."""
    pytest.importorskip("gguf")
    src = tmp_path / "in.zt"
    attributes = {"gguf.my\0key": 3} if where == "key" else None
    with ztensor.Writer(str(src), attributes=attributes) as w:
        if where == "tensor":
            w.write_numpy("a\0b", np.arange(4, dtype=np.float32))
            w.write_numpy("a\0c", np.arange(4, dtype=np.float32))
        else:
            w.write_numpy("a", np.arange(4, dtype=np.float32))
    out = tmp_path / "out.gguf"
    run = subprocess.run([sys.executable, "-m", "ztensor", "convert", str(src), str(out)],
                         capture_output=True, text=True)
    assert run.returncode != 0, run.stdout
    assert "NUL" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


# ------------------------------------------------------------------ helper 20's probe
def test_a_v2_part_in_another_file_lifts_no_budget(tmp_path):
    """v2._Schema.check_visits counts this file's parts only: a part of a shard this
    reader never opens, declaring 2**40 bytes, lifted the budget for 2,000 objects
    over one real blob (``verify`` hashed 32 GiB of a 17 MB file)."""
    blob = np.random.default_rng(2).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    part = {"dtype": "u8", "blob": [4096, len(blob)],
            "digest": "sha256:" + hashlib.sha256(blob).hexdigest()}
    objects = {f"t{i}": {"shape": [len(blob)], "layout": "dense", "parts": {"data": part}}
               for i in range(200)}
    far = 1 << 40
    objects["elsewhere"] = {"shape": [far], "layout": "dense",
                            "parts": {"data": {"dtype": "u8", "blob": [4096, far], "shard": "s"}}}
    path = tmp_path / "v2shard.zt"
    path.write_bytes(build(objects, [(4096, blob)],
                           shards={"s": {"size": far + 8192, "digest": "sha256:" + "0" * 64}}))
    with pytest.raises(ztensor.LimitError, match="read 209715200 bytes"):
        ztensor.Reader(str(path))


def _negated_expand(tmp_path, order):
    """A (2**20, 2**14) float32 expand (stride 0 on its rows) of a 64 KiB storage,
    saved with torch's lazy neg bit: 64 GiB of elements, a 66 KB file."""
    torch = pytest.importorskip("torch")
    data = np.arange(1 << 14, dtype=">f4" if order == "big" else "<f4").tobytes()
    views = {"n": (torch._utils._rebuild_tensor_v3,
                   (0, (1 << 20, 1 << 14), (0, 1), False, collections.OrderedDict(),
                    torch.float32, {"neg": True}))}
    return _torch_zip(tmp_path / f"neg-{order}.pt", views, data, order=order,
                      storage=torch.FloatStorage, itemsize=4)


@pytest.mark.parametrize("order", ["little", "big"])
def test_a_part_of_a_resolved_expand_costs_the_part(tmp_path, order):
    """pytorch._entry's read_rows: a dask chunk or a safe_open slice of a swapped or
    resolved tensor swaps and resolves its own rows, each distinct element once.
    Read whole (a broadcast view), dask's chunk copied all 64 GiB: a bare
    MemoryError naming no file."""
    pytest.importorskip("dask")
    import ztensor.dask as zd

    path = _negated_expand(tmp_path, order)
    want = -np.arange(3, dtype=np.float32)
    tracemalloc.start()
    try:
        got = zd.from_zt(str(path), "n")[3:5, :3].compute()
        with ztensor.safe_open(str(path), framework="np") as f:
            part = f.get_slice("n")[7:8, :2]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got.tolist() == [want.tolist()] * 2
    assert part.tolist() == [want[:2].tolist()]
    assert peak < 256 << 20, peak


def test_a_storage_reference_must_name_a_storage_class(tmp_path):
    """pytorch._Load.storage: torch.save names a storage class in every storage
    reference (UntypedStorage for the newer dtypes); a dtype global there, which
    torch.load fails on, is a FormatError."""
    torch = pytest.importorskip("torch")
    views = {"x": (torch._utils._rebuild_tensor_v3,
                   (0, (2,), (1,), False, collections.OrderedDict(), torch.float32, None))}
    path = _torch_zip(tmp_path / "dtype.pt", views, bytes(8), storage=torch.float32,
                      itemsize=4)
    with pytest.raises(ztensor.FormatError, match="not a storage"):
        ztensor.Reader(str(path))


def test_a_trusted_state_dict_naming_one_block_a_hundred_times_reads_with_the_limit_raised(
        tmp_path):
    """Limits.max_reads_per_file_byte (spec.check_visits): torch.save of
    ``ModuleList([block] * 100)`` names one 4 MiB weight 100 times.  Refused by
    default, naming the file and the limit that lifts it; read, every name equal to
    torch.load's, with the limit raised."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    block = torch.nn.Linear(1024, 1024)
    path = tmp_path / "tied.pt"
    torch.save(torch.nn.ModuleList([block] * 100).state_dict(), path)
    with pytest.raises(ztensor.LimitError, match="tied.pt.*max_reads_per_file_byte"):
        ztensor.Reader(str(path))
    expected = torch.load(path, weights_only=True)
    limits = ztensor.Limits(max_reads_per_file_byte=200)
    with ztensor.Reader(str(path), limits=limits) as r:
        assert sorted(r.keys()) == sorted(expected)
        for name in ("0.weight", "57.bias", "99.weight"):
            np.testing.assert_array_equal(r.read_numpy(name), expected[name].numpy())


def test_the_reads_per_file_byte_limit_is_the_one_every_format_uses(tmp_path):
    """spec.check_visits takes its multiple from the Limits it is given: v2 objects
    over one blob, refused at the default, read with it raised."""
    blob = np.arange(1 << 22, dtype="<u4").astype("<u1").tobytes()  # 4 MiB
    path = tmp_path / "shared.zt"
    path.write_bytes(_v2_shared(100, blob))
    with pytest.raises(ztensor.LimitError, match="max_reads_per_file_byte"):
        ztensor.Reader(str(path))
    with ztensor.Reader(str(path), limits=ztensor.Limits(max_reads_per_file_byte=100)) as r:
        np.testing.assert_array_equal(r.read_numpy("t99"), np.frombuffer(blob, np.uint8))
    lower = ztensor.Limits(max_reads_per_file_byte=0)
    spec.check_visits("f.bin", 1000 + spec.VISITS_ALLOWED, 1000, 10, lower)
    with pytest.raises(ztensor.LimitError, match="f.bin"):
        spec.check_visits("f.bin", 1001 + spec.VISITS_ALLOWED, 1000, 10, lower)
