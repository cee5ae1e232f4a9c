"""Fuzz target 13 (issue 21): the exporters on hostile inputs.  The first byte picks
the input's kind (the foreign generators of tests/hostile_strategies.py, not HDF5:
libhdf5 is not ours to harden) and the output's format (.zt, .safetensors, .npz,
.gguf); the rest drives the generator, so the input is a real writer's file with
lying fields (torch.save views of any stride, offset or expansion; safetensors
headers; npy dicts; GGUF types and values; ONNX initializers).  ztensor.convert
either refuses with a ZTensorError and leaves no file, or writes a file whose every
tensor reads back as the input's: same name, shape, dtype and bytes
(hostile_strategies.export_round_trips_or_writes_nothing)."""
import atheris

from common import LIMITS, run
import hostile  # noqa: E402
from hostile import hs

KINDS = [k for k in hs.FOREIGN if k != "hdf5"]
CTX = hs.Ctx()


def test_one_input(data: bytes):
    if not data:
        return
    kind = KINDS[(data[0] & 0x0F) % len(KINDS)]
    suffix = hs.EXPORTS[(data[0] >> 4) % len(hs.EXPORTS)]
    case = hs.GENERATORS[kind](hs.ProviderDraw(atheris.FuzzedDataProvider(data[1:])), CTX)
    if hostile.hdf5_by_accident(case):
        return
    directory = CTX.fresh_case_dir()
    path = case.write(directory)
    hs.export_round_trips_or_writes_nothing(path, directory, suffix, LIMITS, 16 << 20)


if __name__ == "__main__":
    run(test_one_input)
