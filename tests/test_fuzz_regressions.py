"""Replay every input that ever broke ztensor (tests/data/fuzz-regressions)."""
from pathlib import Path

import pytest

import ztensor

CASES = sorted((Path(__file__).parent / "data" / "fuzz-regressions").glob("*.zt"))


def test_there_are_regression_inputs():
    assert CASES


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_regression_input_gives_a_result_or_a_ztensor_error(path):
    limits = ztensor.Limits(max_component_size=1 << 24, max_total_decompressed=1 << 26)
    try:
        with ztensor.Reader(path, limits=limits, verify=True) as r:
            for name in r.keys():
                r.read(name)
                r.read(name, copy=True)
            r.verify()
    except ztensor.ZTensorError:
        pass


IMPORTER_CASES = sorted((Path(__file__).parent / "data" / "fuzz-regressions" / "importers")
                        .glob("*.bin"))
EXTENSIONS = [".safetensors", ".npy", ".npz", ".gguf"]   # as tools/fuzz/fuzz_importers.py


@pytest.mark.parametrize("path", IMPORTER_CASES, ids=lambda p: p.name)
def test_importer_regression_input(path, tmp_path):
    """First byte picks the file type, the rest is the file (the fuzz target's rule)."""
    from ztensor import importers

    data = path.read_bytes()
    target = tmp_path / ("input" + EXTENSIONS[data[0] % len(EXTENSIONS)])
    target.write_bytes(data[1:])
    try:
        _, tensors = importers.open_any(target)
        for _ in tensors:
            pass
    except ztensor.ZTensorError:
        pass
