"""Fuzz target 9 (issue 21): every foreign reader on files built from their structure.

The first byte picks the kind (pytorch, safetensors, npy, npz, gguf, hdf5, onnx) and the
mode.  Generated mode (high bit clear): the rest drives tests/hostile_strategies.py's
generator for that kind through a FuzzedDataProvider: the real writer (torch.save,
safetensors, numpy, GGUFWriter, h5py, onnx.helper) makes a valid file from drawn
structure, then drawn mutations rewrite structured fields (pickle opcodes, zip headers,
JSON header fields, npy header dicts, GGUF counts/types/offsets, outward HDF5/ONNX
references).  Raw mode (high bit set): the rest is the file itself, seeded by
seed_structured.py with the real writers' output (not HDF5: libhdf5 is not ours to
harden against arbitrary bytes, so no input of another kind that starts with HDF5's
signature is opened either).  Each file is opened with Reader and open_any; a
result or a ZTensorError, every tensor read fully within the input's byte budget, no
byte of the secret files beside the case directory."""
import atheris

from common import LIMITS, run
import hostile  # noqa: E402
from hostile import hs

KINDS = hs.FOREIGN
EXTENSION = {"pytorch": "model.pt", "safetensors": "model.safetensors", "npy": "array.npy",
             "npz": "arrays.npz", "gguf": "model.gguf", "hdf5": "model.h5",
             "onnx": "model.onnx"}
CTX = hs.Ctx()


def test_one_input(data: bytes):
    if not data:
        return
    kind = KINDS[(data[0] & 0x7F) % len(KINDS)]
    if data[0] & 0x80:
        if kind == "hdf5":
            return
        case = hs.Case(kind, EXTENSION[kind], files={EXTENSION[kind]: data[1:]})
    else:
        case = hs.GENERATORS[kind](hs.ProviderDraw(atheris.FuzzedDataProvider(data[1:])), CTX)
    if hostile.hdf5_by_accident(case):
        return
    directory = CTX.fresh_case_dir()
    path = case.write(directory)
    hostile.doors(case, path, directory, LIMITS)


if __name__ == "__main__":
    run(test_one_input)
