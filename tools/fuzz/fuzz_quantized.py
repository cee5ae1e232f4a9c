"""Fuzz target 6: quantized_group objects whose attributes are any CBOR value
(bits, group_size, packing, pack_order, pack_axis: ints, floats, bignums, strings,
lists, maps), written by the Writer, read back and dequantized.  Every outcome is a
result or a ZTensorError: never TypeError, OverflowError or wrong-sized output."""
import os
import tempfile

import numpy as np

from common import only_ztensor_errors, run, ztensor

import cbor2

KEYS = ("bits", "group_size", "packing", "pack_order", "pack_axis")
GOOD = ztensor.quantize(np.linspace(-1, 1, 8 * 64, dtype=np.float32).reshape(8, 64),
                        bits=4, group_size=32)
DIR = tempfile.mkdtemp(prefix="fuzz-quantized-")


def any_value(fdp):
    choice = fdp.ConsumeIntInRange(0, 4)
    if choice == 0:
        return fdp.ConsumeIntInRange(-3, 40)
    if choice == 1:
        return fdp.PickValueInList([4.0, 2**64, -(2**70), 2**20000, True, None, "4", [4]])
    if choice == 2:
        return fdp.PickValueInList(["8_per_i32", "lsb_first", "msb_first", "4_per_i32", 0, 1])
    try:
        return cbor2.loads(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16)))
    except Exception:  # noqa: BLE001 - not valid CBOR: use a plain value instead
        return 0


def test_one_input(data: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(data)
    attrs = dict(GOOD.attributes)
    for key in KEYS:
        if fdp.ConsumeBool():
            attrs[key] = any_value(fdp)
    comps = dict(GOOD.components)
    if fdp.ConsumeBool():
        comps["g_idx"] = np.frombuffer(fdp.ConsumeBytes(256).ljust(256, b"\0"), "<i4")
    shape = (fdp.ConsumeIntInRange(0, 16), fdp.ConsumeIntInRange(0, 128)) \
        if fdp.ConsumeBool() else GOOD.shape
    t = ztensor.Tensor(comps, shape=shape, format="quantized_group", attributes=attrs)
    path = os.path.join(DIR, "q.zt")
    with only_ztensor_errors():
        out = ztensor.dequantize(t, dtype=np.float32, threads=1)
        assert out.shape == tuple(shape)
    with only_ztensor_errors():
        with ztensor.Writer(path) as w:
            w.write("q", t)
        with ztensor.Reader(path) as r:
            back = r.read("q")
            # by their CBOR: NaN anywhere inside never equals itself as a value
            assert cbor2.dumps(back.attributes, canonical=True) == \
                cbor2.dumps(attrs, canonical=True)
            out = ztensor.dequantize(back, dtype=np.float16, threads=1)
            assert out.shape == tuple(shape)


if __name__ == "__main__":
    run(test_one_input)
