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
