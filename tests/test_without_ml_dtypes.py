"""Without ml_dtypes, bf16 and FP8 still come back usable: read_numpy decodes them
to float32 (exactly), read() keeps their bit patterns with the type named."""
import numpy as np
import pytest

import ztensor

ml_dtypes = pytest.importorskip("ml_dtypes")  # the oracle for the decoded values


def test_fp8_reads_decode_to_float32(tmp_path, no_ml_dtypes):
    f8 = np.array([0.5, -448, 1e-3, 2], np.float32).astype(ml_dtypes.float8_e4m3fn)
    with ztensor.Writer(tmp_path / "x.zt") as w:
        w.write("f8", ztensor.Tensor({"data": f8.view(np.uint8)}, types={"data": "f8_e4m3fn"}))
    with ztensor.Reader(tmp_path / "x.zt") as r:
        got = r.read_numpy("f8")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, f8.astype(np.float32))
        t = r.read("f8")
        assert t.components["data"].dtype == np.uint8 and t.types == {"data": "f8_e4m3fn"}


def test_bf16_storage_decodes_to_float32(tmp_path, no_ml_dtypes):
    bf = np.array([1.5, -2.25, 3e38, 1e-40], np.float32).astype(ml_dtypes.bfloat16)
    blob = bf.view("<u2").tobytes()
    import cbor2, struct
    m = cbor2.dumps({"version": "1.2.0", "objects": {"b": {"shape": [4], "format": "dense",
                     "components": {"data": {"dtype": "bf16", "offset": 64, "length": 8}}}}})
    data = b"ZTEN1000" + bytes(56) + blob + m + struct.pack("<Q", len(m)) + b"ZTEN1000"
    with ztensor.Reader(data) as r:
        got = r["b"]
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, bf.astype(np.float32))
        assert r.read("b").components["data"].dtype == np.dtype("<u2")
