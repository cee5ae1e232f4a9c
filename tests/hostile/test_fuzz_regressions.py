"""Replay every input that ever broke ztensor (tests/data/fuzz-regressions)."""

import pytest

import ztensor
from conftest import DATA
from sanitizers import CAP_ADDRESS_SPACE

CASES = sorted((DATA / "fuzz-regressions").glob("*.zt"))


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


IMPORTER_CASES = sorted((DATA / "fuzz-regressions" / "importers")
                        .glob("*.bin"))
EXTENSIONS = [".safetensors", ".npy", ".npz", ".gguf"]   # as tools/fuzz/fuzz_importers.py


@pytest.mark.parametrize("path", IMPORTER_CASES, ids=lambda p: p.name)
def test_importer_regression_input(path, tmp_path):
    """First byte picks the file type, the rest is the file (the fuzz target's rule)."""
    from ztensor.tools import convert_inputs as importers

    data = path.read_bytes()
    target = tmp_path / ("input" + EXTENSIONS[data[0] % len(EXTENSIONS)])
    target.write_bytes(data[1:])
    try:
        _, tensors = importers.open_any(target)
        for _ in tensors:
            pass
    except ztensor.ZTensorError:
        pass


REPLAY = CAP_ADDRESS_SPACE + r"""
import io, json, resource, sys, time
from pathlib import Path
import ztensor
from ztensor.tools import cli
from ztensor.tools import convert_inputs as importers
cap_address_space(512 << 20)
slow = []
for path in map(Path, sys.argv[1:]):
    start = time.monotonic()
    try:
        with ztensor.Reader(path, verify=True) as r:
            for name in r.keys():
                obj = r.read(name)
                if obj.format == "quantized_group":
                    ztensor.dequantize(obj)
    except ztensor.ZTensorError:
        pass
    for argv in (["ls", str(path)], ["info", "--json", str(path)], ["verify", "-q", str(path)]):
        out = io.StringIO()
        code = cli.main(argv, out=out)
        assert code in (0, 1, 2), (path.name, argv, code)
        if argv[1] == "--json" and code == 0:
            json.loads(out.getvalue())
        assert "\x1b" not in out.getvalue(), (path.name, argv)
    if time.monotonic() - start > 30:  # a hang, not slowness: s390x emulation runs here
        slow.append(path.name)
assert not slow, slow
print("replayed", len(sys.argv) - 1)
"""


def test_regressions_replay_in_bounded_time_and_memory_through_the_command():
    """Every regression input, read, dequantized and shown by the CLI in a child
    process limited to 512 MiB of address space beyond its imports, 5 s per file."""
    import subprocess
    import sys
    if sys.platform != "linux":
        pytest.skip("RLIMIT_AS and /proc are Linux's")
    proc = subprocess.run([sys.executable, "-c", REPLAY, *map(str, CASES)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and f"replayed {len(CASES)}" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-3000:]
