"""Session 10's closing round on the core paths: rules the red team left open.

Each test builds a file the writer refuses (by hand, or by editing a real file) and
checks every read path refuses it with a FormatError naming the file and object."""
import numpy as np
import pytest

import ztensor
from crafted import v1_file  # tests/ is on sys.path: conftest.py

Q8_0 = {"ggml_type": "Q8_0", "ggml_type_id": 8, "block_elements": 32, "block_bytes": 34}


def q8_0_blocks(nblocks):
    blocks = np.zeros((nblocks, 34), np.uint8)
    blocks[:, :2] = np.array([0.5], "<f2").view(np.uint8)  # little-endian on disk, on any host
    blocks[:, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    return blocks.reshape(-1)


def gguf_blocks_file(shape, nblocks):
    blob = q8_0_blocks(nblocks).tobytes()
    manifest = {"version": "1.2.0", "objects": {"q": {
        "shape": list(shape), "format": "gguf_blocks", "attributes": dict(Q8_0),
        "components": {"blocks": {"dtype": "u8", "offset": 64, "length": len(blob)}}}}}
    return v1_file(manifest, bytes(56) + blob)


@pytest.mark.parametrize("shape", [(2, 16), (4, 8), (16, 2, 2)])
def test_gguf_blocks_rows_that_split_a_block_are_refused(tmp_path, shape):
    """ggml rows are whole blocks: shape (2, 16) of Q8_0 holds one 32-element block
    across two rows, which no ggml tool writes or reads.  The total count divides, so
    only the row rule catches it."""
    path = tmp_path / "rows.zt"
    path.write_bytes(gguf_blocks_file(shape, 1))
    with ztensor.Reader(str(path)) as r:
        with pytest.raises(ztensor.FormatError, match="innermost dimension") as exc:
            r.read("q")
        assert exc.value.path == str(path) and exc.value.obj == "q"
        with pytest.raises(ztensor.FormatError, match="innermost dimension"):
            r.verify()
    with pytest.raises(ztensor.FormatError, match="innermost dimension"):
        with ztensor.Writer(str(tmp_path / "w.zt")) as w:
            w.write("q", ztensor.Tensor({"blocks": q8_0_blocks(1)}, shape=shape,
                                        format="gguf_blocks", attributes=dict(Q8_0)))
    assert not (tmp_path / "w.zt").exists()


def test_gguf_blocks_whole_rows_still_dequantize(tmp_path):
    """The rule's other side: (2, 32) is two whole rows, and dequantizes to the
    block's values (scale 0.5 times -> 0..31)."""
    path = tmp_path / "ok.zt"
    path.write_bytes(gguf_blocks_file((2, 32), 2))
    with ztensor.Reader(str(path)) as r:
        values = ztensor.dequantize(r.read("q"))
        r.verify()
    np.testing.assert_array_equal(values, np.tile(np.arange(32, dtype=np.float32) * 0.5, (2, 1)))


def sizeless_sparse_file(parts):
    """A v1.1 file of ``parts`` sparse_csr objects, each with values stored as a
    zstd stream that declares no size (allowed before 1.2): 4,000 zeros of f32."""
    import zstandard  # a run-time dependency

    values = np.zeros(4000, "<f4")
    payload = zstandard.ZstdCompressor().compress(values.tobytes())
    indices = np.arange(4000, dtype="<u8").tobytes()
    indptr = np.array([0, 4000], dtype="<u8").tobytes()
    blob, objects = b"", {}
    for i in range(parts):
        at = 64 + len(blob)
        objects[f"s{i}"] = {"shape": [1, 4000], "format": "sparse_csr", "components": {
            "values": {"dtype": "f32", "offset": at, "length": len(payload), "encoding": "zstd"},
            "indices": {"dtype": "u64", "offset": at + 64 * (-(-len(payload) // 64)),
                        "length": len(indices)},
            "indptr": {"dtype": "u64",
                       "offset": at + 64 * (-(-len(payload) // 64) + len(indices) // 64),
                       "length": 16}}}
        part = payload + bytes(-len(payload) % 64) + indices + indptr
        blob += part + bytes(-len(part) % 64)
    return v1_file({"version": "1.1.0", "objects": objects}, bytes(56) + blob), values


def test_v11_sizeless_zstd_parts_count_towards_the_file_total():
    """Before 1.2 a zstd part of a sparse object may declare no size; each is held to
    the per-component limit as it decodes, and what they decode to, together, to
    max_total_decompressed (dense parts are counted at open from their shape)."""
    data, values = sizeless_sparse_file(3)
    with ztensor.Reader(data) as r:  # 48,000 decoded bytes: within the defaults
        for name in r.keys():
            np.testing.assert_array_equal(r.read(name).components["values"], values)
            # the spec stays as the file declares it (the count is the Reader's own)
            assert r.metadata(name).components["values"].uncompressed_length is None
    limits = ztensor.Limits(max_total_decompressed=40000)
    with ztensor.Reader(data, limits=limits) as r:
        r.read("s0")
        r.read("s1")
        r.read("s0")  # read again: counted once
        with pytest.raises(ztensor.LimitError, match="per-file limit of 40000") as exc:
            r.read("s2")
        assert exc.value.obj == "s2"
        with pytest.raises(ztensor.LimitError, match="per-file limit"):
            r.verify()


def test_a_bool_slice_checks_the_elements_it_returns(tmp_path):
    """safe_open's get_slice checks the bool rule on the slice it returns, so reading
    ten rows of a large bool tensor does not scan the rest; a slice that holds the
    bad byte, and a whole read, still refuse it."""
    from ztensor.safe import safe_open

    path = tmp_path / "b.zt"
    truth = (np.arange(100_000) % 3 == 0).reshape(1000, 100)
    with ztensor.Writer(str(path)) as w:
        w.add("b", truth)
    with ztensor.Reader(str(path)) as r:
        offset = r.metadata("b").components["data"].offset
    data = bytearray(path.read_bytes())
    data[offset + 900 * 100 + 7] = 2  # row 900, column 7
    path.write_bytes(bytes(data))
    with safe_open(str(path), framework="np") as f:
        part = f.get_slice("b")[:10]
        np.testing.assert_array_equal(part, truth[:10])
        with pytest.raises(ztensor.FormatError, match="other than 0 or 1") as exc:
            f.get_slice("b")[895:905]
        assert exc.value.obj == "b"
        with pytest.raises(ztensor.FormatError, match="other than 0 or 1"):
            f.get_tensor("b")


def test_a_slice_torch_cannot_hold_names_the_file(tmp_path, monkeypatch):
    """safe_open(framework="pt")'s slice of a dtype this torch lacks (uint16 before
    torch 2.3, simulated here) is refused naming the file and the object, as the
    whole-tensor read is."""
    torch = pytest.importorskip("torch")
    from ztensor.safe import safe_open

    path = tmp_path / "u16.zt"
    with ztensor.Writer(str(path)) as w:
        w.add("x", np.arange(6, dtype=np.uint16))
    real = torch.from_numpy

    def older_torch(arr):
        if arr.dtype == np.uint16:
            raise TypeError("can't convert np.ndarray of type numpy.uint16")
        return real(arr)

    monkeypatch.setattr(torch, "from_numpy", older_torch)
    with safe_open(str(path), framework="pt") as f:
        for read in (lambda: f.get_slice("x")[1:3], lambda: f.get_tensor("x")):
            with pytest.raises(ztensor.UnsupportedError, match="uint16") as exc:
                read()
            assert exc.value.path == str(path) and exc.value.obj == "x"


# ---- safetensors files as strictly as the safetensors package reads them


def _safetensors(header: dict, data: bytes, raw_header: bytes = None) -> bytes:
    import json
    import struct

    text = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _both_refuse(tmp_path, blob, match):
    """Our reader and the safetensors package (the oracle) both refuse ``blob``."""
    st = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "x.safetensors"
    path.write_bytes(blob)
    with pytest.raises(Exception):
        st.load_file(str(path))
    with pytest.raises(ztensor.FormatError, match=match) as exc:
        with ztensor.Reader(str(path)) as r:
            for name in r.keys():
                r.read_numpy(name)
    assert exc.value.path == str(path)


F32x2 = {"dtype": "F32", "shape": [2]}


@pytest.mark.parametrize("header, data, match", [
    # 4 bytes no tensor owns, before the first
    ({"a": {**F32x2, "data_offsets": [4, 12]}}, bytes(12), "bytes lie between"),
    # between two tensors
    ({"a": {**F32x2, "data_offsets": [0, 8]}, "b": {**F32x2, "data_offsets": [12, 20]}},
     bytes(20), "bytes lie between"),
    # after the last
    ({"a": {**F32x2, "data_offsets": [0, 8]}}, bytes(16), "8 bytes follow"),
    # overlapping
    ({"a": {**F32x2, "data_offsets": [0, 8]}, "b": {**F32x2, "data_offsets": [4, 12]}},
     bytes(12), "overlaps"),
])
def test_safetensors_bytes_no_tensor_owns_are_refused(tmp_path, header, data, match):
    _both_refuse(tmp_path, _safetensors(header, data), match)


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_safetensors_header_constants_json_lacks_are_refused(tmp_path, constant):
    raw = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "x": ' + constant + b"}"
    _both_refuse(tmp_path, _safetensors({}, bytes(8), raw), "not JSON")


def test_safetensors_empty_tensors_tile_with_the_rest(tmp_path):
    """Empty tensors sit anywhere (their two offsets equal): a file the package
    writes with one between two others reads back, values and all."""
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"a": np.arange(3, dtype=np.float32), "b": np.zeros((0, 4), np.float32),
               "c": np.arange(5, dtype=np.int64), "d": np.zeros(0, np.int8)}
    path = tmp_path / "e.safetensors"
    st.save_file(tensors, str(path))
    with ztensor.Reader(str(path)) as r:
        for name, arr in tensors.items():
            np.testing.assert_array_equal(r.read_numpy(name), arr)


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTERM") or __import__("os").name != "posix",
                    reason="SIGTERM is POSIX's")
def test_sigterm_during_convert_is_one_line_and_leaves_nothing(tmp_path):
    """`timeout`, `kill` or a job scheduler ends a convert with SIGTERM: the command
    stops as for Ctrl-C, prints one line, exits 143 (128 + 15), and removes the
    temporary output it had begun (Python's default dies at once and left it)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "in.npy"
    np.save(src, np.random.default_rng(0).standard_normal(8 << 20))  # 64 MB of f64
    proc = subprocess.Popen(
        [sys.executable, "-m", "ztensor", "convert", str(src), str(tmp_path / "out.zt"),
         "--compress", "--level", "19", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".out.zt") for p in tmp_path.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no temporary output appeared"
        time.sleep(0.05)
    time.sleep(0.3)  # well into the compression
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.decode() == "ztensor: terminated\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npy"]


def test_read_into_a_dict_refuses_destinations_that_share_memory(tmp_path):
    """A {name: destination} fill runs in threads: two destinations over the same
    memory would end holding whichever finished last.  Refused before anything is
    read; two column halves of one matrix are separate and fill."""
    path = str(tmp_path / "d.zt")
    with ztensor.Writer(path) as w:
        w.add("a", np.arange(8, dtype=np.float32).reshape(4, 2))
        w.add("b", np.arange(8, dtype=np.float32).reshape(4, 2) + 100)
    with ztensor.Reader(path) as r:
        same = np.zeros((4, 2), np.float32)
        with pytest.raises(ValueError, match="'a' and 'b' share memory"):
            r.read_into({"a": same, "b": same})
        big = np.zeros((4, 3), np.float32)
        with pytest.raises(ValueError, match="share memory"):
            r.read_into({"a": big[:, :2], "b": big[:, 1:]})  # column 1 in both
        assert not big.any() and not same.any()  # refused before any fill
        whole = np.zeros((4, 4), np.float32)
        r.read_into({"a": whole[:, :2], "b": whole[:, 2:]}, threads=2)
    np.testing.assert_array_equal(whole[:, :2], np.arange(8).reshape(4, 2))
    np.testing.assert_array_equal(whole[:, 2:], np.arange(8).reshape(4, 2) + 100)
    torch = pytest.importorskip("torch")
    with ztensor.Reader(path) as r:
        t = torch.zeros(4, 2)
        with pytest.raises(ValueError, match="share memory"):
            r.read_into({"a": t, "b": t.view(4, 2)})
