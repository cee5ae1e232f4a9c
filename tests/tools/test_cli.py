"""The ztensor command: ls and info, text and JSON, and one-line errors."""
import io
import json
import subprocess
import sys

import numpy as np
import pytest

import ztensor
from conftest import DATA
from ztensor.tools.cli import main


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.zt"
    with ztensor.Writer(path, attributes={"license": "MIT"}) as w:
        w.write_numpy("embed", np.zeros((10, 4), np.float16), compress=True, checksum="crc32c")
        w.write_numpy("c", np.zeros(3, np.complex64))
    return path


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_ls_table(model):
    code, text = run("ls", str(model))
    lines = text.splitlines()
    assert code == 0 and lines[0].split() == ["NAME", "FORMAT", "SHAPE", "DTYPE", "ENCODING", "SIZE"]
    assert lines[1].split()[:3] == ["c", "dense", "[3]"] and "f32/complex64" in lines[1]
    assert lines[2].split()[:2] == ["embed", "dense"] and "[10, 4]" in lines[2] and "zstd" in lines[2]


def test_ls_and_info_json(model):
    code, text = run("ls", "--json", str(model))
    rows = json.loads(text)
    assert code == 0 and [r["name"] for r in rows] == ["c", "embed"]
    assert rows[0]["stored_bytes"] == 24 and rows[1]["dtype"] == "f16"
    code, text = run("info", "--json", str(model))
    info = json.loads(text)
    assert info["version"] == "1.2.0" and info["objects"] == 2 and info["digests"] == 1
    assert info["decoded_bytes"] == 24 + 80 and info["attributes"] == {"license": "MIT"}


def test_info_text(model):
    code, text = run("info", str(model))
    assert code == 0 and "version:     1.2.0" in text and 'license: "MIT"' in text


def test_bad_file_is_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.zt"
    bad.write_bytes(b"ZTEN1000" + bytes(40))
    assert main(["ls", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err and "Traceback" not in err
    assert main(["info", str(tmp_path / "missing.zt")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_console_entry_and_module(model):
    proc = subprocess.run([sys.executable, "-m", "ztensor", "ls", str(model)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "embed" in proc.stdout


# ------------------------------------------------------------------ verify / convert / diff
def test_verify_ok_and_corrupt(model, tmp_path):
    code, text = run("verify", str(model))
    assert code == 0 and text.endswith("2 objects, 1 digests checked: OK\n")
    with ztensor.Reader(model) as r:
        comp = r.metadata("embed").components["data"]
    data = bytearray(model.read_bytes())
    data[comp.offset + 5] ^= 0xFF
    bad = tmp_path / "bad.zt"
    bad.write_bytes(bytes(data))
    code, text = run("verify", "--json", str(bad))
    result = json.loads(text)
    assert code == 1 and not result["ok"] and "'embed'" in result["problems"][0]


def safetensors_bytes(tensors, metadata=None):
    """A .safetensors file built by hand from its format description."""
    import struct
    header, blobs, offset = {}, b"", 0
    names = {np.dtype("<f4"): "F32", np.dtype("<i8"): "I64", np.dtype("<f2"): "F16"}
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs += raw
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blobs


def test_convert_safetensors_npz_npy_and_zt(tmp_path):
    tensors = {"w": np.arange(12, dtype="<f4").reshape(3, 4), "step": np.array([7], "<i8")}
    (tmp_path / "m.safetensors").write_bytes(safetensors_bytes(tensors, {"source": "hand"}))
    np.savez(tmp_path / "m.npz", **tensors)
    np.save(tmp_path / "w.npy", tensors["w"])
    for src in ("m.safetensors", "m.npz", "w.npy"):
        out = tmp_path / (src + ".zt")
        code, _ = run("convert", str(tmp_path / src), str(out), "--compress", "--checksum",
                      "sha256", "--quiet")
        assert code == 0
        with ztensor.Reader(out, verify=True) as r:
            np.testing.assert_array_equal(r["w"], tensors["w"])
            assert r.metadata("w").components["data"].encoding == "zstd"
            if src == "m.safetensors":
                assert r.attributes == {"source": "hand"} and r["step"].tolist() == [7]
    # v0.1 -> v1.2
    legacy = DATA / "ref-0.1.4" / "dense.zt"
    code, _ = run("convert", str(legacy), str(tmp_path / "new.zt"), "-q")
    with ztensor.Reader(tmp_path / "new.zt") as r, ztensor.Reader(legacy) as old:
        assert code == 0 and r.version == "1.2.0" and r.keys() == sorted(old.keys())
        for name in old.keys():
            np.testing.assert_array_equal(r[name], old[name])


def test_convert_never_overwrites_without_force(tmp_path, capsys):
    np.save(tmp_path / "a.npy", np.ones(3))
    (tmp_path / "out.zt").write_bytes(b"keep")
    assert main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "out.zt")]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "out.zt").read_bytes() == b"keep"
    assert main(["convert", str(tmp_path / "a.npy"), str(tmp_path / "out.zt"), "--force",
                 "-q"]) == 0
    with ztensor.Reader(tmp_path / "out.zt") as r:
        assert r["a"].tolist() == [1, 1, 1]


def test_convert_refuses_pickles_and_lying_safetensors(tmp_path, capsys):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert main(["convert", str(tmp_path / "obj.npy"), str(tmp_path / "o.zt")]) == 2
    assert "Traceback" not in capsys.readouterr().err
    data = bytearray(safetensors_bytes({"w": np.ones(4, "<f4")}))
    data[8:] = data[8:].replace(b"[0, 16]", b"[0, 99]")
    (tmp_path / "lie.safetensors").write_bytes(bytes(data))
    assert main(["convert", str(tmp_path / "lie.safetensors"), str(tmp_path / "l.zt")]) == 2
    assert "data_offsets" in capsys.readouterr().err and not (tmp_path / "l.zt").exists()


def test_convert_file_written_by_safetensors(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"a": np.arange(6, dtype=np.float16).reshape(2, 3), "b": np.ones(4, np.int32)}
    st.save_file(tensors, str(tmp_path / "peer.safetensors"), metadata={"k": "v"})
    assert run("convert", str(tmp_path / "peer.safetensors"), str(tmp_path / "p.zt"), "-q")[0] == 0
    with ztensor.Reader(tmp_path / "p.zt") as r:
        assert r.attributes == {"k": "v"}
        for k, v in tensors.items():
            np.testing.assert_array_equal(r[k], v)


def test_dequantize_command(tmp_path):
    q = ztensor.quantize(np.linspace(-1, 1, 64 * 128, dtype=np.float32).reshape(64, 128),
                         group_size=64)
    with ztensor.Writer(tmp_path / "q.zt") as w:
        w.write("proj", q)
        w.write_numpy("bias", np.ones(64, np.float32))
    code, text = run("dequantize", str(tmp_path / "q.zt"), str(tmp_path / "d.zt"), "--dtype",
                     "float32", "--json")
    assert code == 0 and json.loads(text)["dequantized"] == 1
    with ztensor.Reader(tmp_path / "d.zt") as r:
        assert r.metadata("proj").format == "dense"
        np.testing.assert_array_equal(r["proj"], ztensor.dequantize(q, dtype=np.float32))
        assert r["bias"].tolist() == [1.0] * 64


def test_diff(tmp_path):
    with ztensor.Writer(tmp_path / "a.zt") as w:
        w.write_numpy("same", np.arange(4))
        w.write_numpy("gone", np.ones(2))
        w.write_numpy("vals", np.array([1.0, 2.0, 3.0]))
        w.write_numpy("shape", np.ones((2, 2)))
    with ztensor.Writer(tmp_path / "b.zt") as w:
        w.write_numpy("same", np.arange(4), compress=True)   # same values, other encoding
        w.write_numpy("new", np.ones(2))
        w.write_numpy("vals", np.array([1.0, 2.5, 3.0]))
        w.write_numpy("shape", np.ones(4))
    code, text = run("diff", str(tmp_path / "a.zt"), str(tmp_path / "b.zt"))
    lines = text.splitlines()
    assert code == 1 and "- gone" in lines and "+ new" in lines
    assert any(l.startswith("~ vals") and "1 of 3 values differ, max |difference| 0.5" in l
               for l in lines)
    assert any(l.startswith("~ shape") and "[2, 2] -> [4]" in l for l in lines)
    assert not any("same" in l for l in lines) and lines[-1] == "4 differences"
    assert run("diff", str(tmp_path / "a.zt"), str(tmp_path / "a.zt"))[0] == 0


def test_npz_member_declaring_more_than_it_holds(tmp_path, capsys):
    import zipfile
    header = np.lib.format.header_data_from_array_1_0(np.zeros(4, "<f8"))
    header["shape"] = (1 << 40,)                           # 8 TB declared ...
    import io
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as z:
        z.writestr("x.npy", buf.getvalue() + bytes(32))    # ... 32 bytes held
    assert main(["convert", str(tmp_path / "bomb.npz"), str(tmp_path / "b.zt")]) == 2
    assert "holds 32 bytes, not the 8796093022208" in capsys.readouterr().err


# ---------------------------------------------------------------- hostile input, round two
def hostile_attributes_file(tmp_path):
    """A file whose attributes and names are legal but awkward: bignums, NaN,
    bytes, and a name carrying a terminal escape sequence."""
    path = tmp_path / "odd.zt"
    with ztensor.Writer(path, attributes={"big": 2**20000, "nan": float("nan"),
                                          "inf": float("-inf"), "raw": b"\x00\xff",
                                          "nested": {"k": [b"x", 2**100]}}) as w:
        w.write_numpy("evil\x1b[2J\x07name", np.arange(3), attributes={"b": b"1"})
    return path


def test_info_and_ls_on_awkward_but_legal_files(tmp_path):
    path = hostile_attributes_file(tmp_path)
    for cmd in ("ls", "info"):
        code, text = run(cmd, str(path))
        assert code == 0 and "\x1b" not in text and "\x07" not in text, text
    code, text = run("ls", str(path))
    assert "evil\\x1b[2J\\x07name" in text
    code, text = run("info", "--json", str(path))
    info = json.loads(text)  # strict JSON: no NaN tokens, no bytes
    assert code == 0 and info["attributes"]["nan"] == "nan"
    assert info["attributes"]["inf"] == "-inf" and info["attributes"]["big"].startswith("<integer")
    assert info["attributes"]["raw"] == {"bytes": "00ff", "length": 2}
    assert info["attributes"]["nested"]["k"][1] == 2**100
    code, text = run("ls", "--json", str(path))
    assert json.loads(text)[0]["name"] == "evil\x1b[2J\x07name"


def test_ls_on_a_directory_and_a_fifo(tmp_path, capsys):
    import os
    code, _ = run("ls", str(tmp_path))
    err = capsys.readouterr().err
    assert code == 2 and str(tmp_path) in err and err.count("\n") == 1
    fifo = tmp_path / "p.zt"
    os.mkfifo(fifo)
    code, _ = run("ls", str(fifo))  # must not block waiting for a writer
    err = capsys.readouterr().err
    assert code == 2 and "not a regular file" in err


def test_diff_sees_attributes_of_quantized_objects(tmp_path):
    w = np.linspace(-1, 1, 32 * 64, dtype=np.float32).reshape(32, 64)
    q = ztensor.quantize(w, group_size=32)
    with ztensor.Writer(tmp_path / "a.zt") as out:
        out.write("q", q)
    q.attributes["group_size"] = 64   # same bytes, different weights when dequantized
    q.components["scales"] = np.asarray(q.components["scales"])[:1]
    q.components["zeros"] = np.asarray(q.components["zeros"])[:1]
    with ztensor.Writer(tmp_path / "b.zt") as out:
        out.write("q", q)
    code, text = run("diff", str(tmp_path / "a.zt"), str(tmp_path / "b.zt"))
    assert code == 1 and "group_size" in text and "identical" not in text


def test_diff_file_attributes(tmp_path):
    for name, value in (("a.zt", "MIT"), ("b.zt", "GPL")):
        with ztensor.Writer(tmp_path / name, attributes={"license": value}) as w:
            w.write_numpy("x", np.arange(3))
    code, text = run("diff", str(tmp_path / "a.zt"), str(tmp_path / "b.zt"))
    assert code == 1 and "license" in text


def test_diff_memory_is_bounded(tmp_path):
    import tracemalloc
    big = np.arange(8 << 20, dtype=np.float32)  # 32 MiB: scratch must not follow it
    for name, arr in (("a.zt", big), ("b.zt", big + (np.arange(big.size) % 7 == 0))):
        with ztensor.Writer(tmp_path / name) as w:
            w.write_numpy("x", arr)
    tracemalloc.start()
    code, text = run("diff", str(tmp_path / "a.zt"), str(tmp_path / "b.zt"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert code == 1 and "1198373 of 8388608 values differ" in text
    assert peak < big.nbytes // 2  # chunks, not copies: was ~8x the tensor


def test_convert_hostile_safetensors_headers(tmp_path, capsys):
    import struct
    deep = b"[" * 100_000 + b"]" * 100_000
    surrogate = b'{"\\ud800": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    for i, header in enumerate((deep, surrogate)):
        src = tmp_path / f"h{i}.safetensors"
        src.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
        code, _ = run("convert", str(src), str(tmp_path / f"h{i}.zt"))
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("ztensor: ") and err.count("\n") == 1, err
        assert "Traceback" not in err


def test_broken_pipe_is_quiet(tmp_path):
    path = tmp_path / "many.zt"
    with ztensor.Writer(path) as w:
        for i in range(3000):
            w.write_numpy(f"tensor.{i}", np.zeros(1))
    proc = subprocess.run(f"{sys.executable} -m ztensor ls {path} | head -1", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.startswith("NAME") and proc.stderr == "", proc.stderr


def test_convert_writes_the_format_the_output_name_says(tmp_path, capsys):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
               "i": np.arange(5, dtype=np.int64), "h": np.ones(3, np.float16)}
    src = tmp_path / "in.safetensors"
    st.save_file(tensors, str(src), metadata={"format": "np"})
    zt = tmp_path / "mid.zt"
    assert main(["convert", "-q", str(src), str(zt)]) == 0
    back = tmp_path / "back.safetensors"
    assert main(["convert", "-q", str(zt), str(back)]) == 0
    loaded = st.load_file(str(back))                       # read by safetensors itself
    assert loaded.keys() == tensors.keys()
    for name, arr in tensors.items():
        assert loaded[name].dtype == arr.dtype
        np.testing.assert_array_equal(loaded[name], arr)
    from safetensors import safe_open as st_open
    with st_open(str(back), framework="np") as f:
        assert f.metadata() == {"format": "np"}
    # safetensors -> zt -> safetensors: every tensor's bytes and the metadata are equal
    original = st.load_file(str(src))
    assert all(loaded[n].tobytes() == original[n].tobytes() for n in tensors)
    npz = tmp_path / "out.npz"  # arrays only: safetensors' "format" marker is left out
    assert main(["convert", "-q", str(zt), str(npz)]) == 0
    with np.load(npz) as z:
        np.testing.assert_array_equal(z["w"], tensors["w"])
    code = main(["convert", str(zt), str(tmp_path / "out.bin")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write .bin files" in err and not (tmp_path / "out.bin").exists()
    q = tmp_path / "q.zt"
    with ztensor.Writer(q) as w:
        w.write("q", ztensor.quantize(np.ones((8, 64), np.float32), group_size=32))
    code = main(["convert", str(q), str(tmp_path / "q.safetensors")])
    err = capsys.readouterr().err
    assert code == 2 and "quantized_group object cannot be expressed" in err
    assert not (tmp_path / "q.safetensors").exists()


def test_convert_compress_flag_never_swallows_the_input(tmp_path):
    src = tmp_path / "a.npy"
    np.save(src, np.zeros(1000, np.float32))
    for argv, level in ((["--compress"], 3), (["--compress=7"], 7), (["--compress", "--level",
                                                                       "5"], 5)):
        out = tmp_path / f"out{level}.zt"
        assert main(["convert", *argv, str(src), str(out), "-q"]) == 0
        with ztensor.Reader(out) as r:
            assert r.metadata("a").components["data"].encoding == "zstd"


class _Terminal:
    """A stderr that says it is a terminal and keeps what was written."""

    def __init__(self):
        import io
        self.buffer = io.StringIO()

    def isatty(self):
        return True

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass


@pytest.mark.parametrize("with_tqdm", [True, False])
def test_progress_on_a_terminal(monkeypatch, with_tqdm):
    import sys as _sys

    from ztensor.tools import cli
    if not with_tqdm:
        monkeypatch.setitem(_sys.modules, "tqdm", None)  # as if it were not installed
    else:
        pytest.importorskip("tqdm")
    term = _Terminal()
    progress = cli.Progress(0, quiet=False, stream=term)
    assert (progress.bar is not None) == with_tqdm
    for done in (100, 5000, 10000):
        progress.update(done, 10000)
        progress.last = 0  # the plain meter draws at most every 0.1 s
    if with_tqdm:
        assert (progress.bar.n, progress.bar.total) == (10000, 10000)
    progress.finish()
    text = term.buffer.getvalue()
    assert ("100.0%" in text) if not with_tqdm else ("B/s" in text or "it/s" in text)
    assert cli.Progress(10, quiet=True, stream=term).enabled is False


def test_tables_fit_a_narrow_terminal(tmp_path, monkeypatch):
    import os as _os
    import shutil

    import numpy as np

    import ztensor
    from ztensor.tools import cli
    path = tmp_path / "n.zt"
    long_name = "model.layers.17.self_attn.q_proj.weight.with.a.very.long.suffix"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy(long_name, np.zeros(3))
    monkeypatch.setattr(shutil, "get_terminal_size", lambda *a: _os.terminal_size((60, 20)))

    class Tty(io.StringIO):
        def isatty(self):
            return True
    narrow, piped = Tty(), io.StringIO()
    assert cli.main(["ls", str(path)], out=narrow) == 0
    assert cli.main(["ls", str(path)], out=piped) == 0
    assert max(map(len, narrow.getvalue().splitlines())) <= 60
    assert "\u2026" in narrow.getvalue() and long_name in piped.getvalue()


def test_ctrl_c_is_one_line_and_status_130(model, monkeypatch, capsys):
    """An interrupt in any command is `ztensor: interrupted` and the shell's status for
    SIGINT, never a traceback (the command's own clean-up runs as the exception
    passes through it)."""
    from ztensor.tools import cli

    def interrupted(*args):
        raise KeyboardInterrupt

    for command in ("ls", "verify"):
        monkeypatch.setitem(cli.COMMANDS, command, (interrupted, *cli.COMMANDS[command][1:]))
        assert main([command, str(model)]) == 130
        err = capsys.readouterr().err
        assert err == "ztensor: interrupted\n", err
