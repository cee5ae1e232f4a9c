"""pytest plugin: refuse to run the suite unless ztensor is the installed wheel.

    ZTENSOR_WHEEL=/path/ztensor-...whl python -m pytest -p installed_wheel_check tests

(the folder holding this file must be importable: tools/s390x-wheel.sh copies it
next to the tests and runs pytest from there).  A suite run meant to test a wheel
proves nothing if it imports a source tree instead (``python -m pytest`` puts the
working folder on sys.path; a stray PYTHONPATH does the same), so before any test
runs this checks, in the pytest process itself:

* it runs in a virtual environment, and ``ztensor.__file__`` lies in that
  environment's site-packages;
* pip installed ztensor from the very file named by ``ZTENSOR_WHEEL`` (the
  ``direct_url.json`` pip records for a local wheel);
* without ZTENSOR_PUREPYTHON=1, the C backend is live and its compiled extension
  was loaded from the installed package folder (whatever module path it has).

The run's first line names the wheel and where ztensor was imported from.
"""
import json
import os
import sys
import sysconfig
from importlib import metadata
from urllib.parse import unquote, urlparse

import pytest


def _inside(path, folder):
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def _where():
    import ztensor

    if sys.prefix == sys.base_prefix:
        raise pytest.UsageError(f"not in a virtual environment ({sys.prefix})")
    site = {sysconfig.get_path(k) for k in ("purelib", "platlib")}
    if not any(_inside(ztensor.__file__, s) and _inside(s, sys.prefix) for s in site):
        raise pytest.UsageError(f"ztensor imported from {ztensor.__file__}, not from the "
                                f"venv's site-packages {sorted(site)}")
    wheel = os.environ.get("ZTENSOR_WHEEL")
    if not wheel:
        raise pytest.UsageError("ZTENSOR_WHEEL (the wheel file that was installed) is not set")
    dist = metadata.distribution("ztensor")
    if dist.version != ztensor.__version__:
        raise pytest.UsageError(f"installed metadata says {dist.version}, the imported "
                                f"package {ztensor.__version__}")
    url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
    got = unquote(urlparse(url).path)
    if os.path.realpath(got) != os.path.realpath(wheel):
        raise pytest.UsageError(f"ztensor was installed from {url or 'an index'}, not {wheel}")
    if os.environ.get("ZTENSOR_PUREPYTHON") != "1":
        # wherever the package keeps its extension: a loaded ztensor.* module that is
        # a compiled file from the installed package folder
        compiled = [m.__file__ for n, m in list(sys.modules.items())
                    if n.startswith("ztensor.") and getattr(m, "__file__", None)
                    and m.__file__.endswith(sysconfig.get_config_var("EXT_SUFFIX"))]
        if ztensor.backend != "c" or not compiled or not all(
                _inside(f, os.path.dirname(ztensor.__file__)) for f in compiled):
            raise pytest.UsageError(f"backend {ztensor.backend}, compiled modules {compiled}")
    return f"wheel {os.path.basename(wheel)} installed at {os.path.dirname(ztensor.__file__)}"


def pytest_configure(config):
    config._installed_wheel = _where()


def pytest_sessionstart(session):
    # a line of its own, since -q hides the report header
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(session.config._installed_wheel)
