"""Red team, round 13: the ``ztensor`` command as a hostile or careless user runs it:
a reader that closes the pipe, an output that cannot be written, options that do not
apply to the output asked for, out-of-range numbers, odd paths.

Each test names the one function that keeps its rule (docs/threat-model.md)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ztensor
from ztensor.tools import cli

CLOSED_PIPE = 128 + 13


def _ztensor(*argv, **kw):
    return [sys.executable, "-m", "ztensor", *map(str, argv)]


def _run(argv, capsys):
    """main() in process: (status, stdout, stderr); argparse's exit is a status too."""
    out = io.StringIO()
    try:
        code = cli.main([str(a) for a in argv], out=out)
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), capsys.readouterr().err


def _one_error_line(err):
    return err.count("\n") == 1 and err.startswith("ztensor") and "Traceback" not in err


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two real .zt files of 3,000 objects each, every one different (a few hundred
    KiB of ``diff``, ``ls`` and ``stats`` output: more than a pipe buffers), and
    many file attributes (as much ``info`` output)."""
    root = tmp_path_factory.mktemp("pair")
    a, b = root / "a.zt", root / "b.zt"
    attributes = {f"key.{i}": "v" * 150 for i in range(3000)}
    for path, value in ((a, 0.0), (b, 1.0)):
        with ztensor.Writer(path, attributes=attributes) as w:
            for i in range(3000):
                w.write_numpy(f"layer.{i}.weight", np.full(2, value, np.float32))
    return a, b


# ------------------------------------------------------------------ a closed pipe
def _closed_reader(argv):
    """Run the command with a pipe for stdout whose reading end is closed before the
    command writes (what ``| head -1`` does once it has its line)."""
    proc = subprocess.Popen(_ztensor(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


@pytest.mark.parametrize(
    "argv, status",
    [
        (["diff", "A", "B"], 1),  # the files differ: the answer stays
        (["diff", "--json", "A", "B"], 1),
        (["diff", "A", "A"], CLOSED_PIPE),  # identical, but the output was lost
        (["ls", "A"], CLOSED_PIPE),
        (["ls", "--json", "A"], CLOSED_PIPE),
        (["info", "A"], CLOSED_PIPE),
        (["info", "--json", "A"], CLOSED_PIPE),
        (["stats", "A"], CLOSED_PIPE),
        (["stats", "--json", "A"], CLOSED_PIPE),
    ],
)
def test_a_closed_pipe_is_not_success(pair, argv, status):
    """``ztensor diff A B | head -1`` exited 0 for files that differ: the pipe's
    BrokenPipeError was taken as success, and ``ls``/``info``/``stats`` said 0 for
    output nobody got.  ``cli._status``: the answer a command found (1, 2) is kept,
    a success whose output was lost is 141 (128 + SIGPIPE, as a shell reports a tool
    that signal ended); nothing is printed, no traceback, no "Exception ignored"."""
    a, b = pair
    argv = [{"A": a, "B": b}.get(x, x) for x in argv]
    code, err = _closed_reader(argv)
    assert (code, err) == (status, "")


def test_a_closed_pipe_under_main_keeps_the_answer(pair, capsys):
    """The same rule for a caller of ``main`` whose stream raises BrokenPipeError."""

    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    a, b = pair
    assert cli.main(["diff", str(a), str(b)], out=Closed()) == 1
    assert cli.main(["ls", str(a)], out=Closed()) == CLOSED_PIPE
    assert capsys.readouterr().err == ""


def test_an_output_that_cannot_be_written_is_one_line(pair, tmp_path):
    """``ztensor ls f.zt > /dev/full`` (a full disk) printed Python's "Exception
    ignored ... OSError" at exit, status 120, and ``>&-`` (stdout closed) a
    traceback of ``None.write``: now one line naming ``<stdout>``, exit 2
    (``cli._Output``)."""
    a, _ = pair
    runs = [subprocess.run(_ztensor("ls", a), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, preexec_fn=lambda: os.close(1), timeout=120)]
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            runs.append(subprocess.run(_ztensor("ls", a), stdout=full, stderr=subprocess.PIPE,
                                       text=True, timeout=120))
    for proc in runs:
        assert proc.returncode == 2 and _one_error_line(proc.stderr), proc.stderr
        assert proc.stderr.startswith("ztensor: <stdout>: cannot write the output")


# ------------------------------------------------------------------ convert's options
@pytest.fixture()
def source(tmp_path):
    path = tmp_path / "in.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    return path


@pytest.mark.parametrize("name", ["out.safetensors", "out.npz", "out.gguf"])
@pytest.mark.parametrize(
    "options", [["--compress"], ["--compress=9"], ["--checksum", "sha256"],
                ["--level", "5", "--checksum", "crc32c"]]
)
def test_zt_options_asked_of_another_format_are_refused(source, tmp_path, capsys, name, options):
    """``convert IN out.safetensors --compress`` wrote an uncompressed file, exit 0:
    ``--compress`` and ``--checksum`` are the .zt writer's.  Refused before anything
    is written, one line, exit 2, no file; an existing output (``--force``) is left
    as it was (``convert._zt_options_fit``)."""
    out = tmp_path / name
    code, _, err = _run(["convert", source, out, *options], capsys)
    assert code == 2 and _one_error_line(err) and "to .zt output only" in err, err
    assert not out.exists()
    out.write_bytes(b"keep me")
    code, _, err = _run(["convert", "--force", source, out, *options], capsys)
    assert code == 2 and out.read_bytes() == b"keep me"
    with pytest.raises(ztensor.UnsupportedError, match="to .zt output only"):
        ztensor.convert(source, tmp_path / ("lib" + name), compress=True)


def test_zt_options_of_a_checkpoint_into_safetensors_shards_are_refused(tmp_path, capsys):
    """A checkpoint into a directory of safetensors shards (``--format safetensors``)
    dropped ``--compress`` too; refused before the directory is made."""
    st = pytest.importorskip("safetensors.numpy")
    folder = tmp_path / "ckpt"
    folder.mkdir()
    st.save_file({"w": np.ones(4, np.float32)}, str(folder / "model.safetensors"))
    out = tmp_path / "out"
    code, _, err = _run(["convert", folder, out, "--format", "safetensors", "--compress"], capsys)
    assert code == 2 and _one_error_line(err) and "to .zt output only" in err, err
    assert not out.exists()
    # the .zt default still takes them
    code, _, err = _run(["convert", "-q", folder, out, "--compress", "--checksum", "sha256"],
                        capsys)
    assert code == 0, err
    with ztensor.Reader(out / "model.zt") as r:
        assert r.metadata("w").components["data"].encoding == "zstd"


@pytest.mark.parametrize("level", ["99", "23", "-131073", "0", "x", "1e3", "\x1b[2J"])
@pytest.mark.parametrize("form", ["--compress={}", "--level {}"])
def test_a_compress_level_out_of_range_is_a_usage_error(source, tmp_path, capsys, level, form):
    """``--compress=99`` printed ``ztensor: ValueError: zstd level must be in ...``
    (the Writer's, once the output was begun); now argparse refuses it, one line
    naming the range (``cli._compress_level``, from ``spec.MIN_ZSTD_LEVEL`` and
    ``spec.MAX_ZSTD_LEVEL``), and every usage error is one line
    (``cli._Parser.error``), with what the user typed escaped."""
    out = tmp_path / "out.zt"
    option = form.format(level).split(" ")
    code, _, err = _run(["convert", source, out, *option], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "from -131072 to 22" in err and "\x1b" not in err
    # the spelling the user typed is named (argparse says --level, where it is sent)
    assert "--compress=LEVEL" in err and "--level LEVEL" in err
    assert not out.exists()


def test_every_usage_error_is_one_line(capsys):
    """argparse printed its usage block (four lines for ``convert``) before the error
    line, and echoed an unknown argument raw: escape codes and all."""
    for argv in (["ls"], ["nope"], ["stats", "f", "--bins", "0"], ["ls", "f", "--x\x1b[2J"],
                 ["diff", "a"], ["dequantize", "a", "b", "--dtype", "int4"], []):
        code, _, err = _run(argv, capsys)
        assert code == 2 and err.count("\n") == 1 and "\x1b" not in err, (argv, err)
        assert err.startswith("ztensor"), err


# ------------------------------------------------------------------ red team
def _corrupted(path):
    """A real .zt file whose second tensor's bytes no longer match its crc32c."""
    with ztensor.Writer(path) as w:
        w.write_numpy("a", np.arange(100.0), checksum="crc32c")
        w.write_numpy("b", np.arange(100.0) + 5, checksum="crc32c")
    with ztensor.Reader(path) as r:
        offset = r.metadata("b").components["data"].offset
    data = bytearray(path.read_bytes())
    data[offset + 3] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("name", ["out.zt", "out.safetensors", "out.npz", "out.gguf"])
def test_convert_never_launders_a_corrupted_tensor(tmp_path, capsys, name):
    """``convert`` of a .zt whose tensor fails its digest wrote the damaged bytes,
    exit 0, the digest dropped (``ztensor verify`` then called the output sound),
    or with ``--checksum`` a fresh digest over them.  Every tensor a conversion
    reads is checked (``convert_inputs.READ_OPTIONS``): one line naming the object,
    exit 2, no output, an existing one untouched."""
    if name.endswith(".gguf"):
        pytest.importorskip("gguf")  # writing GGUF needs it (optional)
    src = _corrupted(tmp_path / "in.zt")
    out = tmp_path / name
    extra = ["--checksum", "sha256"] if name.endswith(".zt") else []
    code, _, err = _run(["convert", src, out, *extra], capsys)
    assert code == 2 and _one_error_line(err) and "'b'" in err and "mismatch" in err, err
    assert not out.exists()
    out.write_bytes(b"keep me")
    code, _, err = _run(["convert", "--force", src, out], capsys)
    assert code == 2 and out.read_bytes() == b"keep me"
    assert sorted(os.listdir(tmp_path)) == sorted(["in.zt", name])  # no temporary left


def test_dequantize_and_checkpoints_never_launder_a_corrupted_tensor(tmp_path, capsys):
    """The same for ``dequantize`` and a checkpoint's shards (into a directory, and
    merged into one file)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    _corrupted(folder / "model.zt")
    for argv, out in ((["dequantize", folder / "model.zt"], tmp_path / "dq.zt"),
                      (["convert", folder], tmp_path / "outdir"),
                      (["convert", folder], tmp_path / "merged.safetensors"),
                      (["convert", folder], tmp_path / "merged.zt")):
        code, _, err = _run([*argv, out], capsys)
        assert code == 2 and _one_error_line(err) and "mismatch" in err, (argv, err)
        assert not out.exists(), argv


def test_diff_takes_checkpoints_and_names_the_file_of_its_limit(tmp_path, capsys):
    """``ztensor diff`` refused a checkpoint directory ("open it with
    ztensor.open_sharded", advice for Python) where ``ls``, ``info``, ``stats`` and
    ``verify`` take one (``cli.cmd_diff`` opens through ``cli._open_any``); and its
    ``--max-elements`` refusal named the object but no file
    (``cli._value_difference``)."""
    st = pytest.importorskip("safetensors.numpy")
    one, two = tmp_path / "one", tmp_path / "two"
    for folder, value in ((one, 1.0), (two, 2.0)):
        folder.mkdir()
        st.save_file({"w": np.full(4, value, np.float32), "same": np.zeros(2, np.float32)},
                     str(folder / "model.safetensors"))
    code, text, err = _run(["diff", "--json", one, two], capsys)
    assert code == 1 and err == "", err
    changes = json.loads(text)["changes"]
    assert [c["name"] for c in changes] == ["w"]
    assert _run(["diff", one, one], capsys)[:2] == (0, "identical\n")
    code, _, err = _run(["diff", "--max-elements", "1", one, two], capsys)
    assert code == 2 and _one_error_line(err), err
    assert err.startswith(f"ztensor: {one}: object "), err


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="Linux /proc")
@pytest.mark.parametrize(
    "argv", [["convert", "MEM", "OUT"], ["dequantize", "MEM", "OUT"], ["diff", "GOOD", "MEM"],
             ["diff", "MEM", "GOOD"]]
)
def test_an_os_error_naming_no_file_is_said_of_the_input(source, tmp_path, capsys, argv):
    """Reading ``/proc/self/mem`` fails with EIO, and Python's OSError names no file:
    ``convert``, ``dequantize`` and ``diff`` printed ``ztensor: Input/output error``,
    which of the two files unsaid (``cli._run``, ``cli._open_any``)."""
    where = {"MEM": "/proc/self/mem", "GOOD": str(source), "OUT": str(tmp_path / "o.zt")}
    argv = [where.get(a, a) for a in argv]
    code, _, err = _run(argv, capsys)
    assert code == 2 and _one_error_line(err), err
    assert err.startswith("ztensor: /proc/self/mem: "), err
    assert not (tmp_path / "o.zt").exists()
