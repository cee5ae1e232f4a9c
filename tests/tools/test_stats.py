"""ztensor.tools.stats / `ztensor stats`: figures equal numpy's over the same values, NaN and
Inf counted, chunked passes agree with one pass, the command's exit codes and JSON."""
import json
import subprocess
import sys

import numpy as np
import pytest

import ztensor
from conftest import DATA
from ztensor.tools import stats
from ztensor.tools.cli import main

RNG = np.random.default_rng(11)


def oracle(values):
    v = np.asarray(values, np.float64).reshape(-1)
    good = v[np.isfinite(v)]
    return {"count": v.size, "nan": int(np.isnan(v).sum()), "posinf": int((v == np.inf).sum()),
            "neginf": int((v == -np.inf).sum()), "zeros": int((v == 0).sum()),
            "min": good.min(), "max": good.max(), "mean": good.mean(), "std": good.std(),
            "histogram": np.histogram(good, np.linspace(good.min(), good.max(), 11))[0].tolist()}


@pytest.fixture
def path(tmp_path):
    a = RNG.standard_normal((300, 70)).astype(np.float16)
    a[1, 2], a[3, 4], a[5, 6], a[7, 8] = np.nan, np.inf, -np.inf, 0
    p = tmp_path / "s.zt"
    with ztensor.Writer(str(p)) as w:
        w.write_numpy("half", a)
        w.write_numpy("ints", RNG.integers(-5, 5, 999).astype(np.int8), compress=True)
        w.write_numpy("bf", np.linspace(-2, 2, 77, dtype=np.float32), type="bf16")
        w.write_numpy("cplx", np.array([3 + 4j, 1j, 0], np.complex64))
        w.write_numpy("none", np.full(4, np.nan, np.float32))
    return p, a


@pytest.mark.parametrize("chunk", [1 << 20, 7])
def test_figures_match_numpy(path, chunk, monkeypatch):
    monkeypatch.setattr(stats, "_CHUNK", chunk)  # many passes agree with one
    p, half = path
    with ztensor.Reader(str(p)) as r:
        expected = {"half": half, "ints": r.read_numpy("ints"),
                    "bf": r.read_numpy("bf", dtype=np.float32), "cplx": [5, 1, 0]}
        for name, values in expected.items():
            got = stats.tensor_stats(r, name)
            for key, want in oracle(values).items():
                if isinstance(want, float):
                    assert got[key] == pytest.approx(want, rel=1e-9, abs=1e-12), (name, key)
                else:
                    assert got[key] == want, (name, key)
        none = stats.tensor_stats(r, "none")
    assert none["nan"] == 4 and none["min"] is None and none["histogram"] == []


def test_sparse_and_quantized(tmp_path):
    from ztensor.formats import quantized

    p = tmp_path / "q.zt"
    weight = RNG.standard_normal((64, 128)).astype(np.float32)
    with ztensor.Writer(str(p)) as w:
        w.write("s", ztensor.Tensor({"values": np.array([2.0, -1.0]),
                                     "indices": np.array([1, 0], np.uint64),
                                     "indptr": np.array([0, 1, 2], np.uint64)},
                                    shape=(2, 2), format="sparse_csr"))
        w.write("q", quantized.quantize(weight, bits=4, group_size=64))
    with ztensor.Reader(str(p)) as r:
        s = stats.tensor_stats(r, "s")
        q = stats.tensor_stats(r, "q")
        dense = quantized.dequantize(r.read("q"), dtype=np.float32)
    assert (s["of"], s["count"], s["min"], s["max"]) == ("stored values", 2, -1.0, 2.0)
    assert q["of"] == "dequantized" and q["mean"] == pytest.approx(float(dense.mean()), rel=1e-6)


def test_command(path, capsys):
    p, _ = path
    assert main(["stats", str(p)]) == 0
    text = capsys.readouterr().out
    assert "half" in text and "5 tensors, 2 with NaN or Inf" in text
    assert main(["stats", str(p), "--check"]) == 1
    capsys.readouterr()
    assert main(["stats", str(p), "ints", "bf", "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["name"] for t in report["tensors"]] == ["ints", "bf"]
    assert report["with_nan_or_inf"] == []
    assert main(["stats", str(p), "missing"]) == 2
    assert "no such object" in capsys.readouterr().err


def test_module_and_script_agree(path):
    p, _ = path
    runs = [subprocess.run([sys.executable, "-m", "ztensor", "stats", str(p), "--json"],
                           capture_output=True, text=True),
            subprocess.run([sys.executable, "-c", "import sys; from ztensor.tools.cli import main; "
                            "sys.exit(main())", "stats", str(p), "--json"],
                           capture_output=True, text=True)]
    assert runs[0].returncode == runs[1].returncode == 0
    assert runs[0].stdout == runs[1].stdout


def test_bad_bins_is_one_line(path, capsys):
    p, _ = path
    with pytest.raises(SystemExit) as exc:
        main(["stats", str(p), "--bins", "0"])
    assert exc.value.code == 2


def test_stats_of_v01_sparse_objects():
    """A v0.1 sparse object is one blob in its manifest: stats found no 'values'
    component there and raised KeyError on a valid file (found by fuzz_cli)."""
    path = DATA / "v0.1-handmade" / "features.zt"
    with ztensor.Reader(path) as r:
        for name in ("csr", "coo"):
            values = np.asarray(r.read(name).components["values"], np.float64)
            got = stats.tensor_stats(r, name)
            assert got["of"] == "stored values" and got["count"] == values.size
            assert got["min"] == values.min() and got["max"] == values.max()
