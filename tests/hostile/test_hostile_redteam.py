"""Red-team variants nobody listed (issue 21, last step): each test here is a break
found by trying the promises of docs/threat-model.md against inputs and calls the other
hostile suites do not make. Each names the rule it holds and the one function keeping it.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ztensor


def _real_files(tmp_path):
    """The same two tensors written by each real writer that maps a file."""
    arrays = {"a": np.arange(50_000, dtype=np.float32), "b": np.ones(3, np.int32)}
    paths = {}
    st = pytest.importorskip("safetensors.numpy")
    paths["safetensors"] = tmp_path / "m.safetensors"
    st.save_file(arrays, paths["safetensors"])
    paths["npy"] = tmp_path / "m.npy"
    np.save(paths["npy"], arrays["a"])
    paths["npz"] = tmp_path / "m.npz"
    np.savez(paths["npz"], **arrays)
    torch = pytest.importorskip("torch")
    paths["pt"] = tmp_path / "m.pt"
    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, paths["pt"])
    gguf = pytest.importorskip("gguf")
    paths["gguf"] = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(paths["gguf"]), "llama")
    for k, v in arrays.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return paths


@pytest.mark.parametrize("kind", ["safetensors", "npy", "npz", "pt", "gguf"])
def test_mmap_false_is_honoured_by_every_foreign_reader(tmp_path, kind):
    """Reader(path, mmap=False) promises a FormatError, not a SIGBUS, when another
    process truncates the file while it is open (docs/safety.md). The foreign readers
    ignored the option and mapped the file anyway: the read below killed the process.
    Kept by foreign.open_foreign, which hands ``mmap`` to every reader's Source."""
    path = _real_files(tmp_path)[kind]
    code = textwrap.dedent(f"""
        import ztensor
        path = {str(path)!r}
        with ztensor.Reader(path, mmap=False) as r:
            names = list(r.keys())
            with open(path, "r+b") as f:
                f.truncate(0)
            try:
                for n in names:
                    r.read_numpy(n).sum()  # touch every byte
            except ztensor.FormatError as exc:
                print("refused:", exc)
            else:
                print("read")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    # the arrays were copies made at open (npz, pt) or reads that see the truncation
    assert res.stdout.startswith(("refused:", "read")), res.stdout
    if res.stdout.startswith("refused:"):
        assert str(path) in res.stdout


@pytest.mark.parametrize("kind", ["safetensors", "npy", "npz", "pt", "gguf"])
def test_mmap_false_reads_the_same_values(tmp_path, kind):
    path = _real_files(tmp_path)[kind]
    with ztensor.Reader(path) as mapped, ztensor.Reader(path, mmap=False) as read:
        assert sorted(mapped.keys()) == sorted(read.keys())
        for n in mapped.keys():
            np.testing.assert_array_equal(mapped.read_numpy(n), read.read_numpy(n))


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"


def test_no_terminal_escape_from_a_component_type_reaches_the_terminal(tmp_path):
    """A component's ``type`` is an open set (types this version does not know are
    kept), so a file may carry any string there; ``ztensor ls`` printed it raw in the
    DTYPE column (an OSC title change, a screen clear, a C1 CSI, an RTL override).
    Kept by cli._write_table, which passes every cell through cli._printable."""
    from ztensor.tensor import Tensor
    path = tmp_path / "t.zt"
    with ztensor.Writer(path) as w:
        w.write("x", Tensor({"data": np.zeros(4, np.uint8)}, types={"data": ESCAPES}))
    for command in (["ls"], ["stats"], ["info"], ["verify"], ["ls", "--json"]):
        res = subprocess.run([sys.executable, "-m", "ztensor", *command, str(path)],
                             capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        text = (res.stdout + res.stderr).decode()
        assert not any(c in text for c in "\x1b\x07\x9b\u202e"), (command, text)


def _checkpoint(tmp_path, weight_map):
    st = pytest.importorskip("safetensors.numpy")
    import json
    st.save_file({"a": np.ones(2, np.float32), "b": np.full(2, 7, np.float32)},
                 tmp_path / "s1.safetensors")
    st.save_file({"a": np.zeros(2, np.float32)}, tmp_path / "s2.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp_path


@pytest.mark.parametrize("weight_map", [
    {"a": "s1.safetensors"},                              # s1's 'b' is in no index entry
    {"a": "s2.safetensors", "b": "s1.safetensors"},       # s1 holds another 'a'
])
def test_open_sharded_drops_no_tensor_a_shard_holds(tmp_path, weight_map):
    """Nothing is dropped silently: open_sharded gave one tensor where the shards
    hold two ('b' unlisted, or an 'a' of other values in s1), while convert on the
    same directory writes both or refuses naming both shards. Kept by
    sharded.ShardedReader._open_checked: a shard holds exactly what the index places
    there."""
    folder = _checkpoint(tmp_path, weight_map)
    with pytest.raises(ztensor.FormatError, match="s1.safetensors"):
        with ztensor.open_sharded(folder) as r:
            for name in r.keys():
                r.read_numpy(name)


def test_convert_of_an_index_naming_a_missing_shard_is_a_clean_error(tmp_path):
    """open_sharded refuses an index naming a shard that is not there with a
    FormatError; convert of the same directory let a bare FileNotFoundError out.
    Kept by sharded.ShardedReader.open_shard, which conversion._plan_checkpoint now
    opens every shard through."""
    folder = _checkpoint(tmp_path, {"a": "S1.safetensors", "b": "s1.safetensors"})
    with pytest.raises(ztensor.FormatError, match="S1.safetensors"):
        ztensor.convert(folder, tmp_path / "out", force=True)
    assert not (tmp_path / "out").exists()


def test_an_hdf5_file_that_shrinks_while_open_is_an_error_not_zeros(tmp_path):
    """h5py reads the checked file object through Python calls and pads a short read
    with zeros: an HDF5 file truncated by another process while open read as wrong
    values, silently (with mmap=False or not: h5py never maps). Kept by
    source.ShrinkCheckedFile, the file object h5py is handed."""
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.arange(100_000, dtype=np.float32)
    with ztensor.Reader(path) as r:
        with open(path, "r+b") as f:
            f.truncate(4096)
        with pytest.raises(ztensor.FormatError, match="shrank") as info:
            r.read_numpy("a")
        assert info.value.path == str(path)


def test_an_hdf5_file_that_grows_while_open_still_reads(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "m.h5"
    with h5py.File(path, "w") as f:
        f["a"] = np.arange(1000, dtype=np.float32)
    with ztensor.Reader(path) as r:
        with open(path, "ab") as f:
            f.write(b"\0" * 100_000)
        np.testing.assert_array_equal(r.read_numpy("a"), np.arange(1000, dtype=np.float32))


def test_no_terminal_escape_from_a_file_name_reaches_the_terminal(tmp_path):
    """A file name is input too (a downloaded checkpoint folder, a shell glob):
    ``verify`` and error lines showed it escaped, but ``info``, ``convert`` and
    ``dequantize`` printed it raw. Kept by cli._printable, applied by cmd_info and
    cli._report (every summary line)."""
    src = tmp_path / "x\x1b]0;pwned\x07\x9b2J.zt"
    with ztensor.Writer(src) as w:
        w.write_numpy("a", np.zeros(3, np.float32))
    runs = [["info", str(src)],
            ["convert", str(src), str(tmp_path / "o\x1b[31m.safetensors")],
            ["dequantize", str(src), str(tmp_path / "d\x1b[31m.zt")]]
    for command in runs:
        res = subprocess.run([sys.executable, "-m", "ztensor", *command],
                             capture_output=True, timeout=60)
        assert res.returncode == 0, res.stderr
        text = (res.stdout + res.stderr).decode()
        assert "pwned" in text or "o\\x1b" in text
        assert not any(c in text for c in "\x1b\x07\x9b"), (command, text)


def test_an_npy_file_is_held_to_max_objects_like_every_format(tmp_path):
    """``Limits(max_objects=0)`` refused every format's tensors but a ``.npy`` file's
    one array. Kept by numpy_files.open_npy (an .npy holds exactly one object)."""
    path = tmp_path / "m.npy"
    np.save(path, np.arange(3))
    with pytest.raises(ztensor.LimitError, match="max_objects"):
        ztensor.Reader(path, limits=ztensor.Limits(max_objects=0))
    with ztensor.Reader(path, limits=ztensor.Limits(max_objects=1)) as r:
        assert r.read_numpy("m").tolist() == [0, 1, 2]
