"""Fuzz target 4: the converters' parsers (safetensors header, npy, npz, gguf) on an
arbitrary file, every tensor pulled through."""
import os
import tempfile

from common import only_ztensor_errors, run
from ztensor import importers

EXTENSIONS = [".safetensors", ".npy", ".npz", ".gguf"]
DIR = tempfile.mkdtemp(prefix="ztensor-fuzz-")


def test_one_input(data: bytes):
    if not data:
        return
    path = os.path.join(DIR, "input" + EXTENSIONS[data[0] % len(EXTENSIONS)])
    with open(path, "wb") as f:
        f.write(data[1:])
    with only_ztensor_errors():
        _, tensors = importers.open_any(path)
        for _, tensor in tensors:
            for arr in tensor.components.values():
                arr.sum() if arr.dtype.kind in "biuf" else None


if __name__ == "__main__":
    run(test_one_input)
