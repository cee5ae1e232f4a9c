"""The ztensor command: ls and info, text and JSON, and one-line errors."""
import io
import json
import subprocess
import sys

import numpy as np
import pytest

import ztensor
from ztensor.cli import main


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
    assert code == 0 and "version:     1.2.0" in text and "license: 'MIT'" in text


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
