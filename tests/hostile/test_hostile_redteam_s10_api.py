"""Issue 21, last red-team round on the public API's lifetimes and entry points:
handles copied, pickled or used after close, and the reference API (open, Writer,
safe_open, serialize) given hostile inputs.  Real files from the real writers; each
test fails without its fix."""
import copy
import gc
import pickle

import numpy as np
import pytest

import ztensor
from ztensor import safe_open

COPIERS = {
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "pickle": pickle.dumps,
}


def _file(tmp_path):
    path = str(tmp_path / "m.zt")
    with ztensor.Writer(path) as w:
        w.add("a", np.arange(6, dtype=np.float32))
    return path


# ------------------------------------------------- handles are not copied or pickled
# A shallow copy of a Reader shared its file, and the copy's __del__ closed it: the
# original then raised ClosedError on its next read.  A Writer's copy aborted the
# shared descriptor, and the original raised a bare OSError (EBADF) closing a
# descriptor number another file may since have been given.  pickle raised a bare
# TypeError about a lock (errors.refuse_copy, from each handle's __reduce_ex__).
@pytest.mark.parametrize("how", sorted(COPIERS))
def test_a_reader_is_not_copied_and_keeps_its_file(tmp_path, how):
    path = _file(tmp_path)
    with ztensor.Reader(path) as r:
        with pytest.raises(ztensor.UnsupportedError, match="cannot be copied") as info:
            COPIERS[how](r)
        assert info.value.path == path
        gc.collect()
        np.testing.assert_array_equal(r.read_numpy("a"), np.arange(6, dtype=np.float32))


@pytest.mark.parametrize("how", sorted(COPIERS))
def test_a_writer_is_not_copied_and_still_writes(tmp_path, how):
    path = str(tmp_path / "w.zt")
    with ztensor.Writer(path) as w:
        with pytest.raises(ztensor.UnsupportedError, match="cannot be copied") as info:
            COPIERS[how](w)
        assert info.value.path == path
        gc.collect()
        w.add("b", np.arange(3, dtype=np.int64))
    with ztensor.Reader(path) as r:
        np.testing.assert_array_equal(r.read_numpy("b"), np.arange(3))


@pytest.mark.parametrize("how", sorted(COPIERS))
def test_a_safe_open_handle_is_not_copied(tmp_path, how):
    path = _file(tmp_path)
    with safe_open(path, framework="np") as f:
        with pytest.raises(ztensor.UnsupportedError, match="cannot be copied") as info:
            COPIERS[how](f)
        assert info.value.path == path
        np.testing.assert_array_equal(f.get_tensor("a"), np.arange(6, dtype=np.float32))


# ----------------------------------------------------- dask: one array, one file
# Each chunk looked the file up as it was now, and only a change of shape or dtype
# was refused: a rewrite of the same shape between two chunks of one compute gave one
# array of two files' values (dask._read now holds every chunk to the identity the
# array was made with).
def test_dask_array_is_never_two_files(tmp_path):
    da = pytest.importorskip("dask.array")
    from dask.callbacks import Callback

    import ztensor.dask

    path = str(tmp_path / "d.zt")
    old = np.arange(64, dtype=np.float32).reshape(8, 8)
    with ztensor.Writer(path) as w:
        w.add("w", old)
    arr = ztensor.dask.from_zt(path, "w", rows=2)
    assert arr.numblocks[0] == 4

    done = []

    class RewriteAfterFirstChunk(Callback):
        def _posttask(self, key, result, dsk, state, id):
            if not done and isinstance(result, np.ndarray) and result.shape == (2, 8):
                done.append(key)
                with ztensor.Writer(path) as w:
                    w.add("w", -old)

    with RewriteAfterFirstChunk(), pytest.raises(ztensor.ClosedError, match="changed") as info:
        da.concatenate([arr]).compute(scheduler="synchronous")
    assert done and path in str(info.value) and "'w'" in str(info.value)
    # a new array reads the new file whole
    np.testing.assert_array_equal(
        ztensor.dask.from_zt(path, "w", rows=2).compute(scheduler="synchronous"), -old
    )


# ------------------------------------- a view's contiguous copy: memory is a limit
# The Writer copied a non-contiguous array whole before writing it: a stride-0 view
# (np.broadcast_to; a 1.5 KB torch.save of x.expand(...), which `ztensor dequantize`
# copies through) raised a bare MemoryError ("Unable to allocate 512 GiB") out of the
# library; the command said "MemoryError: ...". Now a LimitError naming the object
# (writer.Writer._prepare), and the writer goes on.
HUGE = 2**37  # float32 elements: 512 GiB, past any test machine's memory


def test_writer_copy_of_a_huge_view_is_a_limit_error(tmp_path):
    path = str(tmp_path / "w.zt")
    view = np.broadcast_to(np.zeros(1, np.float32), (HUGE,))
    with ztensor.Writer(path) as w:
        with pytest.raises(ztensor.LimitError, match="not enough memory") as info:
            w.add("x", view)
        assert info.value.path == path and info.value.obj == "x"
        w.add("y", np.arange(3, dtype=np.float32))
    with ztensor.Reader(path) as r:
        assert r.keys() == ["y"]


def test_dequantize_of_a_stride_zero_checkpoint_is_one_line(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    from ztensor.tools import cli

    src, out = str(tmp_path / "e.pt"), str(tmp_path / "out.zt")
    torch.save({"x": torch.zeros(1).expand(HUGE)}, src)
    assert cli.main(["dequantize", src, out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MemoryError" not in err
    # refused for the disk's room before anything is written (convert.require_room_for_zt,
    # session 16), or, on a disk with room for it, for the memory it needs, naming it
    assert ("its disk has" in err and "out.zt" in err) or ("'x'" in err and "not enough memory" in err)
    assert not [p for p in tmp_path.iterdir() if p.name != "e.pt"]


# torch's own contiguous copy, made before the Writer saw the tensor, raised a bare
# RuntimeError from torch's allocator; the tensor now reaches the writer with its
# strides (torch_bridge.to_numpy_for_writing) and the one copy is Writer._prepare's.
def test_torch_save_of_a_huge_view_is_a_limit_error(tmp_path):
    torch = pytest.importorskip("torch")
    import ztensor.torch

    view = torch.zeros(1).expand(HUGE)
    path = str(tmp_path / "t.zt")
    with pytest.raises(ztensor.LimitError, match="not enough memory") as info:
        ztensor.torch.save_file({"x": view}, path)
    assert info.value.obj == "x" and info.value.path == path
    assert not list(tmp_path.iterdir())
    with pytest.raises(ztensor.LimitError, match="not enough memory"):
        ztensor.torch.save({"x": view})


def test_torch_strided_views_store_the_elements_they_show():
    torch = pytest.importorskip("torch")
    import ztensor.torch

    a = torch.arange(24.0).reshape(4, 6)
    views = {
        "t": a.t(),
        "step": a.clone()[:, ::2],
        "expand": torch.arange(3.0).reshape(3, 1).expand(3, 5),
        "bf16": a.to(torch.bfloat16).t(),
        "fp8": a.to(torch.float8_e4m3fn)[:, 1::2],
        "conj": (a + 1j * a).to(torch.complex64).t().conj(),
    }
    got = ztensor.torch.load(ztensor.torch.save(views))
    for name, view in views.items():
        assert got[name].dtype == view.dtype and got[name].shape == view.shape, name
        want = view.resolve_conj().contiguous().view(torch.uint8)
        assert torch.equal(got[name].view(torch.uint8), want), name


# Two views of one storage, one of them transposed or stepped: the shared-memory
# check measured a view's extent with view(-1), a bare RuntimeError for a view that
# is not contiguous (torch._end_ptr); now the FormatError that names them.
def test_torch_save_of_strided_views_sharing_memory_is_a_format_error():
    torch = pytest.importorskip("torch")
    import ztensor.torch

    a = torch.arange(24.0).reshape(4, 6)
    with pytest.raises(ztensor.FormatError, match="share memory") as info:
        ztensor.torch.save({"t": a.t(), "step": a[:, ::2]})
    assert "'t'" in str(info.value) and "'step'" in str(info.value)
    # views of one storage that do not overlap are stored apart, as before
    got = ztensor.torch.load(ztensor.torch.save({"top": a[:2].t(), "bottom": a[2:, ::2]}))
    assert torch.equal(got["top"], a[:2].t()) and torch.equal(got["bottom"], a[2:, ::2])


# ------------------------------------------------------------- read_into targets
# A destination two of whose elements share memory was "filled": each element
# written over another, read_into returned, the values wrong (numpy as_strided,
# writable); torch's expand raised a bare RuntimeError after the read. A parameter
# (requires_grad) raised torch's bare RuntimeError from .numpy(). One check for both
# kinds (into._require_distinct_elements); a parameter is filled through its memory.
def _m(tmp_path):
    path = str(tmp_path / "m.zt")
    want = np.arange(12, dtype=np.float32).reshape(6, 2)
    with ztensor.Writer(path) as w:
        w.add("m", want)
    return path, want


@pytest.mark.parametrize("strides", [(0, 4), (4, 4), (8, 0), (4, 8)])
def test_read_into_a_destination_sharing_memory_is_refused(tmp_path, strides):
    path, want = _m(tmp_path)
    base = np.zeros(64, np.float32)
    dst = np.lib.stride_tricks.as_strided(base, shape=(6, 2), strides=strides)
    assert dst.flags.writeable
    with ztensor.Reader(path) as r, pytest.raises(ValueError, match="share memory"):
        r.read_into("m", dst)


def test_read_into_strided_destinations_that_do_not_overlap_fill(tmp_path):
    path, want = _m(tmp_path)
    with ztensor.Reader(path) as r:
        for dst in (
            np.empty((2, 6), np.float32).T,
            np.empty((6, 4), np.float32)[:, ::2],
            np.empty((12, 2), np.float32)[::-2],
            np.empty((6, 1, 2), np.float32)[:, 0, :],
        ):
            r.read_into("m", dst)
            np.testing.assert_array_equal(dst, want)


def test_read_into_torch_expanded_and_parameter_destinations(tmp_path):
    torch = pytest.importorskip("torch")
    path, want = _m(tmp_path)
    with ztensor.Reader(path) as r:
        with pytest.raises(ValueError, match="share memory"):
            r.read_into("m", torch.zeros(1, 2).expand(6, 2))
        param = torch.nn.Parameter(torch.zeros(6, 2))
        r.read_into("m", param)
        assert param.requires_grad and torch.equal(param.detach(), torch.from_numpy(want))
        strided = torch.zeros(2, 6, requires_grad=True).t()
        r.read_into("m", strided)
        assert torch.equal(strided.detach(), torch.from_numpy(want))


# threads= is the caller's count: the batch copy cut its spans into that many jobs,
# an array of that size first (threads=10**9 killed the process; 2**62 was a
# LimitError for a read of 8 bytes). batch._split makes no more jobs than spans.
def test_batch_read_with_a_huge_thread_count_is_bounded(tmp_path):
    path = str(tmp_path / "b.zt")
    with ztensor.Writer(path) as w:
        for i in range(4):
            w.add(f"t{i}", np.arange(3, dtype=np.float32) + i)
    with ztensor.Reader(path) as r:
        got = r.read_numpy([f"t{i}" for i in range(4)], copy=True, threads=2**62)
    for i in range(4):
        np.testing.assert_array_equal(got[f"t{i}"], np.arange(3, dtype=np.float32) + i)
