"""Backend selection: ZTENSOR_PUREPYTHON=1 and a missing extension both give the
numpy fallback, and the package works the same on it."""
import os
import subprocess
import sys
import textwrap

import ztensor

SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    class Block:                      # make the compiled extension unimportable
        def find_spec(self, name, path=None, target=None):
            if name == "ztensor._native._kernels":
                raise ImportError("blocked for the test")
    if sys.argv[1] == "block":
        sys.meta_path.insert(0, Block())
    import ztensor
    assert ztensor.backend == "python", ztensor.backend
    path = sys.argv[2]
    with ztensor.Writer(path) as w:
        w.write_numpy("x", np.arange(10, dtype=">i4"), compress=True, checksum="crc32c")
        w.write_numpy("f8", np.linspace(-2, 2, 5, dtype=np.float32), type="f8_e4m3fn")
        w.write("q", ztensor.quantize(np.ones((8, 64), np.float32), group_size=32))
    with ztensor.Reader(path, verify=True) as r:
        assert r["x"].tolist() == list(range(10))
        assert r.read_numpy("f8", dtype=np.float32).tolist() == [-2, -1, 0, 1, 2]
        assert np.allclose(ztensor.dequantize(r.read("q"), dtype=np.float32), 1, atol=0.04)
    print("ok")
""")


def run(mode, tmp_path, env_extra):
    # the package this process imported: installed, or built in place (s390x root)
    package_parent = os.path.dirname(os.path.dirname(ztensor.__file__))
    path = os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, **env_extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(tmp_path / f"{mode}.zt")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return tmp_path / f"{mode}.zt"


def test_missing_extension_falls_back(tmp_path):
    run("block", tmp_path, {})


def test_purepython_env_forces_the_fallback(tmp_path):
    run("env", tmp_path, {"ZTENSOR_PUREPYTHON": "1"})


def test_both_backends_write_the_same_bytes(tmp_path):
    a = run("block", tmp_path, {})
    b = run("env", tmp_path, {"ZTENSOR_PUREPYTHON": "1"})
    assert a.read_bytes() == b.read_bytes()
    with ztensor.Reader(a) as r:   # and this process (either backend) reads them
        assert r["x"].tolist() == list(range(10))


def test_backend_attribute_names_the_live_one():
    assert ztensor.backend in ("c", "python")
    assert ztensor.kernels.backend == ztensor.backend
