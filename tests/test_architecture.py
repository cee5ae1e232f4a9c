"""House rule 2 (issue 23): no private name crosses a module
boundary.  A module that needs another's state gets an explicit internal interface
from it (``Reader.internals``, the callables ``Writer.stream`` hands TensorStream,
ztensor/io/atomic.py's helpers), never ``reader._x``.

Read from the package's source with ``ast``, so a new reach fails here with its file,
line and expression, before anyone has to find it by reading."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

import ztensor

PACKAGE = pathlib.Path(ztensor.__file__).resolve().parent   # the sources imported (an installed wheel's too)

# Private attribute reaches (``x._name`` where x is not self or cls) that are allowed,
# by file and expression.  Each is a design decision, not a convenience:
ALLOWED_REACHES = {
    # the stdlib's pure-Python unpickler: the restricted unpickler replaces its
    # dispatch table opcode by opcode (the C one has no table); taken once, as
    # _PythonUnpickler, and used under that name
    ("foreign/pytorch.py", "pickle._Unpickler"),
    # fsspec's async filesystems name their coroutines with a leading underscore (its
    # documented async API): the upload is run on its loop so an interrupt can cancel it
    ("io/upload.py", "fs._put_file"),
    # transformers' per-module initialisation, the one place its init calls a
    # module's _init_weights: wrapped while a model is built on meta so that a module
    # with nothing real in it is skipped (Marian's sinusoidal table, computed in numpy
    # outside any bound, only to be replaced by the checkpoint's)
    ("transformers.py", "pretrained._initialize_weights"),
}
# private names imported across modules that are allowed, by importing file and name
ALLOWED_IMPORTS: set[tuple[str, str]] = set()
# our own private modules: importing them is how the package is built (the backend
# switch, the version), not a reach into another module's internals
PRIVATE_MODULES = {"_kernels", "_fallback", "_contract", "_status", "_save", "_version",
                   "_ztensor"}
MOST_REACHES = 5


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text("utf-8"))


def reaches():
    """(file, line, expression) of every ``x._name`` whose x is not ``self``/``cls``."""
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _private(node.attr)
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                found.append((rel, node.lineno, ast.unparse(node)))
    return found


def private_imports():
    """(file, line, module, name) of every private name imported from our package."""
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            ours = node.level or (node.module or "").split(".")[0] == "ztensor"
            if not ours:
                continue
            for alias in node.names:
                if _private(alias.name) and alias.name not in PRIVATE_MODULES:
                    found.append((rel, node.lineno, node.module, alias.name))
    return found


def test_the_scan_sees_the_package():
    # an empty walk would pass everything below
    files = [rel for rel, _ in _sources()]
    assert "container/reader.py" in files and "foreign/pytorch.py" in files


def test_no_private_attribute_reaches_beyond_the_allowed_ones():
    found = reaches()
    unexpected = [f"ztensor/{rel}:{line}: {expr}" for rel, line, expr in found
                  if (rel, expr) not in ALLOWED_REACHES]
    assert not unexpected, (
        "a module reaches into another object's private names (house rule 2: give it an "
        "explicit internal interface, e.g. Reader.internals):\n" + "\n".join(unexpected))
    assert len(found) <= MOST_REACHES


def test_no_private_name_is_imported_across_modules():
    unexpected = [f"ztensor/{rel}:{line}: from {module} import {name}"
                  for rel, line, module, name in private_imports()
                  if (rel, name) not in ALLOWED_IMPORTS]
    assert not unexpected, (
        "a private name is imported across modules (house rule 2: make it public where "
        "it lives, or give it one public home):\n" + "\n".join(unexpected))


@pytest.mark.parametrize("source, caught", [
    ("def f(reader):\n    return reader._source\n", True),
    ("def f(self):\n    return self._source\n", False),
    ("def f(r):\n    return r.internals.source\n", False),
    ("def f(reader):\n    return reader.__class__\n", False),
])
def test_the_rule_catches_a_reach(source, caught):
    tree = ast.parse(source)
    hits = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _private(n.attr)
            and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))]
    assert bool(hits) is caught


# ------------------------------------------------ house rules 1 and 5 (issue 23)
# imports of our own modules inside functions: each is a decision, listed here
ALLOWED_INNER_IMPORTS = {
    # Tensor.to_scipy/from_scipy: formats builds Tensors, so tensor.py cannot import
    # formats at its top (also the one ignore_imports of the import-linter contracts)
    ("tensor.py", "ztensor.formats"),
}
MOST_INNER_IMPORTS = 10


def inner_imports():
    """(file, line, module) of every import of a ztensor module inside a function."""
    found = []
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and (
                        sub.level or (sub.module or "").split(".")[0] == "ztensor"):
                    found.append((rel, sub.lineno, sub.module or "."))
                elif isinstance(sub, ast.Import):
                    found += [(rel, sub.lineno, a.name) for a in sub.names
                              if a.name.split(".")[0] == "ztensor"]
    return sorted(set(found))


def test_our_modules_are_imported_at_the_top():
    """House rule 1: an import inside a function hides a cycle (or a layer broken)
    from the reader and from lint-imports' diagnostics; only optional third-party
    packages are imported late."""
    found = inner_imports()
    unexpected = [f"ztensor/{rel}:{line}: {module}" for rel, line, module in found
                  if (rel, module) not in ALLOWED_INNER_IMPORTS]
    assert not unexpected, ("an import of our own module inside a function (house rule 1: "
                            "import it at the top; a cycle means a rule is in the wrong "
                            "layer):\n" + "\n".join(unexpected))
    assert len(found) <= MOST_INNER_IMPORTS


# beside the tests, as test_threat_model finds its document (a wheel's test run copies
# docs/ with tests/)
ARCHITECTURE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def test_every_module_is_in_the_architecture_document():
    """House rule 5: docs/architecture.md names every module, so a newcomer finds
    any rule by following the names from there."""
    text = ARCHITECTURE.read_text("utf-8")
    named = set()   # every word inside backticks
    prose = re.sub(r"```.*?```", "", text, flags=re.S)   # fences are not quotes
    for quoted in re.findall(r"`([^`]+)`", prose):
        named.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", quoted))
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.name == "__init__.py" and len(rel.parts) == 1:
            continue
        if rel.name == "__init__.py":
            found = rel.parent.as_posix() + "/" in text
        else:
            found = rel.stem in named
        if not found:
            missing.append(rel.as_posix())
    assert not missing, f"modules docs/architecture.md does not describe: {missing}"


# House rule 5: the tests mirror the package.  A test module sits at the top of tests/
# (the public modules and the whole-library suites) or in a folder named after the
# subpackage it holds; these folders are named otherwise, each a decision:
TEST_FOLDERS = {
    "native": "_native",   # ztensor/_native's tests: a folder named _native reads as private
    "hostile": None,       # the threat model's promises across modules (docs/threat-model.md)
}
TESTS = pathlib.Path(__file__).resolve().parent


def test_every_test_folder_names_a_subpackage():
    """tests/container/test_reader.py holds ztensor/container/reader.py: a folder of tests
    is a subpackage's name (or one of TEST_FOLDERS), one level deep."""
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        parts = path.relative_to(TESTS).parts
        if len(parts) == 1:
            continue
        subpackage = TEST_FOLDERS.get(parts[0], parts[0])
        placed = len(parts) == 2 and (
            subpackage is None or (PACKAGE / subpackage / "__init__.py").is_file())
        if not placed:
            misplaced.append("/".join(parts))
    assert not misplaced, ("test modules in a folder that is no subpackage of ztensor "
                           f"(house rule 5; or add the folder to TEST_FOLDERS): {misplaced}")


def test_test_module_names_are_unique():
    """No __init__.py in tests/: pytest imports each test module by its file name alone,
    so two folders may not hold the same name."""
    seen = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(path.relative_to(TESTS).as_posix())
    assert not {n: p for n, p in seen.items() if len(p) > 1}
