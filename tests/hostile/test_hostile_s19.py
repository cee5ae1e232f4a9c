"""Session 19: what helpers 15 and 16 found (checkpoint saves, foreign readers).
Each test names the one function that keeps its rule."""
import os
import struct

import numpy as np
import pytest
from killed_saves import killed_save

import ztensor
from ztensor.io import checkpoint_moves


# ------------------------------------------------------------------ helper 16's probe
@pytest.mark.parametrize(
    "shape, dtype", [((0, 2**62), np.uint8), ((0, 2**60), np.float32), ((2**61, 0), np.int16)]
)
def test_the_writer_and_the_reader_agree_on_empty_arrays_numpy_holds(tmp_path, shape, dtype):
    """Rule: formats/dense.check_entry holds a shape to one array of the element type
    a read gives (objects.shape_problem with that width): with 16 bytes for any type
    the Writer finished a file holding np.zeros((0, 2**62), uint8), which numpy makes,
    and the Reader then refused the whole file."""
    path = tmp_path / "z.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("z", np.zeros(shape, dtype))
        w.write_numpy("a", np.arange(3))
    with ztensor.Reader(str(path)) as r:
        got = r.read_numpy("z")  # little-endian as stored, on a big-endian host too
        assert got.shape == shape and got.dtype.newbyteorder("=") == np.dtype(dtype)
        assert r.read_numpy("a").tolist() == [0, 1, 2]


@pytest.mark.parametrize("shape, dtype", [((0, 2**61), "float64"), ((2**62, 0), "int16")])
def test_a_shape_no_array_of_its_type_can_hold_is_refused_by_the_writer(tmp_path, shape, dtype):
    """The same rule from the other side: numpy makes no (0, 2**61) float64 array
    (2**64 bytes), so neither the Writer nor the Reader takes the shape."""
    path = tmp_path / "z.zt"
    with pytest.raises(ztensor.ZTensorError, match="2\\*\\*63"):
        with ztensor.Writer(str(path)) as w:
            w.stream("z", shape, dtype).close()
    assert not path.exists()


def test_an_onnx_name_that_is_not_utf8_is_refused_when_the_file_is_opened(tmp_path):
    """Rule: foreign/names.NameTable.claim takes text only: ONNX (proto2) hands a
    name that is not UTF-8 out as bytes, which became a key no read could find."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    init = numpy_helper.from_array(np.arange(4, dtype=np.float32), name="AAAA")
    model = helper.make_model(helper.make_graph([], "g", [], [], initializer=[init]))
    path = tmp_path / "bytes.onnx"
    path.write_bytes(model.SerializeToString().replace(b"AAAA", b"A\xff\xfeA"))
    with pytest.raises(ztensor.FormatError, match="is not text") as caught:
        ztensor.Reader(str(path))
    assert str(path) in str(caught.value)
    assert onnx is not None


def _text(x: str) -> bytes:
    return struct.pack("<Q", len(x)) + x.encode()


def _gguf(kv: bytes, n_kv: int, tensors: bytes, n_tensors: int, data: bytes) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv + tensors
    return head + b"\0" * (-len(head) % 32) + data


def test_gguf_key_value_arrays_are_held_to_a_count_of_items(tmp_path):
    """Rule: gguf_file._Cursor.value counts every array's items against
    MAX_ARRAY_ITEMS: each becomes a Python object at open (100 MB of one array held
    1.1 GB for an ls); a tokenizer-sized array is read as ever."""
    from ztensor.foreign import gguf_file

    info = _text("t") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 0)
    data = np.ones(4, "<f4").tobytes()  # every byte on disk is little-endian

    def array_kv(key, count):
        return _text(key) + struct.pack("<IIQ", 9, 0, count) + bytes(count)  # UINT8 items

    small = tmp_path / "small.gguf"
    small.write_bytes(_gguf(array_kv("vocab.types", 300_000), 1, info, 1, data))
    with ztensor.Reader(str(small)) as r:
        assert len(r.attributes["gguf.vocab.types"]) == 300_000
        assert r.read_numpy("t").tolist() == [1.0] * 4
    half = gguf_file.MAX_ARRAY_ITEMS // 2 + 1  # two arrays: each under, both over
    big = tmp_path / "big.gguf"
    big.write_bytes(_gguf(array_kv("a", half) + array_kv("b", half), 2, info, 1, data))
    with pytest.raises(ztensor.LimitError, match="items in all") as caught:
        ztensor.Reader(str(big))
    assert str(big) in str(caught.value)


def test_overlapping_views_are_held_to_a_multiple_of_the_stored_bytes(tmp_path):
    """Rule: pytorch._check_visits: four as_strided (1, 1) views of one
    128 KB storage (133 KB of file) made stats read 4 GB; real aliasing (tied
    weights, a projection split in three, an expand) still loads, values and all."""
    torch = pytest.importorskip("torch")
    base = torch.arange(3 * 64 * 64, dtype=torch.float32).reshape(3 * 64, 64)
    q, k, v = base.split(64)
    fine = tmp_path / "fine.pt"
    torch.save(
        {"qkv": base, "q": q, "k": k, "v": v, "tied": base, "t": base.t(),
         "wide": torch.ones(1).expand(2**30)},
        fine,
    )
    with ztensor.Reader(str(fine)) as r:
        for name, want in (("q", q), ("v", v), ("t", base.t()), ("tied", base)):
            np.testing.assert_array_equal(r.read_numpy(name), want.numpy())
    storage = torch.rand(2**15 + 8)
    views = {f"v{i}": storage.as_strided((2**13, 2**13), (1, 1), i) for i in range(3)}
    over = tmp_path / "over.pt"
    torch.save(views, over)  # 3 x 256 MB read from 128 KB
    with pytest.raises(ztensor.LimitError, match="64 times") as caught:
        ztensor.Reader(str(over))
    assert str(over) in str(caught.value)


# ------------------------------------------------------------------ helper 15's probe
def _save(folder, value, names="abc", max_shard_size=16):
    ztensor.save_sharded(
        {k: np.full(4, value, "f4") for k in names}, str(folder), max_shard_size=max_shard_size
    )


def _read_all(folder):
    with ztensor.open_sharded(str(folder)) as ck:
        return {k: float(ck.read_numpy(k)[0]) for k in sorted(ck.keys())}


def test_an_index_linked_to_the_record_s_name_is_replaced_not_written_through(tmp_path):
    """Rule: checkpoint_moves._destination (_reserved): a checkpoint file that is a
    link to a name of this module's own (the record, its temporary files, staging
    folders, links aside) is replaced: the new index was written through a link to
    .ztensor-moving.json, overwritten by the record and removed with it, and the
    save said OK over a checkpoint with no index."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    for target in (".ztensor-moving.json", ".ztensor-moving.json.abc.tmp"):
        index = folder / "model.zt.index.json"
        os.unlink(index)
        os.symlink(target, index)
        _save(folder, 2.0)
        assert not os.path.islink(index)
        assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}
        _save(folder, 3.0)  # the next save's recovery keeps it
        assert _read_all(folder) == {"a": 3.0, "b": 3.0, "c": 3.0}
    assert [n for n in os.listdir(folder) if n.startswith(".")] == []


def test_a_new_file_linked_to_an_old_shard_the_save_drops_is_kept(tmp_path):
    """Rule: checkpoint_moves.move_staged removes no file a new one is moved onto:
    shard 1 of a new two-shard save, a link to the old third shard, was written
    through the link and then removed as an old shard."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)  # three shards
    first = folder / "model-00001-of-00002.zt"
    os.symlink("model-00003-of-00003.zt", first)
    _save(folder, 2.0, max_shard_size=32)  # two shards
    assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills a child process")
@pytest.mark.parametrize("old_whole", [False, True])
def test_a_save_killed_after_its_last_move_leaves_no_old_file(tmp_path, old_whole):
    """Rule: checkpoint_moves._replace_all writes what goes (``gone``) in its first
    record: a save killed after its last rename, before the record said the moves
    were done, left the old checkpoint's extra shards (or its one whole model.zt,
    and a folder refused as holding two checkpoints) beside the new index."""
    folder = tmp_path / "ck"
    if old_whole:
        folder.mkdir()
        with ztensor.Writer(str(folder / "model.zt")) as w:
            for k in "abc":
                w.write_numpy(k, np.full(4, 1.0, "f4"))
    else:
        _save(folder, 1.0)  # three shards
    rule = 'os.path.basename(dst) == ".ztensor-moving.json"'
    # killed at the record of complete moves
    assert killed_save(folder, 2.0, rule, 2, max_shard_size=32) == 9
    with checkpoint_moves.staged(str(folder)):  # the next save's first step: recovery
        pass
    assert sorted(os.listdir(folder)) == [
        "model-00001-of-00002.zt", "model-00002-of-00002.zt", "model.zt.index.json"
    ]
    assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}


def test_a_folder_is_never_moved_aside(tmp_path):
    """Rule: checkpoint_moves._link_aside renames only files and links where no hard
    link can be made: a folder swapped in for a shard during a save was renamed to a
    hidden name and left there for good."""
    folder = tmp_path / "shard.zt"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        checkpoint_moves._link_aside(str(folder), str(tmp_path / ".0123456789ab.old"))
    assert folder.is_dir() and sorted(os.listdir(tmp_path)) == ["shard.zt"]


def test_a_folder_at_the_record_s_name_is_a_write_error_naming_it(tmp_path):
    """Rule: checkpoint_moves._write_journal names the record when it cannot be
    written (a folder there, from a clone): the error blamed the folder."""
    folder = tmp_path / "ck"
    _save(folder, 1.0)
    (folder / ".ztensor-moving.json").mkdir()
    with pytest.raises(ztensor.WriteError, match="record of this save") as caught:
        _save(folder, 2.0)
    assert caught.value.path == str(folder / ".ztensor-moving.json")
    assert _read_all(folder) == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_the_config_walk_visits_each_container_once():
    """Rule: transformers._every_key: a ``config=`` object is Python's, not JSON: a
    list holding itself looped for ever, forty lists each holding the next twice
    took 2**40 steps."""
    pytest.importorskip("torch")
    from ztensor import transformers as ztf

    cyclic: list = [{"a": 1}]
    cyclic.append(cyclic)
    assert list(ztf._every_key({"x": cyclic})) == [("x", cyclic), ("a", 1)]
    shared: list = [{"quantization_config": {}}]
    for _ in range(40):
        shared = [shared, shared]
    keys = [k for k, _ in ztf._every_key({"layers": shared})]
    assert keys == ["layers", "quantization_config"]


# ------------------------------------------------------------------ this session's fuzzing
def test_a_stride_zero_bool_view_with_other_bytes_stays_a_view(tmp_path):
    """Rule: io/values.clean_bools (through values.elementwise) cleans a view's
    distinct bytes only: a PyTorch bool tensor of 2 x 2**31 elements over a 48-byte
    storage whose bytes are not all 0 or 1 (an expand) was made a 4 GB array by
    read_numpy (fuzz_foreign_structured, out of memory)."""
    torch = pytest.importorskip("torch")
    storage = torch.tensor([0, 2, 1, 7], dtype=torch.uint8).view(torch.bool)
    path = tmp_path / "bools.pt"
    torch.save({"b": storage.as_strided((2, 2**28), (1, 0), 1)}, path)
    with ztensor.Reader(str(path)) as r:
        got = r.read_numpy("b")
    assert got.shape == (2, 2**28) and got.dtype == np.bool_ and 0 in got.strides
    assert got[:, :3].tolist() == [[True] * 3, [True] * 3]
    assert got[:, -1].tolist() == [True, True]


def test_elementwise_work_follows_the_distinct_elements():
    """Rule: io/values.elementwise: bf16/FP8 decoding without ml_dtypes and bool
    cleaning of a view that repeats elements decode each stored element once and
    broadcast the result; any other array is decoded whole."""
    from ztensor.io import values

    seen = []

    def decode(a):
        seen.append(a.size)
        return a.astype(np.float32) * 2

    repeated = np.broadcast_to(np.arange(3, dtype=np.uint16)[:, None], (3, 2**30))
    out = values.elementwise(decode, repeated)
    assert seen == [3] and out.shape == (3, 2**30) and out[2, 12345] == 4.0
    plain = np.arange(6, dtype=np.uint16).reshape(2, 3)
    assert values.elementwise(decode, plain).tolist() == [[0, 2, 4], [6, 8, 10]]
    assert seen == [3, 6]
    bools = np.broadcast_to(np.array([0, 2], np.uint8)[:, None], (2, 2**30)).view(np.bool_)
    cleaned = values.clean_bools(bools)
    assert cleaned.view(np.uint8)[:, 7].tolist() == [0, 1] and 0 in cleaned.strides


# ------------------------------------------------------------------ helper 17's review
def test_a_storage_s_declared_size_lifts_no_budget(tmp_path):
    """Rule: pytorch._check_visits counts a storage's bytes as its member holds
    them: a bare reference declaring 2**40 elements of a 4-byte member, before
    overlapping views, lifted the budget for every view after it."""
    import collections
    import io
    import pickle
    import zipfile

    torch = pytest.importorskip("torch")

    class Ref:
        def __init__(self, key, numel):
            self.key, self.numel = key, numel

    class View:
        def __init__(self, ref, offset):
            self.ref, self.offset = ref, offset

        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2,
                    (self.ref, self.offset, (2**13, 2**13), (1, 1), False,
                     collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, Ref):
                return ("storage", torch.FloatStorage, obj.key, "cpu", obj.numel)
            return None

    n = 2**15 + 8
    shared = Ref("0", n)
    obj = collections.OrderedDict(junk=Ref("1", 2**40))
    for i in range(3):
        obj[f"v{i}"] = View(shared, i)
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(obj)
    path = tmp_path / "bare.pt"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", bytes(4 * n))
        z.writestr("archive/data/1", bytes(4))
        z.writestr("archive/version", "3\n")
    with pytest.raises(ztensor.LimitError, match="64 times"):
        ztensor.Reader(str(path))


def test_an_index_linked_to_the_old_whole_file_is_replaced(tmp_path):
    """Rule: checkpoint_moves._destination (``avoid``): a link to another file of
    the checkpoint replaced is itself replaced: the new index, written through a link
    to the old whole model.zt, landed in it, and the folder read as no checkpoint."""
    folder = tmp_path / "ck"
    folder.mkdir()
    with ztensor.Writer(str(folder / "model.zt")) as w:
        for k in "abc":
            w.write_numpy(k, np.full(4, 1.0, "f4"))
    os.symlink("model.zt", folder / "model.zt.index.json")
    _save(folder, 2.0)
    assert not (folder / "model.zt").exists()
    assert not os.path.islink(folder / "model.zt.index.json")
    assert _read_all(folder) == {"a": 2.0, "b": 2.0, "c": 2.0}


def test_a_reservation_that_fails_part_way_leaves_no_blocks(tmp_path, monkeypatch):
    """Rule: atomic.replace_atomically truncates the file to its length whenever a
    reservation was asked for: a fallocate that failed part way (ENOSPC) keeps the
    blocks it had, and they stayed past the file's end for good."""
    import ctypes
    import ctypes.util

    from ztensor import kernels
    from ztensor.io import atomic

    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    if not hasattr(libc, "fallocate"):
        pytest.skip("no fallocate(2) here")
    kept = []

    def partly(fd, nbytes):
        # blocks past the end, the size unchanged (FALLOC_FL_KEEP_SIZE), as a
        # reservation that stopped part way leaves them; then "failed"
        done = libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(8 << 20)) == 0
        kept.append(done and os.fstat(fd).st_blocks * 512 >= 8 << 20)
        return False

    monkeypatch.setattr(kernels, "reserve_ahead", partly)
    path = str(tmp_path / "out.bin")
    atomic.replace_atomically(path, lambda f: f.write(b"abc"), size=1 << 20)
    with open(path, "rb") as f:
        assert f.read() == b"abc"
    if not kept[0]:
        pytest.skip("this filesystem keeps no blocks past a file's end")
    assert os.stat(path).st_blocks * 512 <= 64 << 10


def test_an_onnx_subgraph_name_that_is_not_utf8_is_a_format_error(tmp_path):
    """Rule: onnx_file._text for every name the subgraph walk lists: a Constant
    node's output there that is not UTF-8 gave a bare TypeError."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    const = helper.make_node("Constant", [], ["QQQQ"], value_float=1.0)
    branch = helper.make_graph(
        [const], "b", [], [helper.make_tensor_value_info("QQQQ", TensorProto.FLOAT, [])]
    )
    node = helper.make_node("If", ["c"], ["o"], then_branch=branch, else_branch=branch)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [])],
    )
    path = tmp_path / "sub.onnx"
    raw = helper.make_model(graph).SerializeToString().replace(b"QQQQ", b"Q\xff\xfeQ")
    path.write_bytes(raw)
    with pytest.raises(ztensor.FormatError, match="not UTF-8") as caught:
        ztensor.Reader(str(path))
    assert str(path) in str(caught.value)
