"""Session 14: "work and memory follow the bytes present and what the caller asked
for" (docs/threat-model.md, Bounded), for parts of other formats' tensors.  Each
test says what broke and names the one function that keeps its rule.  Work is
counted (decodes, HDF5 reads), never timed."""

import numpy as np
import pytest

import ztensor
from ztensor.foreign import zip_members
from ztensor.safe import safe_open


@pytest.fixture
def decodes(monkeypatch):
    """The whole-member decodes of every ``.npz`` read (a header read is partial)."""
    count = []
    read = zip_members.ZipArchive.read

    def counting(self, name, obj=None, limit=None):
        if limit is None and self.members[name].compressed:
            count.append(name)
        return read(self, name, obj, limit)

    monkeypatch.setattr(zip_members.ZipArchive, "read", counting)
    return count


@pytest.fixture
def deflated(tmp_path):
    path = tmp_path / "c.npz"
    np.savez_compressed(path, a=np.arange(1000, dtype=np.float32).reshape(100, 10))
    return path


def test_slices_of_a_deflated_npz_member_decode_it_once_per_handle(deflated, decodes):
    """Every ``get_slice(name)[i:i+1]`` of an ``np.savez_compressed`` member decoded
    the whole member again (1.3 s a one-element slice of a 256 MiB member): work was
    slices times the tensor.  Kept by ``safe._Slice._foreign_selected`` (the member's
    entry says ``whole``: made once per handle and kept, as a zstd component)."""
    want = np.arange(1000, dtype=np.float32).reshape(100, 10)
    with safe_open(deflated, framework="np") as f:
        piece = f.get_slice("a")
        for i in range(0, 100, 7):
            np.testing.assert_array_equal(piece[i : i + 1], want[i : i + 1])
        np.testing.assert_array_equal(piece[3, 2:5], want[3, 2:5])
        np.testing.assert_array_equal(f.get_slice("a")[[]], want[[]])
    assert decodes == ["a.npy"]
    with safe_open(deflated, framework="np") as f:  # a new handle decodes anew
        f.get_slice("a")[0]
    assert decodes == ["a.npy", "a.npy"]


def test_dask_reads_a_deflated_npz_member_once_per_compute(deflated, decodes):
    """``from_zt`` on a deflated ``.npz`` member made chunk after chunk, each
    decoding the whole member (103 s for a sum a single read does in 1.2 s).  A
    member that cannot be read from its middle is read once, whole, and split into
    the chunks asked (``rows=3`` gave one chunk, silently), each writable as every
    other format's chunks are (map_blocks writing in place failed on the decoded
    bytes).  Kept by ``ztensor.dask._plan`` (from ``dask._row_block``) and
    ``dask._entire``."""
    pytest.importorskip("dask")
    import dask

    import ztensor.dask as zd

    want = np.arange(1000, dtype=np.float32).reshape(100, 10)
    for kwargs, blocks in (({"chunk_bytes": 400}, 10), ({"rows": 3}, 34), ({}, 1)):
        arr = zd.from_zt(deflated, "a", **kwargs)
        assert arr.numblocks == (blocks, 1)
        with dask.config.set(scheduler="synchronous"):
            np.testing.assert_array_equal(arr.compute(), want)
            doubled = arr.map_blocks(lambda b: b.__imul__(2)).compute()
        np.testing.assert_array_equal(doubled, 2 * want)
    assert decodes == ["a.npy"] * 6  # one decode per compute, none at graph time


def test_a_stored_npz_member_still_chunks_by_rows(tmp_path, decodes):
    """Only a member that must be decoded whole is one chunk: a stored one is a view
    of the file, chunked as asked (``ztensor.dask._row_block``)."""
    pytest.importorskip("dask")
    import ztensor.dask as zd

    path = tmp_path / "s.npz"
    np.savez(path, a=np.arange(100, dtype=np.float32))
    arr = zd.from_zt(path, "a", rows=10)
    assert arr.numblocks == (10,)
    np.testing.assert_array_equal(arr.compute(scheduler="synchronous"), np.arange(100))
    assert decodes == []


@pytest.fixture
def reads(monkeypatch):
    """What each HDF5 read asked h5py for: ``()`` is the whole dataset."""
    h5py = pytest.importorskip("h5py")
    asked = []
    getitem = h5py.Dataset.__getitem__

    def counting(self, args, new_dtype=None):
        asked.append(args)
        return getitem(self, args, new_dtype)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", counting)
    return asked


@pytest.fixture
def chunked_h5(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        data = np.arange(10_000, dtype=np.float32).reshape(1000, 10)
        f.create_dataset("gz", data=data, chunks=(100, 10), compression="gzip")
        f.create_dataset("flat", data=data)  # contiguous: no chunks
        f.create_dataset("flags", data=np.arange(50) % 3 == 0, chunks=(10,))
    return path


def test_a_slice_of_an_hdf5_dataset_reads_only_its_rows(chunked_h5, reads):
    """``get_slice(name)[i:i+1]`` of a chunked, gzip HDF5 dataset read the whole
    dataset (every chunk decoded) for every slice.  HDF5 reads a hyperslab from
    only the chunks holding it.  Kept by ``hdf5_file._entry`` (``read_rows``), used
    by ``safe._Slice._foreign_selected``."""
    data = np.arange(10_000, dtype=np.float32).reshape(1000, 10)
    with safe_open(chunked_h5, framework="np") as f:
        for name in ("gz", "flat"):
            piece = f.get_slice(name)
            np.testing.assert_array_equal(piece[5:6], data[5:6])
            np.testing.assert_array_equal(piece[-1, 3:], data[-1, 3:])
            np.testing.assert_array_equal(piece[200:450:7, 2], data[200:450:7, 2])
        np.testing.assert_array_equal(f.get_slice("flags")[3:9], (np.arange(50) % 3 == 0)[3:9])
        assert f.get_slice("flags")[3:9].dtype == np.bool_
    assert () not in reads
    assert {(s.start, s.stop) for s in reads} == {(5, 6), (999, 1000), (200, 446), (3, 9)}


def test_hdf5_slices_in_torch_read_only_their_rows(chunked_h5, reads):
    """The same for ``framework="pt"`` (its row span goes through the numpy path):
    ``hdf5_file._entry``."""
    torch = pytest.importorskip("torch")
    with safe_open(chunked_h5, framework="pt") as f:
        got = f.get_slice("gz")[10:12]
    assert torch.equal(got, torch.arange(100, 120, dtype=torch.float32).reshape(2, 10))
    assert reads == [slice(10, 12)]


def test_dask_chunks_of_an_hdf5_dataset_are_whole_hdf5_chunks(chunked_h5, reads):
    """dask chunks of any row count cut HDF5 chunks, each decoded by every dask
    chunk it meets (71 s for a sum of a 2**20-element-chunk gzip dataset in 4 MiB
    dask chunks).  Each chunk now reads only its rows, in whole HDF5 chunks, so
    each HDF5 chunk is decoded once.  Kept by ``ztensor.dask._plan`` (the block from
    ``dask._row_block``, the entry's ``row_block``)."""
    pytest.importorskip("dask")
    import ztensor.dask as zd

    data = np.arange(10_000, dtype=np.float32).reshape(1000, 10)
    for kwargs, size in (({"chunk_bytes": 40}, 100), ({"rows": 150}, 200), ({}, 1000)):
        reads.clear()
        arr = zd.from_zt(chunked_h5, "gz", **kwargs)
        assert set(arr.chunks[0][:-1]) <= {size}
        np.testing.assert_array_equal(arr.compute(scheduler="synchronous"), data)
        spans = sorted((s.start, s.stop) for s in reads)
        assert spans == [(a, min(a + size, 1000)) for a in range(0, 1000, size)]


def test_an_hdf5_chunk_far_larger_than_its_dataset_is_refused(tmp_path):
    """A 1 MB file whose 10-element gzip dataset has one 1 GiB chunk (maxshape
    None) made ``read_numpy`` use 1.1 GB and seconds to return 40 bytes: the
    chunk-to-storage ratio (32,768) let it through.  A chunk may hold at most the
    dataset's bytes or 64 MiB, whichever is more, when compressed; it is refused
    when that dataset is read, and the file's other datasets stay readable (a
    refusal at open made a file with one such log dataset unreadable), and an
    uncompressed chunk, read in place, is not refused.  Kept by
    ``hdf5_file._chunk_problem``."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "bigchunk_gz.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset(
            "x", shape=(10,), maxshape=(None,), chunks=(2**28,), dtype="i4", compression="gzip"
        )
        d[:] = np.arange(10)
        f.create_dataset("ok", data=np.ones((100, 8), np.float32))
        raw = f.create_dataset("log", shape=(0, 4096), maxshape=(None, 4096),
                               chunks=(8192, 4096), dtype=np.float32)  # 128 MiB, unfiltered
        raw.resize((10, 4096))
        raw[:] = 2
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.LimitError, match="one compressed chunk") as exc:
            r.read_numpy("x")
        assert exc.value.obj == "x" and str(path) in str(exc.value)
        assert r["ok"].shape == (100, 8)
        assert r["log"].shape == (10, 4096) and float(r["log"][9, 4095]) == 2.0


def test_hdf5_chunks_up_to_the_bound_still_read(tmp_path):
    """What the bound lets through (``hdf5_file._spec``): a chunk larger than its
    small resizable dataset up to 64 MiB (room to grow), and one chunk holding
    the whole dataset."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "ok.h5"
    with h5py.File(path, "w") as f:
        d = f.create_dataset("grow", shape=(10,), maxshape=(None,), chunks=(1 << 20,), dtype="i4")
        d[:] = np.arange(10)
        f.create_dataset("whole", data=np.arange(1000.0), chunks=(1000,), compression="gzip")
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("grow"), np.arange(10))
        np.testing.assert_array_equal(r.read_numpy("whole"), np.arange(1000.0))


def test_slicing_every_deflated_member_in_turn_keeps_one(tmp_path):
    """safe_open kept every deflated .npz member it had sliced: a loader slicing
    each tensor in turn (tensor parallel) held the whole file decoded (264 MiB
    against 53).  One member is kept, until another is sliced
    (``safe._Slice._foreign_selected``)."""
    path = tmp_path / "c.npz"
    np.savez_compressed(path, **{f"t{i}": np.full((50, 40), i, np.int32) for i in range(5)})
    with ztensor.safe_open(str(path), framework="np") as f:
        for i in range(5):
            assert f.get_slice(f"t{i}")[:, 0:3].tolist() == [[i] * 3] * 50
            kept = f._decoded  # noqa: SLF001 - the cache this test is about
            assert list(kept) == [f"t{i}"]


def test_onnx_external_data_that_is_not_utf8_is_refused(tmp_path):
    """The CI's fuzz run (foreign_structured) made an ONNX external-data location
    that is not UTF-8: protobuf hands such a proto2 string out as bytes, and
    ``location.replace`` raised a bare TypeError.  A FormatError naming the tensor
    (``onnx_file._ExternalData.place``)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    t = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    entry = t.external_data.add()
    entry.key, entry.value = "location", "QQQQ.bin"
    graph = helper.make_graph([], "g", [], [], initializer=[t])
    raw = helper.make_model(graph).SerializeToString()
    assert raw.count(b"QQQQ") == 1
    path = tmp_path / "m.onnx"
    path.write_bytes(raw.replace(b"QQQQ", b"\xff\xfe\xfd\xfc"))
    with pytest.raises(ztensor.ZTensorError) as err:
        with ztensor.Reader(str(path)) as r:
            r.read_numpy("w")
    assert not isinstance(err.value, TypeError) and "m.onnx" in str(err.value)
