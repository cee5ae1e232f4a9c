"""Writer: exact bytes, determinism, atomic replacement, argument checking."""
import json
import os
import stat

import numpy as np
import pytest

import ztensor
from conftest import DATA, asymmetric


def test_output_is_byte_identical_to_the_reference_writer(tmp_path):
    """tests/data/ref-1.2.3/exact.zt was written by ztensor 1.2.3 from these arrays."""
    with np.load(DATA / "ref-1.2.3" / "expected.npz") as npz:
        inputs = {k.split("/")[1]: npz[k] for k in npz.files if k.startswith("dense.zt/")}
        bf16_bits = npz["types.zt/bf16/data"]  # the same bf16 values, as bit patterns
    with ztensor.Writer(tmp_path / "ours.zt") as w:
        for name, arr in inputs.items():
            if name == "scalar":
                continue
            w.write_numpy(name, arr, checksum={"i16": "crc32c", "u8": "sha256"}.get(name))
        w.write("bf16", ztensor.Tensor({"data": bf16_bits}, types={"data": "bf16"}))
    assert (tmp_path / "ours.zt").read_bytes() == (DATA / "ref-1.2.3" / "exact.zt").read_bytes()


def test_known_bytes_of_a_tiny_file(tmp_path):
    with ztensor.Writer(tmp_path / "t.zt") as w:
        w.write_numpy("x", np.array([1, 258], dtype=">u2"))
    data = (tmp_path / "t.zt").read_bytes()
    manifest = bytes.fromhex("a2 6776657273696f6e 65312e322e30 676f626a65637473 a1 6178 a3"
                             " 657368617065 8102 66666f726d6174 6564656e7365"
                             " 6a636f6d706f6e656e7473 a1 6464617461 a3"
                             " 656474797065 63753136 666f6666736574 1840 666c656e677468 04")
    assert data == (b"ZTEN1000" + bytes(56) + b"\x01\x00\x02\x01" + manifest
                    + len(manifest).to_bytes(8, "little") + b"ZTEN1000")


def test_identical_input_gives_identical_files(tmp_path):
    def write(path, order):
        with ztensor.Writer(path, attributes={"b": 1, "a": [1.5, "x"]}) as w:
            for name in order:
                w.write_numpy(name, asymmetric((5, 5), "<f4"), compress=True, checksum="crc32c")
    write(tmp_path / "1.zt", ["k", "j"])
    write(tmp_path / "2.zt", ["k", "j"])
    assert (tmp_path / "1.zt").read_bytes() == (tmp_path / "2.zt").read_bytes()


def test_exception_in_with_block_leaves_nothing(tmp_path):
    path = tmp_path / "model.zt"
    with pytest.raises(RuntimeError):
        with ztensor.Writer(path) as w:
            w.write_numpy("x", np.ones(10))
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "model.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("old", np.arange(3))
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with ztensor.Writer(path) as w:
            w.write_numpy("new", np.arange(1000))
            assert path.read_bytes() == before          # not replaced while writing
            raise RuntimeError
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["model.zt"]


def test_abandoned_writer_removes_its_temporary_file(tmp_path):
    w = ztensor.Writer(tmp_path / "x.zt")
    w.write_numpy("a", np.ones(3))
    assert len(os.listdir(tmp_path)) == 1
    del w
    assert os.listdir(tmp_path) == []


def test_file_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with ztensor.Writer(tmp_path / "p.zt") as w:
            w.write_numpy("a", np.ones(2))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.zt").stat().st_mode) == 0o640


def test_zero_d_and_empty_arrays(tmp_path):
    with ztensor.Writer(tmp_path / "z.zt") as w:
        w.write_numpy("scalar", np.float32(2.5))
        w.write_numpy("empty", np.zeros((0, 7), np.int16), compress=True, checksum="sha256")
        w.write_numpy("after", np.arange(3, dtype=np.uint8))
    with ztensor.Reader(tmp_path / "z.zt", verify=True) as r:
        assert r.metadata("scalar").shape == () and r["scalar"].shape == ()
        assert r["scalar"][()] == np.float32(2.5)
        # views keep the disk's byte order ('<i2'); on big-endian hosts that is not native
        assert r["empty"].shape == (0, 7) and r["empty"].dtype.newbyteorder("=") == np.int16
        np.testing.assert_array_equal(r["after"], [0, 1, 2])
        empty_comp = r.metadata("empty").components["data"]
        assert empty_comp.uncompressed_length == 0 and empty_comp.offset % 64 == 0


@pytest.mark.parametrize("name", ["", None, 5])
def test_bad_names(tmp_path, name):
    # an empty name is a value the format refuses; a name that is no str at all is
    # the caller's TypeError, as in the reference and safetensors
    error = ztensor.FormatError if name == "" else TypeError
    with ztensor.Writer(tmp_path / "n.zt") as w:
        with pytest.raises(error, match="non-empty string|str"):
            w.write_numpy(name, np.ones(1))


def test_duplicate_name_is_refused_and_writer_stays_usable(tmp_path):
    with ztensor.Writer(tmp_path / "d.zt") as w:
        w.write_numpy("a", np.ones(1))
        with pytest.raises(ztensor.FormatError, match="already written"):
            w.write_numpy("a", np.zeros(1))
        w.write_numpy("b", np.zeros(1))
    with ztensor.Reader(tmp_path / "d.zt") as r:
        assert r.keys() == ["a", "b"] and r["a"][0] == 1


@pytest.mark.parametrize("bad", [np.array(["x"]), np.array([object()]),
                                 np.zeros(2, dtype=[("a", "<i4")]), np.array([1], "M8[s]")])
def test_unsupported_dtypes(tmp_path, bad):
    with ztensor.Writer(tmp_path / "u.zt") as w:
        with pytest.raises(ztensor.UnsupportedError, match="cannot store numpy dtype"):
            w.write_numpy("x", bad)


def test_bad_arguments(tmp_path):
    with ztensor.Writer(tmp_path / "a.zt") as w:
        with pytest.raises(ValueError, match="checksum"):
            w.write_numpy("x", np.ones(1), checksum="md5")
        with pytest.raises(ValueError, match="compress"):
            w.write_numpy("x", np.ones(1), compress="fast")
        with pytest.raises(ValueError, match="level"):
            w.write_numpy("x", np.ones(1), compress=99)
        with pytest.raises(ztensor.FormatError, match="plain data"):
            w.write_numpy("x", np.ones(1), attributes={"f": object()})
        with pytest.raises(ztensor.FormatError, match="shape"):
            w.write("x", ztensor.Tensor({"data": np.ones(5)}, shape=(2, 2)))
        w.write_numpy("x", np.ones(1), checksum="none", compress=0)
    with pytest.raises(ztensor.FormatError, match="string keys"):
        ztensor.Writer(tmp_path / "b.zt", attributes={1: 2})


def test_writer_after_close_refuses(tmp_path):
    w = ztensor.Writer(tmp_path / "c.zt")
    w.close()
    w.close()
    with pytest.raises(ztensor.ZTensorError, match="closed"):
        w.write_numpy("x", np.ones(1))


def test_write_into_missing_folder_is_a_write_error(tmp_path):
    with pytest.raises(ztensor.WriteError) as info:
        ztensor.Writer(tmp_path / "no" / "such" / "f.zt")
    assert isinstance(info.value, OSError)


def failing_fd():
    """A descriptor whose writes fail: /dev/full (ENOSPC, a full disk) where it
    exists, else a pipe with no reader (EPIPE; Python ignores SIGPIPE)."""
    if os.path.exists("/dev/full"):
        return os.open("/dev/full", os.O_WRONLY), "No space left"
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end, "Broken pipe"


def test_full_disk_raises_and_leaves_nothing(tmp_path):
    w = ztensor.Writer(tmp_path / "full.zt")
    fd, words = failing_fd()
    os.dup2(fd, w._temp.fd)                              # every write now fails
    os.close(fd)
    with pytest.raises(ztensor.WriteError, match=words):
        w.write_numpy("big", np.ones(1 << 20))
    assert os.listdir(tmp_path) == []
    with pytest.raises(ztensor.ZTensorError, match="failed"):
        w.write_numpy("again", np.ones(1))


def test_write_composite_with_explicit_types(tmp_path):
    codes = np.array([0x38, 0x40, 0xB8], np.uint8)
    t = ztensor.Tensor({"data": codes}, types={"data": "f8_e4m3fn"})
    with ztensor.Writer(tmp_path / "t.zt") as w:
        w.write("f8", t)
        with pytest.raises(ztensor.FormatError, match="needs 'u8'"):
            w.write("bad", ztensor.Tensor({"data": np.ones(2, np.float32)},
                                          types={"data": "f8_e4m3fn"}))
    with ztensor.Reader(tmp_path / "t.zt") as r:
        assert r.metadata("f8").type == "f8_e4m3fn"
        assert r.read_numpy("f8").astype(np.float32).tolist() == [1.0, 2.0, -1.0]


def test_metadata_json_friendly(tmp_path):
    with ztensor.Writer(tmp_path / "j.zt") as w:
        w.write_numpy("x", np.ones(3, np.float32), compress=True)
    with ztensor.Reader(tmp_path / "j.zt") as r:
        json.dumps(r.metadata("x").to_dict())
