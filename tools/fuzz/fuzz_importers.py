"""Fuzz target 4: the converters' parsers on an arbitrary file, every tensor pulled
through (tests/hostile_strategies.py's check_array: every distinct element read, the
memory it holds within the input's budget).  The first byte picks the file's
extension; the readers tell the format by the bytes (safetensors header, npy, npz
and PyTorch zips, GGUF), and by the extension for a legacy (pre-zip) PyTorch pickle
(.pt, .pth) and ONNX (.onnx).

Not HDF5: a file that starts with HDF5's signature is skipped whatever its name
(sniffed by its bytes, it would go to libhdf5, which can crash the process on
arbitrary bytes and is not ours to harden; fuzz_foreign_structured gives h5py's
reader files that h5py wrote)."""
import os
import tempfile

from common import LIMITS, only_ztensor_errors, run
from hostile import HDF5_SIGNATURE, hs
from ztensor.tools import convert_inputs

# indices 0-3 as before: the seeds of seed_importers.py keep their meaning
EXTENSIONS = [".safetensors", ".npy", ".npz", ".gguf", ".pt", ".pth", ".onnx"]
DIR = tempfile.mkdtemp(prefix="ztensor-fuzz-")


def test_one_input(data: bytes):
    if not data or data[1:9] == HDF5_SIGNATURE:
        return
    path = os.path.join(DIR, "input" + EXTENSIONS[data[0] % len(EXTENSIONS)])
    with open(path, "wb") as f:
        f.write(data[1:])
    # what a tensor may hold: the component limit, or deflate's ceiling over the input;
    # a stride-0 view of a huge shape holds its one element, and is read as that
    most = max(LIMITS.max_component_size, 1032 * len(data))
    with only_ztensor_errors():
        _, tensors = convert_inputs.open_any(path)
        for key, tensor in tensors:
            for role, arr in tensor.components.items():
                hs.check_array(arr, most, f"{key!r}.{role}")


if __name__ == "__main__":
    run(test_one_input)
