"""Drive the reference implementation (PyPI ``ztensor`` 1.2.3 / 1.1.1 / 0.1.4).

The reference is also called ``ztensor``, so each version is installed into its own
folder (``pip install --target``) and run in a subprocess whose PYTHONPATH starts
there and whose working directory is not this checkout.  Installs are cached in
``$ZTENSOR_REF_CACHE`` (default ``~/.cache/ztensor-reference``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VERSIONS = ("1.2.3", "1.1.1", "0.1.4")
DRIVER = Path(__file__).with_name("ref_driver.py")


def cache_dir() -> Path:
    return Path(os.environ.get("ZTENSOR_REF_CACHE",
                               Path.home() / ".cache" / "ztensor-reference"))


def install(version: str) -> Path:
    """Folder holding reference ``ztensor==version`` (installed on first use)."""
    target = cache_dir() / f"ztensor-{version}"
    if (target / "ztensor").is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"ztensor-{version}-", dir=target.parent))
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--disable-pip-version-check", "--target", str(staging),
                        f"ztensor=={version}"], check=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run(version: str, command: str, payload: dict, workdir) -> dict:
    """Run one driver command under reference ``version``; returns its JSON reply."""
    env = dict(os.environ, PYTHONPATH=str(install(version)), ZTENSOR_REF_VERSION=version)
    proc = subprocess.run([sys.executable, "-s", str(DRIVER), command, json.dumps(payload)],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"reference {version} {command} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
