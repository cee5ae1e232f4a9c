"""Shared set-up of the fuzz targets: atheris, the instrumented package, and the one
rule every target checks: an input gives a result or a ZTensorError, nothing else."""
import contextlib
import os
import sys

import atheris

# atheris instruments only what is imported inside this block: import every module
# a target reaches, lazily imported ones included
with atheris.instrument_imports(include=["ztensor"]):
    import ztensor
    import ztensor.foreign.gguf_file  # noqa: F401
    import ztensor.tools.convert_inputs  # noqa: F401
    import ztensor.container.legacy  # noqa: F401
    import ztensor.foreign.numpy_files  # noqa: F401
    import ztensor.foreign.pytorch  # noqa: F401
    import ztensor.foreign.safetensors_file  # noqa: F401
    import ztensor.foreign.hdf5_file  # noqa: F401
    import ztensor.foreign.onnx_file  # noqa: F401
    import ztensor.foreign.names  # noqa: F401
    import ztensor.sharded  # noqa: F401
    import ztensor.io.source  # noqa: F401
    import ztensor.io.atomic  # noqa: F401
    import ztensor.foreign.export  # noqa: F401
    import ztensor.tools.convert  # noqa: F401

# a fuzzed file may declare large sizes legitimately; keep them small enough that the
# run measures bugs, not RAM (allocations beyond these are bugs)
LIMITS = ztensor.Limits(max_component_size=1 << 24, max_total_decompressed=1 << 26,
                        max_manifest_size=1 << 22)


@contextlib.contextmanager
def only_ztensor_errors():
    try:
        yield
    except ztensor.ZTensorError:
        pass


def run(test_one_input):
    assert "build/fuzz" in ztensor.__file__ or os.environ.get("ZTENSOR_FUZZ_UNSANITIZED"), (
        "run with PYTHONPATH=build/fuzz (tools/fuzz/build.sh) so C code is sanitized")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
