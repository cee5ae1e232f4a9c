"""Fuzz target 2: dequantize and the FP8/bf16 conversions driven with arbitrary
metadata (bits, group size, shape, component sizes and dtypes) and buffers; the v2
kernels (deterministic-CBOR check, XXH3-64) on arbitrary bytes, C against the numpy
twin."""
import numpy as np

from common import only_ztensor_errors, run, ztensor
from ztensor import kernels
from ztensor._native import fallback as _fallback
from ztensor.io import floats

FLOATS = [np.float16, np.float32, np.uint16]          # uint16: bf16 bit patterns


def array(fdp, dtype, max_items=512):
    n = fdp.ConsumeIntInRange(0, max_items)
    raw = fdp.ConsumeBytes(n * np.dtype(dtype).itemsize)
    return np.frombuffer(raw[:len(raw) // np.dtype(dtype).itemsize * np.dtype(dtype).itemsize],
                         dtype)


def test_one_input(data: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 4)
    if which == 0:
        shape = (fdp.ConsumeIntInRange(0, 40), fdp.ConsumeIntInRange(0, 300))
        comps = {"packed_weight": array(fdp, np.int32).reshape(-1)}
        comps["scales"] = array(fdp, FLOATS[fdp.ConsumeIntInRange(0, 2)])
        if fdp.ConsumeBool():
            comps["zeros"] = array(fdp, FLOATS[fdp.ConsumeIntInRange(0, 2)])
        if fdp.ConsumeBool():
            comps["g_idx"] = array(fdp, np.int32)
        attrs = {"bits": fdp.PickValueInList([1, 2, 3, 4, 8, 16, None]),
                 "group_size": fdp.PickValueInList([0, 1, 3, 8, 32, 128, -1, None])}
        t = ztensor.Tensor(comps, shape=shape, format="quantized_group", attributes=attrs)
        with only_ztensor_errors():
            out = fdp.PickValueInList([np.float32, np.float16, "bfloat16"])
            ztensor.dequantize(t, dtype=out, threads=fdp.ConsumeIntInRange(1, 3))
    elif which == 1:
        kind = fdp.PickValueInList(["f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz"])
        codes = np.frombuffer(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)), np.uint8)
        floats.fp8_to_float(codes, kind, fdp.PickValueInList([np.float32, np.float16]))
        values = array(fdp, fdp.PickValueInList([np.float32, np.float16]), 2048)
        floats.float_to_fp8(values, kind)
    elif which == 2:
        floats.bf16_to_float32(array(fdp, np.uint16, 4096))
        floats.float32_to_bf16(array(fdp, np.float32, 4096))
    elif which == 4:  # the v2 kernels: one verdict, one hash, from both backends
        raw = np.frombuffer(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)), np.uint8)
        assert kernels.xxh3_64(raw) == _fallback.xxh3_64(raw)
        verdicts = []
        for impl in (kernels, _fallback):
            try:
                impl.cbor_check_canonical(raw, 32)
                verdicts.append("ok")
            except ztensor.FormatError as exc:
                verdicts.append(str(exc))
        assert verdicts[0] == verdicts[1], verdicts
    else:  # GGUF blocks: any bytes, any type id, any shape
        blocks = np.frombuffer(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 8192)), np.uint8)
        attrs = {"ggml_type_id": fdp.PickValueInList([2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 9,
                                                      34, -1, "8", None])}
        t = ztensor.Tensor({"blocks": blocks}, shape=(fdp.ConsumeIntInRange(0, 4096),),
                           format="gguf_blocks", attributes=attrs)
        with only_ztensor_errors():
            ztensor.dequantize(t, dtype=fdp.PickValueInList([np.float32, np.float16,
                                                             "bfloat16"]))


if __name__ == "__main__":
    run(test_one_input)
