"""Blocks reserved ahead for files written through Python file objects (the exporters:
io/atomic.replace_atomically with a size, kernels.reserve_ahead; csrc/blobwrite.c says
why).  Only ever a hint: the file holds exactly the bytes written, whatever the hint."""

import os

import numpy as np
import pytest

import ztensor
from ztensor import kernels
from ztensor._native import fallback
from ztensor.foreign import export
from ztensor.io import atomic


def _filesystem(path):
    """The type of the filesystem holding ``path`` as statfs(2) gives it ("ext4" for
    ext2/3/4's magic, which is all csrc/blobwrite.c asks), through coreutils' ``stat
    -f`` (right inside a chroot too, where /proc/self/mountinfo names the host's
    mounts), or None where that cannot be asked."""
    import shutil
    import subprocess

    if shutil.which("stat") is None:
        return None
    try:
        done = subprocess.run(
            ["stat", "-f", "-c", "%t", path], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    if done.returncode:
        return None
    return {"ef53": "ext4", "1021994": "tmpfs"}.get(done.stdout.strip(), done.stdout.strip())


def _allocated(fd):
    return os.fstat(fd).st_blocks * 512


def test_a_reservation_never_changes_the_size_and_on_ext4_holds_the_blocks(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"abc")
        reserved = kernels.reserve_ahead(fd, 8 << 20)
        assert os.fstat(fd).st_size == 3
        assert os.pread(fd, 10, 0) == b"abc"
        kind = _filesystem(str(tmp_path))
        if kind == "ext4" and kernels.backend == "c":
            assert reserved is True
            assert _allocated(fd) >= 8 << 20
        elif kind is not None:
            assert reserved is False
        if reserved:
            assert _allocated(fd) >= 8 << 20
        os.ftruncate(fd, 3)  # what replace_atomically does when done
        assert _allocated(fd) <= 64 << 10
        assert kernels.reserve_ahead(fd, 0) is False
    finally:
        os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no tmpfs at /dev/shm here")
def test_no_reservation_off_ext4(tmp_path):
    """tmpfs would zero every reserved page: nothing is reserved there."""
    if _filesystem("/dev/shm") == "ext4":
        pytest.skip("/dev/shm is ext4 here")
    path = f"/dev/shm/zt-reserve-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert kernels.reserve_ahead(fd, 8 << 20) is False
        assert _allocated(fd) == 0
    finally:
        os.close(fd)
        os.unlink(path)


def test_the_fallback_reserves_nothing(tmp_path):
    with open(tmp_path / "f", "wb") as f:
        assert fallback.reserve_ahead(f.fileno(), 1 << 20) is False


@pytest.mark.parametrize("impl", [kernels, fallback])
@pytest.mark.parametrize("fd, nbytes", [(0, -1), (0, 1 << 64), (-1, 10), (0, 1.5), ("0", 1)])
def test_bad_arguments_are_a_kernel_argument_error(impl, fd, nbytes):
    with pytest.raises(ztensor.ZTensorError, match="reserve_ahead"):
        impl.reserve_ahead(fd, nbytes)


@pytest.mark.parametrize("hint, written", [(10 << 20, 3), (100, 1 << 20), (1 << 20, 1 << 20)])
def test_replace_atomically_writes_exactly_the_bytes_whatever_the_hint(tmp_path, hint, written):
    path = str(tmp_path / "out.bin")
    with open(path, "wb") as f:
        f.write(b"old" * 1000)
    payload = bytes(range(256)) * (written // 256) + bytes(written % 256)
    atomic.replace_atomically(path, lambda f: f.write(payload), size=hint)
    with open(path, "rb") as f:
        assert f.read() == payload
    blocks = os.stat(path).st_blocks * 512
    assert blocks <= written + (1 << 20), "the reserved blocks past the end were given back"


def test_replace_atomically_that_fails_leaves_the_old_file(tmp_path):
    path = str(tmp_path / "out.bin")
    with open(path, "wb") as f:
        f.write(b"old")

    def fail(f):
        f.write(b"partial")
        raise RuntimeError("the writer stopped")

    with pytest.raises(RuntimeError):
        atomic.replace_atomically(path, fail, size=1 << 20)
    with open(path, "rb") as f:
        assert f.read() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]


def _source_and_old_output(tmp_path, seed, count, length, output):
    """A ``.zt`` of ``count`` float32 tensors of about ``length`` elements (their
    arrays by name), and an old 1 MiB file of noise at ``output``, to be replaced."""
    rng = np.random.default_rng(seed)
    data = {f"t{i}": rng.standard_normal(length + i, np.float32) for i in range(count)}
    src = str(tmp_path / "in.zt")
    with ztensor.Writer(src) as w:
        for name, a in data.items():
            w.write_numpy(name, a)
    out = str(tmp_path / output)
    with open(out, "wb") as f:
        f.write(os.urandom(1 << 20))
    return data, src, out


def test_an_export_over_an_old_file_round_trips(tmp_path):
    """The exporters pass their data size (less headers) as the hint."""
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    data, src, out = _source_and_old_output(tmp_path, 1, 20, 1000, "out.safetensors")
    with ztensor.Reader(src) as r:
        export.write_safetensors(r, out)
    back = load_file(out)
    assert sorted(back) == sorted(data)
    for name, a in data.items():
        np.testing.assert_array_equal(back[name], a)


def test_a_gguf_export_reserves_once_gguf_py_has_opened_the_file(tmp_path, monkeypatch):
    """gguf-py opens (and truncates) the file itself: the exporter reserves on its
    descriptor after that, and gives back what the file did not use."""
    gguf = pytest.importorskip("gguf")
    data, src, out = _source_and_old_output(tmp_path, 2, 8, 4096, "out.gguf")
    asked = []
    real_reserve = atomic.reserve

    def spy(fd, size):
        asked.append((os.fstat(fd).st_size, size))
        real_reserve(fd, size)

    monkeypatch.setattr(atomic, "reserve", spy)
    with ztensor.Reader(src) as r:
        export.write_gguf(r, out)
    assert asked == [(asked[0][0], sum(a.nbytes for a in data.values()))]
    assert asked[0][0] < 4096, "reserved right after the header, before the tensors"
    size = os.stat(out).st_size
    assert os.stat(out).st_blocks * 512 <= size + (1 << 20), "the rest was given back"
    back = gguf.GGUFReader(out)
    assert sorted(t.name for t in back.tensors) == sorted(data)
    for t in back.tensors:
        np.testing.assert_array_equal(np.asarray(t.data).reshape(-1), data[t.name])
