"""Seekable zstd (ztensor/io/seekable.py): compressed components are independent frames
with a seek table in a skippable frame.  Every zstd decoder reads the stream whole;
slices decode only the frames they touch; hostile tables are refused."""
import struct

import numpy as np
import pytest
import zstandard

import ztensor
from conftest import DATA
from ztensor.io import seekable
from ztensor.errors import FormatError

RNG = np.random.default_rng(12)


def rows_tensor(rows=400, cols=2048):
    """[rows, cols] f16 with a little structure so it compresses: 4 KiB per row,
    1.6 MiB in all: two frames."""
    base = RNG.standard_normal(cols).astype(np.float16)
    return (base[None, :] + np.arange(rows, dtype=np.float16)[:, None]).astype(np.float16)


@pytest.fixture
def small_frames(monkeypatch):
    monkeypatch.setattr(seekable, "FRAME_BYTES", 64 << 10)  # 16 rows of 4 KiB per frame


def write(path, **tensors):
    with ztensor.Writer(path) as w:
        for name, arr in tensors.items():
            w.write_numpy(name, arr, compress=True)


def stored_bytes(path, name):
    with ztensor.Reader(path) as r:
        comp = r.metadata(name).components["data"]
    with open(path, "rb") as f:
        f.seek(comp.offset)
        return f.read(comp.length), comp


def test_the_stream_is_frames_and_a_seek_table(tmp_path, small_frames):
    arr = rows_tensor()
    write(tmp_path / "a.zt", a=arr)
    data, comp = stored_bytes(tmp_path / "a.zt", "a")
    # the footer and the skippable frame, as zstd's seekable format lays them out
    count, descriptor, magic = struct.unpack("<IBI", data[-9:])
    assert magic == 0x8F92EAB1 and descriptor == 0 and count == -(-arr.nbytes // (64 << 10))
    table_start = len(data) - 8 - (count * 8 + 9)
    assert struct.unpack_from("<II", data, table_start) == (0x184D2A5E, count * 8 + 9)
    sizes = [struct.unpack_from("<II", data, table_start + 8 + 8 * i) for i in range(count)]
    assert sum(c for c, _ in sizes) == table_start
    assert sum(d for _, d in sizes) == arr.nbytes == comp.uncompressed_length
    # each frame on its own decodes to its part of the tensor
    at, raw = 0, arr.astype("<f2").tobytes()  # stored little-endian
    dctx = zstandard.ZstdDecompressor()
    for i, (c, d) in enumerate(sizes):
        frame = data[at:at + c]
        assert dctx.decompress(frame) == raw[i * (64 << 10):i * (64 << 10) + d]
        at += c
    # and the whole is one zstd stream any decoder reads (skipping the table)
    reader = dctx.stream_reader(data, read_across_frames=True)
    assert reader.read() == raw


def test_reads_and_slices_give_the_values(tmp_path, small_frames):
    arr = rows_tensor()
    write(tmp_path / "a.zt", a=arr)
    with ztensor.Reader(tmp_path / "a.zt") as r:
        np.testing.assert_array_equal(r.read_numpy("a"), arr)
    with ztensor.safe_open(tmp_path / "a.zt", framework="np") as f:
        s = f.get_slice("a")
        for index in (5, -1, slice(0, 1), slice(15, 17), slice(3, 390, 7), slice(None),
                      (slice(100, 140), slice(5, 9)), (7, 3), slice(399, 400),
                      slice(200, 200)):
            np.testing.assert_array_equal(s[index], arr[index])


def test_a_slice_decodes_only_its_frames(tmp_path, small_frames, monkeypatch):
    arr = rows_tensor()
    write(tmp_path / "a.zt", a=arr)
    decoded = []
    from ztensor.io import zstd_stream
    real = zstd_stream.zstd_decode

    def counting(stored, size, *args, **kwargs):
        decoded.append(size)
        return real(stored, size, *args, **kwargs)
    monkeypatch.setattr(zstd_stream, "zstd_decode", counting)
    with ztensor.safe_open(tmp_path / "a.zt", framework="np") as f:
        np.testing.assert_array_equal(f.get_slice("a")[20:24], arr[20:24])   # in frame 1
        np.testing.assert_array_equal(f.get_slice("a")[30:34], arr[30:34])   # frames 1, 2
    assert decoded == [64 << 10] * 3  # frame 1; then frames 1 and 2, each on its own


def test_small_components_stay_one_plain_frame(tmp_path):
    arr = RNG.standard_normal(1000).astype(np.float32)
    write(tmp_path / "s.zt", s=arr)
    data, _ = stored_bytes(tmp_path / "s.zt", "s")
    assert data[:4] == b"\x28\xb5\x2f\xfd" and struct.unpack("<I", data[-4:])[0] != 0x8F92EAB1
    assert zstandard.ZstdDecompressor().decompress(data) == arr.astype("<f4").tobytes()


def test_streams_and_big_endian_values_get_frames_too(tmp_path, small_frames):
    arr = RNG.standard_normal((300, 1000)).astype(">f4")
    with ztensor.Writer(tmp_path / "st.zt") as w:
        with w.stream("x", arr.shape, np.float32, compress=True, checksum="sha256") as s:
            for i in range(0, 300, 7):
                s.write(arr[i:i + 7].astype("<f4"))
        w.write_numpy("y", arr, compress=True)
    with ztensor.Reader(tmp_path / "st.zt") as r:
        r.verify()
        np.testing.assert_array_equal(r.read_numpy("x"), arr)
        np.testing.assert_array_equal(r.read_numpy("y"), arr)
    with ztensor.safe_open(tmp_path / "st.zt", framework="np") as f:
        np.testing.assert_array_equal(f.get_slice("x")[123:125], arr[123:125])
        np.testing.assert_array_equal(f.get_slice("y")[-3:], arr[-3:])


def test_files_without_a_table_still_slice(tmp_path):
    """A single-frame stream (another writer's, or ours below FRAME_BYTES): decoded
    once per handle."""
    arr = rows_tensor(rows=40)
    write(tmp_path / "one.zt", a=arr)
    with ztensor.safe_open(tmp_path / "one.zt", framework="np") as f:
        np.testing.assert_array_equal(f.get_slice("a")[3:9], arr[3:9])
        assert "a" in f._decoded


def corrupt_table(path, name, edit):
    data, comp = stored_bytes(path, name)
    data = bytearray(data)
    edit(data)
    with open(path, "r+b") as f:
        f.seek(comp.offset)
        f.write(data)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.__setitem__(slice(-9, -5), struct.pack("<I", 10**9)), "does not fit"),
    (lambda d: d.__setitem__(slice(-9, -5), struct.pack("<I", 2)), "skippable frame"),
    (lambda d: d.__setitem__(-5, 0x7C), "does not fit"),
    (lambda d: d.__setitem__(slice(-(8 * 7 + 9) + 4, -(8 * 7 + 9) + 8),
                             struct.pack("<I", 1 << 20)), "sums to"),
    (lambda d: d.__setitem__(slice(-(8 * 7 + 9), -(8 * 7 + 9) + 4),
                             struct.pack("<I", 1)), "sums to"),
])
def test_hostile_tables_are_refused(tmp_path, small_frames, edit, message):
    arr = rows_tensor(rows=100)  # 400 KiB: 7 frames of 64 KiB
    write(tmp_path / "h.zt", a=arr)
    corrupt_table(tmp_path / "h.zt", "a", edit)
    with ztensor.safe_open(tmp_path / "h.zt", framework="np") as f:
        with pytest.raises(FormatError, match=message) as err:
            f.get_slice("a")[3:4]
    assert "h.zt" in str(err.value) and "a" in str(err.value)


def test_frames_that_lie_about_their_size_are_refused(tmp_path, small_frames):
    """A table whose entries add up but split the frames wrongly: the decoded frames
    do not yield what the table says, and that is an error, not wrong values."""
    arr = rows_tensor(rows=100)
    write(tmp_path / "l.zt", a=arr)
    count = 7
    first = -(8 * count + 9)

    def shift(d):
        c0, d0 = struct.unpack_from("<II", d, len(d) + first)
        c1, d1 = struct.unpack_from("<II", d, len(d) + first + 8)
        struct.pack_into("<IIII", d, len(d) + first, c0, d0 - 4096, c1, d1 + 4096)
    corrupt_table(tmp_path / "l.zt", "a", shift)
    with ztensor.safe_open(tmp_path / "l.zt", framework="np") as f:
        with pytest.raises(FormatError):
            f.get_slice("a")[0:1]
    with ztensor.Reader(tmp_path / "l.zt") as r:  # whole reads decode frame by frame too
        with pytest.raises(FormatError, match="zstd stream"):
            r.read_numpy("a")


@pytest.mark.parametrize("threads", [1, 3])
def test_whole_reads_decode_frames_in_parallel(tmp_path, small_frames, threads, monkeypatch):
    arr = rows_tensor(rows=1000)  # 4 MB: 63 frames of 64 KiB
    write(tmp_path / "p.zt", a=arr)
    monkeypatch.setattr(seekable.kernels, "cpu_threads", lambda: threads)
    with ztensor.Reader(tmp_path / "p.zt") as r:
        np.testing.assert_array_equal(r.read_numpy("a"), arr)
        out = np.empty_like(arr)
        r.read_into("a", out)
        np.testing.assert_array_equal(out, arr)
        data = r.stored_bytes("a", "data")
        comp = r.metadata("a").components["data"]
        assert len(seekable.parse_seek_table(data, comp).sizes) == 63


def test_frame_writer_holds_one_frame(monkeypatch):
    monkeypatch.setattr(seekable, "FRAME_BYTES", 1000)
    fw = seekable.FrameWriter(3)
    out = []
    for size in (10, 990, 1, 2500, 499, 0, 1000):
        out += fw.write(bytes(size))
        assert len(fw._pending) < 1000
    out += fw.finish()
    assert [d for _, d in fw.sizes] == [1000] * 5 and len(out) == 6  # 5 frames + table
    assert zstandard.ZstdDecompressor().stream_reader(b"".join(out),
                                                      read_across_frames=True).read() == \
        bytes(5000)


class CountingFile:
    """A seekable binary file object that counts the bytes read through it."""

    def __init__(self, data):
        import io
        self._f = io.BytesIO(data)
        self.read_bytes = 0

    def read(self, n=-1):
        out = self._f.read(n)
        self.read_bytes += len(out)
        return out

    def readinto(self, buf):
        n = self._f.readinto(buf)
        self.read_bytes += n
        return n

    def seek(self, *args):
        return self._f.seek(*args)

    def tell(self):
        return self._f.tell()

    def seekable(self):
        return True

    def readable(self):
        return True


def test_an_unmapped_source_fetches_only_the_frames(tmp_path, small_frames):
    """Over a file object (as over a URL), one row of a 1.6 MiB compressed tensor
    reads the manifest, the seek table and one 64 KiB frame's stored bytes."""
    arr = rows_tensor()
    write(tmp_path / "a.zt", a=arr)
    data = (tmp_path / "a.zt").read_bytes()
    fileobj = CountingFile(data)
    with ztensor.safe_open(fileobj, framework="np") as f:
        opened = fileobj.read_bytes
        np.testing.assert_array_equal(f.get_slice("a")[200], arr[200])
        used = fileobj.read_bytes - opened
    assert used < (64 << 10) + 4096, used
    assert len(data) > 10 * used


def test_the_committed_seed_file():
    """tests/data/seekable/frames-256.zt (256-byte frames: see its README)."""
    path = DATA / "seekable" / "frames-256.zt"
    want = (np.arange(40 * 24, dtype=np.float32) % 7).reshape(40, 24)
    with ztensor.Reader(path) as r:
        r.verify()
        np.testing.assert_array_equal(r.read_numpy("rows"), want)
        comp = r.metadata("rows").components["data"]
        assert len(seekable.parse_seek_table(r.stored_bytes("rows", "data"), comp).sizes) == 15
    with ztensor.safe_open(path, framework="np") as f:
        for i in range(40):
            np.testing.assert_array_equal(f.get_slice("rows")[i], want[i])
        assert f._decoded == {}  # every row came from its frames
