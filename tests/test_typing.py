"""The public API is typed (house rule 6): user code written against it passes
``mypy --strict``, which refuses any call to an unannotated function and any Any
leaking out of one; and the installed package ships ``py.typed``, without which a
type checker ignores the package's annotations altogether."""
import importlib
import importlib.resources
import importlib.util
import inspect
import os
import site
import subprocess
import sys
import textwrap

import pytest

# Every public entry point a user's typed code reaches: a function of the API left
# unannotated is an "untyped call" error under --strict, a property returning Any
# a "returning Any" error, a wrong return annotation an incompatible assignment.
USER_CODE = '''
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
from numpy.typing import NDArray

import ztensor
import ztensor.numpy
from ztensor import (ComponentSpec, Limits, ObjectSpec, Reader, ShardedReader, Tensor,
                     Writer, convert, dequantize, open_sharded, safe_open, save_sharded)

# each function returns what the API gives straight away: were it Any (an
# unannotated return), --strict's warn_return_any would refuse the function


def write(path: str) -> Writer:
    with Writer(path) as w:
        w.write_numpy("w", np.ones((2, 3), np.float32), compress=True, checksum="crc32c")
        w.write_numpy("b", np.zeros(3, np.float16), compress=None)
    return w


def reader(path: str) -> Reader:
    return Reader(path, limits=Limits().with_(max_objects=10))


def names(r: Reader) -> List[str]:
    return r.keys()


def meta(r: Reader) -> ObjectSpec:
    return r.metadata("w")


def shape(m: ObjectSpec) -> tuple[int, ...]:
    return m.shape


def dtype(m: ObjectSpec) -> Optional[str]:
    return m.dtype


def storage(m: ObjectSpec) -> Optional[str]:
    return m.storage_dtype


def primary(m: ObjectSpec) -> Optional[ComponentSpec]:
    return m.primary


def decoded(c: ComponentSpec) -> int:
    return c.decoded_length


def one(r: Reader) -> NDArray[Any]:
    return r.read_numpy("w", copy=True)


def many(r: Reader) -> Dict[str, NDArray[Any]]:
    return r.read_numpy(["w", "b"])


def item(r: Reader) -> NDArray[Any]:
    return r["w"]


def tensor(r: Reader) -> Tensor:
    return r.read("w")


def count(r: Reader) -> int:
    with r:
        return len(r)


def present(r: Reader) -> bool:
    return "w" in r


def listed(r: Reader) -> List[str]:
    return [name for name in r]


def described(r: Reader) -> str:
    return repr(r)


def read_safe(path: str) -> NDArray[Any]:
    with safe_open(path, framework="np") as f:
        key: str = f.keys()[0]
        arr: NDArray[Any] = f.get_tensor(key)  # np or torch, by framework: Any
        return arr


def save(path: str) -> None:
    ztensor.numpy.save_file({"x": np.arange(4)}, path, metadata={"k": "v"}, compress=3)


def saved() -> bytes:
    return ztensor.numpy.save({"x": np.arange(4)})


def loaded(blob: bytes) -> Dict[str, NDArray[Any]]:
    return ztensor.numpy.load(blob)


def load(path: str) -> Dict[str, NDArray[Any]]:
    return ztensor.numpy.load_file(path, copy=True, threads=2)


def shards(folder: str) -> List[str]:
    return save_sharded({"x": np.arange(4)}, folder, max_shard_size=1 << 20)


def sharded(folder: str) -> ShardedReader:
    with open_sharded(folder) as s:
        return s


def converted(folder: str, out: str) -> int:
    return convert(folder, out)


def dense(r: Reader) -> NDArray[Any]:
    return dequantize(r.read("q"), dtype=np.float32)


def opened(path: str) -> Reader:
    return ztensor.open(path)
'''


def _mypy(tmp_path, code):
    """mypy --strict's exit code and report on ``code``, against the ztensor that
    pytest imports (the checkout, or an installed wheel)."""
    pytest.importorskip("mypy")
    import ztensor

    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent(code))
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    home = os.path.dirname(os.path.dirname(os.path.abspath(ztensor.__file__)))
    if home not in site.getsitepackages() + [site.getusersitepackages()]:
        # a checkout (an editable install's import hook is invisible to mypy): its
        # directory on mypy's path; an installed wheel is found in site-packages,
        # through its py.typed, as a user's mypy finds it
        env["MYPYPATH"] = home
    # --follow-imports=silent: the package's own internals are .ci/run's mypy's
    # business; this checks what user code sees of them
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", os.devnull, "--config-file", os.devnull,
         str(user)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)


def test_user_code_on_the_public_api_passes_mypy_strict(tmp_path):
    done = _mypy(tmp_path, USER_CODE)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_sees_the_api_types(tmp_path):
    """The clean run above means something: a wrong use of the same API is an error
    (were the package's types invisible, Any would let this through)."""
    done = _mypy(tmp_path, '''
        from ztensor import Reader

        def wrong(path: str) -> str:
            with Reader(path) as r:
                return r.read_numpy("w")
        ''')
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Incompatible return value type" in done.stdout, done.stdout


def test_the_package_ships_py_typed():
    marker = importlib.resources.files("ztensor").joinpath("py.typed")
    assert marker.is_file()


# made by the library (Writer.write_stream, Reader.metadata), never by user code
_LIBRARY_MADE = {"TensorStream.__init__", "ObjectSpec.__init__", "ComponentSpec.__init__"}
_DUNDERS = {"__init__", "__enter__", "__exit__", "__iter__", "__len__", "__contains__",
            "__getitem__", "__call__"}


def _unannotated(fn, qual):
    try:
        sig = inspect.signature(fn)  # follows functools.wraps to the function itself
    except (TypeError, ValueError):  # a builtin slot: nothing to annotate
        return []
    missing = [f"{qual}({p.name})" for p in sig.parameters.values()
               if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append(f"{qual} -> ?")
    return missing


def test_public_signatures_are_annotated():
    """Every parameter and return of the public API (the names in ``__all__`` of
    ztensor and its framework modules, and the public methods and properties of its
    classes) is annotated: user code under --strict cannot see an unannotated
    parameter (it is Any), so this checks it where it is written.  Needs no mypy:
    it runs in every wheel's test too."""
    modules = ["ztensor", "ztensor.numpy", "ztensor.serialize", "ztensor.sharded"]
    for optional in ("torch", "transformers", "dask"):
        if importlib.util.find_spec(optional) is not None:
            modules.append(f"ztensor.{optional}")
    missing = []
    for modname in modules:
        module = importlib.import_module(modname)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, Exception):
                continue
            if isinstance(obj, type):
                for attr, value in vars(obj).items():
                    if attr.startswith("_") and attr not in _DUNDERS:
                        continue
                    if f"{obj.__name__}.{attr}" in _LIBRARY_MADE:  # TensorMetadata too
                        continue
                    if isinstance(value, property):
                        value = value.fget
                    elif isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if inspect.isfunction(value):
                        missing += _unannotated(value, f"{modname}.{name}.{attr}")
            elif inspect.isfunction(obj):
                missing += _unannotated(obj, f"{modname}.{name}")
    assert not missing, "unannotated in the public API: " + ", ".join(missing)
