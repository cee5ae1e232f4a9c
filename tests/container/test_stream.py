"""Writer.stream: a dense tensor written chunk by chunk reads back exactly; a stream
that overruns is refused chunk by chunk, one that closes short abandons the file."""
import os
import tracemalloc

import numpy as np
import pytest

import ztensor

RNG = np.random.default_rng(5)


def read_back(path, name, **kw):
    with ztensor.Reader(str(path), verify=True) as r:
        return r.read_numpy(name, copy=True), r.metadata(name)


@pytest.mark.parametrize("compress,checksum", [(False, None), (True, "crc32c"), (3, "sha256")])
def test_chunks_of_any_size_read_back(tmp_path, compress, checksum):
    data = RNG.standard_normal((300, 17)).astype(np.float32)
    path = tmp_path / "s.zt"
    flat = data.reshape(-1)
    stored = flat.astype("<f4")  # bytes chunks are the stored (little-endian) bytes
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("before", np.arange(3))
        with w.stream("x", data.shape, np.float32, compress=compress, checksum=checksum,
                      attributes={"source": "stream"}) as s:
            s.write(flat[:1000])                        # an array chunk (native order)
            s.write(stored[1000:1001].tobytes()[:3])    # bytes splitting an element
            s.write(stored[1000:2000].tobytes()[3:])
            s.write(flat[2000:].reshape(-1, 2) if (len(flat) - 2000) % 2 == 0 else flat[2000:])
        w.write_numpy("after", np.ones(2))
    out, meta = read_back(path, "x")
    np.testing.assert_array_equal(out, data)
    assert meta.attributes == {"source": "stream"}
    assert meta.components["data"].encoding == ("zstd" if compress else "raw")
    assert (meta.components["data"].digest is not None) == bool(checksum)
    with ztensor.Reader(str(path)) as r:
        assert sorted(r.keys()) == ["after", "before", "x"]


def test_same_bytes_as_one_write(tmp_path):
    data = RNG.integers(-9, 9, (64, 33)).astype(">i2")  # big-endian input: stored little
    a, b = tmp_path / "a.zt", tmp_path / "b.zt"
    with ztensor.Writer(str(a)) as w:
        w.write_numpy("t", data, compress=True, checksum="sha256")
    with ztensor.Writer(str(b)) as w:
        with w.stream("t", data.shape, data.dtype, compress=True, checksum="sha256") as s:
            for row in data:
                s.write(row)
    assert a.read_bytes() == b.read_bytes()


def test_overrun_is_refused_and_the_stream_goes_on(tmp_path):
    path = tmp_path / "o.zt"
    with ztensor.Writer(str(path)) as w:
        with w.stream("x", (4,), np.int32) as s:
            s.write(np.arange(3, dtype=np.int32))
            with pytest.raises(ztensor.FormatError, match="overrun"):
                s.write(np.arange(2, dtype=np.int32))
            with pytest.raises(ztensor.FormatError, match="dtype"):
                s.write(np.arange(1, dtype=np.int64))
            s.write(np.array([7], np.int32))
    np.testing.assert_array_equal(read_back(path, "x")[0], [0, 1, 2, 7])


def test_closing_short_abandons_the_file(tmp_path):
    path = tmp_path / "short.zt"
    path.write_bytes(b"old")
    os.chmod(path, 0o640)
    w = ztensor.Writer(str(path))
    s = w.stream("x", (10,), np.float64)
    s.write(np.zeros(4))
    with pytest.raises(ztensor.FormatError, match="4 of 10|32 of 80"):
        s.close()
    with pytest.raises(ztensor.ClosedError):
        w.close()
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["short.zt"]


def test_an_error_inside_the_with_block_abandons_the_file(tmp_path):
    path = tmp_path / "e.zt"
    with pytest.raises(RuntimeError):
        with ztensor.Writer(str(path)) as w:
            with w.stream("x", (10,), np.float64) as s:
                s.write(np.zeros(4))
                raise RuntimeError("source failed")
    assert not path.exists() and not list(tmp_path.iterdir())


def test_the_writer_takes_nothing_else_while_streaming(tmp_path):
    with ztensor.Writer(str(tmp_path / "b.zt")) as w:
        s = w.stream("x", (2,), np.uint8)
        with pytest.raises(ztensor.ClosedError, match="streaming"):
            w.write_numpy("y", np.zeros(1))
        s.write(b"\x01\x02")
        s.close()
        w.write_numpy("y", np.zeros(1))
    with pytest.raises(ztensor.FormatError):  # what the reader would refuse is refused first
        with ztensor.Writer(str(tmp_path / "c.zt")) as w:
            w.stream("x", (-1, 2), np.uint8)
    with pytest.raises(ztensor.UnsupportedError):
        with ztensor.Writer(str(tmp_path / "d.zt")) as w:
            w.stream("x", (2,), np.dtype("U3"))


def test_memory_stays_at_one_chunk(tmp_path):
    # compressible values (zstd frames are independent, so a repeated random chunk
    # would not shrink): the crc32c over the stored bytes stays small, which matters
    # for the bytewise numpy-fallback crc under emulation
    chunk = (np.arange(1 << 17) % 251).astype(np.float64)  # 1 MiB
    tracemalloc.start()
    with ztensor.Writer(str(tmp_path / "m.zt")) as w:
        with w.stream("big", (64 << 17,), np.float64, compress=True, checksum="crc32c") as s:
            for _ in range(64):  # 64 MiB in all
                s.write(chunk)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_torch_chunks(tmp_path):
    torch = pytest.importorskip("torch")
    data = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    path = tmp_path / "t.zt"
    with ztensor.Writer(str(path)) as w:
        with w.stream("t", (3, 4), np.float32) as s:
            for row in data:
                s.write(row)  # torch tensors as chunks
    with ztensor.Reader(str(path)) as r:
        assert r.read_numpy("t").tolist() == data.tolist()
