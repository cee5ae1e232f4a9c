"""Session 13, leftovers of the core read path review.

* a zstd component of 0 stored bytes (declaring 0 decoded ones, or none in v1.1) was
  read as an empty tensor by every path, though an empty byte string is no zstd frame
  and no writer makes one: refused at open (manifest_checks.Checker.check_zstd_size),
  while the Writer's own empty compressed tensors (a 9-byte frame) still read;
* ``ztensor info`` counted a v1.1 sparse zstd part that declares no size as 0 decoded
  bytes: it now says the size is not declared (text; ``decoded_bytes: null`` in JSON);
* a bool byte other than 0/1 refused through ``read_numpy``, batch reads or
  ``safe_open`` named the object but not ``component 'data'``, as ``read``,
  ``read_into`` and ``stats`` did (reader.read_numpy's general path now passes it).
"""
import io
import json
import struct

import cbor2
import numpy as np
import pytest
import zstandard

import ztensor
from crafted import relaid, streamed, v1_file, zstd_file
from ztensor.tools.cli import main


def cli(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def refused(exc_info, path, name, component="data", cls=ztensor.FormatError):
    exc = exc_info.value
    assert isinstance(exc, cls), exc
    assert exc.path == str(path) and exc.obj == name, (exc.path, exc.obj)
    assert exc.component == component, exc.component
    return exc


# ------------------------------------------------------------------ empty zstd components
def empty_zstd_v12(path):
    """A v1.2 dense f32 object of shape [0] stored as zstd in 0 bytes (declaring 0)."""
    path.write_bytes(zstd_file(b"", 0, shape=[0]))
    return path


def empty_zstd_v11(path):
    """The same in v1.1, which need not declare the decoded size."""
    m = {"version": "1.1.0", "objects": {"z": {"shape": [0], "format": "dense",
         "components": {"data": {"dtype": "f32", "offset": 64, "length": 0,
                                 "encoding": "zstd"}}}}}
    path.write_bytes(v1_file(m, bytes(56)))
    return path


def empty_zstd_v11_sparse(path):
    """A v1.1 CSR matrix of shape [2, 0] with no entries whose values part is zstd in 0
    bytes, declaring no size (the format rules alone would take it: 0 values)."""
    indptr = np.zeros(3, "<u8").tobytes()
    m = {"version": "1.1.0", "objects": {"z": {"shape": [2, 0], "format": "sparse_csr",
         "components": {
             "values": {"dtype": "f32", "offset": 64, "length": 0, "encoding": "zstd"},
             "indices": {"dtype": "u64", "offset": 64, "length": 0},
             "indptr": {"dtype": "u64", "offset": 64, "length": len(indptr)}}}}}
    path.write_bytes(v1_file(m, bytes(56) + indptr))
    return path


def every_read_path(path, name):
    """Each way a caller reads the object, as (label, thunk): each opens on its own."""

    def read_numpy():
        with ztensor.Reader(path) as r:
            r.read_numpy(name)

    def batch():
        with ztensor.Reader(path) as r:
            r.read_numpy([name])

    def read():
        with ztensor.Reader(path) as r:
            r.read(name)

    def read_into():
        with ztensor.Reader(path) as r:
            r.read_into(name, np.empty(r.metadata(name).shape, np.float32))

    def verify():
        with ztensor.Reader(path) as r:
            r.verify()

    def safe_open():
        with ztensor.safe_open(path, "np") as f:
            f.get_tensor(name)

    return [("read_numpy", read_numpy), ("batch", batch), ("read", read),
            ("read_into", read_into), ("verify", verify), ("safe_open", safe_open)]


@pytest.mark.parametrize("make", [empty_zstd_v12, empty_zstd_v11], ids=["v1.2", "v1.1"])
def test_a_zstd_component_of_no_bytes_is_refused_on_every_path(tmp_path, make):
    path = make(tmp_path / "empty.zt")
    for label, thunk in every_read_path(path, "z"):
        with pytest.raises(ztensor.FormatError) as info:
            thunk()
        exc = refused(info, path, "z")
        assert "0 bytes" in str(exc) and "no zstd frame" in str(exc), (label, exc)
    # the command line: verify and stats cannot open it (exit 2), info neither
    for command in ("verify", "stats", "info"):
        code, _ = cli(command, str(path))
        assert code == 2, command


def test_a_sparse_part_of_no_zstd_bytes_is_refused(tmp_path):
    path = empty_zstd_v11_sparse(tmp_path / "empty_sparse.zt")
    with pytest.raises(ztensor.FormatError) as info:
        ztensor.Reader(path)
    refused(info, path, "z", component="values")


@pytest.mark.parametrize("compress", [True, 1, 19])
def test_what_our_writer_makes_of_an_empty_tensor_reads_on_every_path(tmp_path, compress):
    """An empty tensor written compressed is a 9-byte frame (header and an empty last
    block), never 0 bytes, through write_numpy and stream; every path reads it."""
    path = tmp_path / "ours.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("z", np.zeros(0, np.float32), compress=compress, checksum="sha256")
        with w.stream("s", (0, 3), np.float32, compress=compress) as s:
            s.write(np.zeros((0, 3), np.float32))
    with ztensor.Reader(path) as r:
        for name in ("z", "s"):
            comp = r.metadata(name).components["data"]
            assert comp.encoding == "zstd" and comp.length == 9 and comp.uncompressed_length == 0
    for name in ("z", "s"):
        for label, thunk in every_read_path(path, name):
            thunk()
    for command in ("verify", "stats", "info"):
        code, _ = cli(command, str(path))
        assert code == 0, command


def test_the_smallest_zstd_frame_still_reads(tmp_path):
    """The rule is about no bytes, not few: zstandard's own empty frame, relaid into a
    Writer's file, reads as the empty tensor it is."""
    src = tmp_path / "src.zt"
    with ztensor.Writer(src) as w:
        w.write_numpy("x", np.zeros(0, np.float32), compress=True)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"")
    dst = relaid(src, tmp_path / "dst.zt", frame)
    with ztensor.Reader(dst) as r:
        assert r.read_numpy("x").shape == (0,)
        r.verify()


# ------------------------------------------------------------------ info: undeclared sizes
def v11_sparse_zstd_without_size(path, values):
    payload = streamed(values.astype("<f4").tobytes())
    n = len(values)
    indices = np.arange(n, dtype="<u8").tobytes()
    indptr = np.array([0, n], dtype="<u8").tobytes()
    blob = payload + bytes(-len(payload) % 64)
    gap = -(-len(indices) // 64) * 64
    m = {"version": "1.1.0", "objects": {
        "s": {"shape": [1, n], "format": "sparse_csr", "components": {
            "values": {"dtype": "f32", "offset": 64, "length": len(payload), "encoding": "zstd"},
            "indices": {"dtype": "u64", "offset": 64 + len(blob), "length": len(indices)},
            "indptr": {"dtype": "u64", "offset": 64 + len(blob) + gap, "length": 16}}},
        "d": {"shape": [2], "format": "dense", "components": {
            "data": {"dtype": "f32", "offset": 64 + len(blob) + gap + 64, "length": 8}}}}}
    body = bytes(56) + blob + indices + bytes(gap - len(indices)) + indptr + bytes(48)
    body += np.array([1, 2], "<f4").tobytes()
    path.write_bytes(v1_file(m, body))
    return path


def test_info_says_a_size_that_is_not_declared_is_not_declared(tmp_path):
    values = np.arange(300, dtype=np.float32)
    path = v11_sparse_zstd_without_size(tmp_path / "v11.zt", values)
    with ztensor.Reader(path) as r:  # the file is sound: 1200 decoded bytes of values
        np.testing.assert_array_equal(r.read("s").components["values"], values)
        r.verify()
    known = 300 * 8 + 16 + 8  # indices, indptr, the dense object: raw, sizes known
    code, text = cli("info", str(path))
    line = next(x for x in text.splitlines() if x.startswith("decoded:"))
    assert code == 0 and "not declared for 1 zstd component" in line, line
    assert f"{known} bytes" in line, line
    code, text = cli("info", "--json", str(path))
    info = json.loads(text)
    assert code == 0 and info["decoded_bytes"] is None, info
    assert info["decoded_bytes_declared"] == known
    assert info["components_without_decoded_size"] == 1


def test_info_counts_declared_sizes_as_before(tmp_path):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("a", np.zeros((10, 4), np.float16), compress=True)
        w.write_numpy("b", np.zeros(3, np.float32))
    code, text = cli("info", "--json", str(path))
    info = json.loads(text)
    assert info["decoded_bytes"] == info["decoded_bytes_declared"] == 80 + 12
    assert info["components_without_decoded_size"] == 0
    code, text = cli("info", str(path))
    assert "decoded:     92 B (92 bytes)" in text or "(92 bytes)" in text


# ------------------------------------------------------------------ bool bytes: one wording
def bad_bool_files(tmp_path):
    src = tmp_path / "bools.zt"
    with ztensor.Writer(src) as w:
        w.write_numpy("x", np.array([True, False, True, True]))
    raw = bytearray(src.read_bytes())
    raw[64 + 2] = 2  # the third element: the byte 0x02
    plain = tmp_path / "raw.zt"
    plain.write_bytes(bytes(raw))
    packed = tmp_path / "zstd.zt"
    with ztensor.Writer(packed) as w:
        w.write_numpy("x", np.array([True, False, True, True]), compress=True)
    relaid(packed, packed, zstandard.ZstdCompressor().compress(b"\x01\x00\x02\x01"))
    return [plain, packed]


def test_a_bad_bool_byte_names_the_component_on_every_path(tmp_path):
    for path in bad_bool_files(tmp_path):
        def read_numpy_copy():
            with ztensor.Reader(path) as r:
                r.read_numpy("x", copy=True)

        def read_torch():
            pytest.importorskip("torch")
            with ztensor.Reader(path) as r:
                r.read_torch("x")

        def safe_slice():
            with ztensor.safe_open(path, "np") as f:
                f.get_slice("x")[0:3]

        def bool_into():
            with ztensor.Reader(path) as r:
                r.read_into("x", np.empty(4, bool))

        thunks = every_read_path(path, "x")[:-3] + [
            ("read_numpy copy", read_numpy_copy), ("read_torch", read_torch),
            ("safe_open", every_read_path(path, "x")[-1][1]), ("safe slice", safe_slice),
            ("read_into", bool_into)]
        messages = set()
        for label, thunk in thunks:
            with pytest.raises(ztensor.FormatError) as info:
                thunk()
            exc = refused(info, path, "x")
            messages.add(str(exc))
        # one wording, from io/values.check_bools, naming file, object and component
        assert messages == {
            f"{path}: object 'x', component 'data': a bool element holds a byte other than 0 or 1"
        }, messages


def test_a_v01_sparse_bool_blob_names_its_values(tmp_path):
    """read() of a v0.1 sparse bool object returns v1.2 components; a bad byte among
    its values is named as the 'values' component it returns."""
    indptr = np.array([0, 1, 2], "<u8").tobytes()
    indices = np.array([0, 1], "<u8").tobytes()
    blob = indptr + indices + b"\x01\x02"
    entry = {"name": "s", "offset": 64, "size": len(blob), "dtype": "bool", "shape": [2, 2],
             "encoding": "raw", "layout": "sparsecsr"}
    cb = cbor2.dumps([entry])
    data = b"ZTEN0001" + bytes(56) + blob
    data += bytes(-len(data) % 64) + cb + struct.pack("<Q", len(cb))
    path = tmp_path / "v01.zt"
    path.write_bytes(data)
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.FormatError) as info:
            r.read("s")
    refused(info, path, "s", component="values")
