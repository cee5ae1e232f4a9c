"""Fuzz target 1: an arbitrary byte string opened as a .zt file (v1.2, v1.1, v0.1),
every object read every way, dense ones sliced (zstd seek tables) and read as one
batch, every digest verified.  Seed corpus: tests/data."""
import os
import tempfile

from common import LIMITS, only_ztensor_errors, run, ztensor

# safe_open takes a path (safetensors' rule): each input is written to this one file
INPUT_FILE = os.path.join(tempfile.mkdtemp(prefix="fuzz_reader-"), "input.zt")


def test_one_input(data: bytes):
    with only_ztensor_errors():
        with ztensor.Reader(data, limits=LIMITS) as r:
            for name in r.keys():
                obj = r.read(name)
                r.read(name, copy=True)
                if r.metadata(name).format == "dense":
                    r.read_numpy(name)
                    r.read_numpy(name, copy=True)
                    r.read_numpy(name, dtype="float32")
                if obj.format == "quantized_group":
                    ztensor.dequantize(obj, threads=1)
            dense = [n for n in r.keys() if r.metadata(n).format == "dense"]
            r.read_numpy(dense, copy=True, threads=1)  # the batch path (batch.py)
            r.verify()
        with open(INPUT_FILE, "wb") as out:
            out.write(data)
        with ztensor.safe_open(INPUT_FILE, framework="np") as f:
            for name in f.keys():
                part = f.get_slice(name)
                shape = part.get_shape()
                if shape and shape[0]:
                    part[shape[0] // 2]


if __name__ == "__main__":
    run(test_one_input)
