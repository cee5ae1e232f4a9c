"""Shared by the structure-aware fuzz targets (issue 21): the generators of
tests/hostile_strategies.py, driven by libFuzzer's bytes, and the checks of its
properties.  Import after common (which instruments ztensor)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests"))
import hostile_strategies as hs  # noqa: E402

import ztensor  # noqa: E402


HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def hdf5_by_accident(case):
    """True when a case not made by h5py would still reach libhdf5: the readers tell
    HDF5 by its signature whatever the name, and libhdf5 is not ours to harden
    against arbitrary bytes (a crash there kills the run)."""
    return case.kind != "hdf5" and case.files.get(case.main, b"").startswith(HDF5_SIGNATURE)


def doors(case, path, directory, limits, only=None):
    """Open ``path`` every way its kind allows (or only way number ``only``); each a
    result or a ZTensorError, and an input that must be refused is."""
    most = hs.budget(directory, limits)
    if case.kind == "sharded":
        ways = [lambda: hs.read_through_sharded(path, most),
                lambda: hs.read_through_sharded(directory, most)]
    else:
        ways = [lambda: hs.read_through_reader(path, limits, most),
                lambda: hs.read_through_open_any(path, most)]
    if only is not None:
        ways = [ways[only % len(ways)]]
    for way in ways:
        try:
            way()
        except ztensor.ZTensorError:
            continue
        if case.must_refuse:
            raise hs.Breach(f"opened although {case.must_refuse}: {case!r}")
