"""Fuzz target 10 (issue 21): sharded checkpoints.  The input drives
tests/hostile_strategies.py's gen_sharded: shards written by ztensor.Writer or
safetensors, and an index whose weight_map names hostile files ('..%2f', '%2e%2e',
NUL, absolute paths, backslashes, unicode dots, names given twice), odd metadata,
truncated shards.  Opened with open_sharded by index file or by directory (the first
byte says which: one open per input, as every open reads the index): a result or a
ZTensorError, every tensor read fully, no byte of the secret shard above the case
directory, and a weight_map naming a tensor twice is refused.

Speed: an open costs ~40 ms under ASAN, nearly all of it sharded._read_index's
f.read(MAX_INDEX_BYTES + 1), a 256 MiB buffer whatever the index holds (a library
finding, reproduced in tests/hostile/test_hostile_properties.py); writing the shards is
under a millisecond."""
import atheris

from common import LIMITS, run
import hostile  # noqa: E402
from hostile import hs

CTX = hs.Ctx()


def test_one_input(data: bytes):
    if not data:
        return
    case = hs.gen_sharded(hs.ProviderDraw(atheris.FuzzedDataProvider(data[1:])), CTX)
    directory = CTX.fresh_case_dir()
    path = case.write(directory)
    hostile.doors(case, path, directory, LIMITS, only=data[0] & 1)


if __name__ == "__main__":
    run(test_one_input)
