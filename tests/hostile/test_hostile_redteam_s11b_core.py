"""Issue 21, red-team round three, second fresh round (session 11b): the ``.zt`` core
reader, ``read_into``, the bytes loaders and ``ztensor.torch``, tried with what the
first round did not try.  Files are made by the real writers (the Writer,
``ztensor.torch.save_file``); each test fails without its fix."""

import mmap
import os
import struct
import subprocess
import sys

import cbor2
import numpy as np
import pytest

import ztensor
import ztensor.numpy as znp

torch = pytest.importorskip("torch")
import ztensor.torch as zpt  # noqa: E402 - after the importorskip


def _with_manifest(path, edit):
    """The Writer's file at ``path`` with its manifest (decoded, changed by ``edit``,
    encoded again) and footer rewritten: the blobs stay where the writer put them."""
    data = open(path, "rb").read()
    (size,) = struct.unpack("<Q", data[-16:-8])
    root = cbor2.loads(data[-16 - size : -16])
    edit(root)
    manifest = cbor2.dumps(root)
    with open(path, "wb") as f:
        f.write(data[: -16 - size] + manifest + struct.pack("<Q", len(manifest)) + b"ZTEN1000")
    return path


# ---------------------------------------------------------------- the version string
@pytest.mark.parametrize("version", ["1.\u00b2.0", "\u00b9.2.0", "1.\u0662.0", "1.2.\u00b2"])
def test_a_version_of_other_digits_is_a_format_error(tmp_path, version):
    """``spec.parse_version`` took ``str.isdigit``, which holds for ``"²"`` (then
    ``int`` raised a bare ValueError at the open) and for ``"٢"`` (read as 1.2):
    a version is ASCII digits, anything else the FormatError a malformed one gets."""
    path = str(tmp_path / "v.zt")
    with ztensor.Writer(path) as w:
        w.write_numpy("a", np.arange(4, dtype=np.float32))
    _with_manifest(path, lambda root: root.__setitem__("version", version))
    with pytest.raises(ztensor.FormatError, match="version") as info:
        ztensor.Reader(path)
    assert info.value.path == path


# ---------------------------------------------------------------- torch dtypes, bytes and copies
_BIT_TYPES = [
    name
    for name in ("float8_e8m0fnu", "float4_e2m1fn_x2", "float8_e4m3fn", "bfloat16")
    if hasattr(torch, name)
]


def _bits_tensor(dtype):
    return torch.tensor([0x38, 0x40, 0x7F, 0x01], dtype=torch.uint8).view(dtype)


@pytest.mark.parametrize("dtype_name", _BIT_TYPES)
def test_every_torch_load_gives_the_dtype_of_the_file(tmp_path, dtype_name):
    """``ztensor.torch.load(bytes)`` and ``load_file(copy=True)`` took the batch
    read's numpy arrays as the tensors: an e8m0 or float4 object came back as
    ``torch.uint8`` bits (numpy gives a type ml_dtypes lacks as its storage), where
    ``load_file`` and ``read_torch`` give torch's own dtype.  Every load gives the
    same tensor."""
    dtype = getattr(torch, dtype_name)
    value = _bits_tensor(dtype) if dtype.itemsize == 1 else torch.arange(4).to(dtype)
    path = str(tmp_path / "t.zt")
    zpt.save_file({"w": value, "plain": torch.arange(3.0)}, path)
    expected = value.view(torch.uint8) if dtype.itemsize == 1 else value.view(torch.int16)
    loads = {
        "load_file": zpt.load_file(path),
        "load_file copy": zpt.load_file(path, copy=True),
        "load bytes": zpt.load(open(path, "rb").read()),
    }
    for how, got in loads.items():
        assert got["w"].dtype == dtype, how
        assert torch.equal(got["w"].view(expected.dtype), expected), how
        assert torch.equal(got["plain"], torch.arange(3.0)), how


def test_without_ml_dtypes_every_torch_load_gives_bf16_and_float8(tmp_path):
    """The same without ml_dtypes (``ZTENSOR_NO_ML_DTYPES=1``, read when ztensor is
    imported, so in a fresh process): numpy decodes bf16 and float8 to float32, and
    ``load(bytes)`` / ``load_file(copy=True)`` gave those float32 arrays as the
    tensors, where ``load_file`` gives torch.bfloat16 / torch.float8_e4m3fn."""
    path = str(tmp_path / "b.zt")
    zpt.save_file(
        {"b": torch.arange(4).to(torch.bfloat16), "f": torch.arange(4).to(torch.float8_e4m3fn)},
        path,
    )
    code = (
        "import sys, torch, ztensor.torch as zpt\n"
        "p = sys.argv[1]\n"
        "loads = zpt.load_file(p), zpt.load_file(p, copy=True), zpt.load(open(p, 'rb').read())\n"
        "for got in loads:\n"
        "    print(got['b'].dtype, got['f'].dtype, got['b'].tolist(), got['f'].tolist())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, path],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ZTENSOR_NO_ML_DTYPES": "1"},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines
        == ["torch.bfloat16 torch.float8_e4m3fn [0.0, 1.0, 2.0, 3.0] [0.0, 1.0, 2.0, 3.0]"] * 3
    )


# ---------------------------------------------------------------- bytes that are file-like too
def test_the_bytes_loaders_take_an_mmap(tmp_path):
    """An ``mmap.mmap`` is bytes-like, and file-like too: ``open_bytes`` handed the
    object on, Source took it for a file object, and its ``seek`` (None) gave a bare
    ``TypeError: '<' not supported`` from ``deserialize``, ``numpy.load`` and
    ``torch.load``.  The checked view is what is read."""
    data = ztensor.serialize({"a": {"dtype": "float32", "shape": [2], "data": b"\0\0\x80?" * 2}})
    buffer = mmap.mmap(-1, len(data))
    buffer.write(data)
    expected = {"dtype": "F32", "shape": [2], "data": data[64:72]}
    assert ztensor.deserialize(buffer) == [("a", expected)]
    assert znp.load(buffer)["a"].tolist() == [1.0, 1.0]
    assert zpt.load(buffer)["a"].tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- read_into destinations
@pytest.mark.parametrize("compress", [False, True])
def test_read_into_a_negative_view_shows_the_values(tmp_path, compress):
    """A torch negative view (``x._neg_view()``, what ``torch.neg`` of a conjugate
    gives lazily) raised torch's bare RuntimeError from ``.numpy()``; filled through
    its memory it would show the values negated.  It is filled as a strided view
    is, through ``copy_``: it shows the object's values."""
    path = str(tmp_path / "n.zt")
    values = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    with ztensor.Writer(path) as w:
        w.write_numpy("a", values, compress=compress)
    with ztensor.Reader(path) as r:
        base = torch.zeros(2, 3)
        dst = base._neg_view()
        r.read_into("a", dst)
        assert dst.tolist() == values.tolist()
        assert base.tolist() == (-values).tolist()
        base = torch.zeros(2, 3)
        r.read_into({"a": base._neg_view()})
        assert base.tolist() == (-values).tolist()


def test_read_into_a_conjugate_view_shows_the_values(tmp_path):
    """The complex twin: a ``conj()`` view is filled so that it shows the object's
    values (its memory then holds their conjugates)."""
    path = str(tmp_path / "c.zt")
    values = (np.arange(6) + 1j * np.arange(6, 12)).astype(np.complex64)
    with ztensor.Writer(path) as w:
        w.write_numpy("c", values)
    with ztensor.Reader(path) as r:
        base = torch.zeros(6, dtype=torch.complex64)
        dst = base.conj()
        r.read_into("c", dst)
        assert dst.resolve_conj().numpy().tolist() == values.tolist()
        assert base.numpy().tolist() == values.conj().tolist()
