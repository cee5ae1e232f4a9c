"""Fuzz target 3: the sparse validators, with arbitrary shapes and index arrays, then
scipy conversion of whatever passes (a passing object must be safe to index with)."""
import numpy as np

from common import only_ztensor_errors, run, ztensor
from ztensor.formats import sparse

INTS = [np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64]


def ints(fdp, max_items=64):
    dtype = np.dtype(fdp.PickValueInList(INTS))
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, max_items) * dtype.itemsize)
    return np.frombuffer(raw[:len(raw) // dtype.itemsize * dtype.itemsize], dtype)


def test_one_input(data: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(data)
    fmt = fdp.PickValueInList(list(sparse.FORMATS))
    ndim = 2 if fmt == "sparse_csr" else fdp.ConsumeIntInRange(1, 3)
    shape = tuple(fdp.ConsumeIntInRange(0, 20) for _ in range(ndim))
    values = np.arange(fdp.ConsumeIntInRange(0, 40), dtype=np.float32)
    comps = {"values": values}
    if fmt == "sparse_csr":
        comps["indices"], comps["indptr"] = ints(fdp), ints(fdp)
    else:
        comps["coords"] = ints(fdp, 128)
    t = ztensor.Tensor(comps, shape=shape, format=fmt)
    with only_ztensor_errors():
        sparse.validate(t)
        if ndim == 2:
            matrix = sparse.to_scipy(t)
            assert matrix.shape == shape
            matrix.toarray()


if __name__ == "__main__":
    run(test_one_input)
