"""sparse_csr / sparse_coo: every rule checked on read and write, scipy both ways."""
import numpy as np
import pytest

import ztensor
from ztensor.formats import sparse


def csr(values=(1.5, -2.0, 3.25), indices=(0, 3, 1), indptr=(0, 2, 2, 3), shape=(3, 4)):
    return ztensor.Tensor({"values": np.array(values, np.float32),
                           "indices": np.array(indices), "indptr": np.array(indptr)},
                          shape=shape, format="sparse_csr")


def coo(values=(7.0, -8.5), coords=(0, 2, 3, 1), shape=(3, 4)):
    return ztensor.Tensor({"values": np.array(values, np.float32), "coords": np.array(coords)},
                          shape=shape, format="sparse_coo")


def test_round_trip_as_u64(tmp_path):
    with ztensor.Writer(tmp_path / "s.zt") as w:
        w.write("csr", csr(), checksum="crc32c")
        w.write("coo", coo(), compress=True)
    with ztensor.Reader(tmp_path / "s.zt", verify=True) as r:
        got = r.read("csr")
        assert r.metadata("csr").components["indptr"].dtype == "u64"
        assert got.components["indices"].tolist() == [0, 3, 1]
        assert got.components["indptr"].tolist() == [0, 2, 2, 3]
        assert r.read("coo").components["coords"].tolist() == [0, 2, 3, 1]


@pytest.mark.parametrize("bad,words", [
    (csr(indptr=(1, 2, 2, 3)), "from 0 to nnz"),
    (csr(indptr=(0, 2, 2, 4)), "from 0 to nnz"),
    (csr(indptr=(0, 3, 2, 3)), "decreases"),
    (csr(indptr=(0, 2, 3)), "rows need 4"),
    (csr(indices=(0, 4, 1)), r"\[0, 4\)"),
    (csr(indices=(0, 1)), "values has 3"),
    (csr(shape=(3,)), "2-D"),
    (coo(coords=(0, 2, 3, 4)), "axis 1"),
    (coo(coords=(3, 2, 3, 1)), "axis 0"),
    (coo(coords=(0, 2, 3)), "need 4"),
])
def test_violations_are_refused_on_write_and_read(tmp_path, bad, words):
    with ztensor.Writer(tmp_path / "w.zt") as w:
        with pytest.raises(ztensor.FormatError, match=words):
            w.write("x", bad)
    # the same object in a file (written around the writer's check) fails on read
    with pytest.raises(ztensor.FormatError, match=words):
        sparse.validate(bad)


def test_lying_file_is_refused_on_read(tmp_path):
    good = csr()
    with ztensor.Writer(tmp_path / "l.zt") as w:
        w.write("csr", good)
    with ztensor.Reader(tmp_path / "l.zt") as r:
        comp = r.metadata("csr").components["indices"]
    data = bytearray((tmp_path / "l.zt").read_bytes())
    data[comp.offset + 8] = 9          # column 3 -> 9, beyond the 4 columns
    with ztensor.Reader(bytes(data)) as r:
        with pytest.raises(ztensor.FormatError, match="indices must lie") as info:
            r.read("csr")
        assert "'csr'" in str(info.value)


def test_scipy_both_ways(tmp_path):
    sp = pytest.importorskip("scipy.sparse")
    dense = np.array([[0, 1.5, 0, 0], [0, 0, 0, 0], [2.0, 0, 0, -3.0]], np.float32)
    with ztensor.Writer(tmp_path / "sp.zt") as w:
        w.write("csr", ztensor.Tensor.from_scipy(sp.csr_array(dense)))
        w.write("csc", ztensor.Tensor.from_scipy(sp.csc_array(dense)))    # converted to CSR
        w.write("coo", ztensor.Tensor.from_scipy(sp.coo_array(dense)))
    with ztensor.Reader(tmp_path / "sp.zt") as r:
        for name in ("csr", "csc", "coo"):
            back = sparse.to_scipy(r.read(name))
            np.testing.assert_array_equal(back.toarray(), dense)
        assert r.metadata("coo").format == "sparse_coo"


def test_writer_takes_scipy_and_reader_gives_scipy(tmp_path):
    sp = pytest.importorskip("scipy.sparse")
    # sp.random, not random_array (scipy >= 1.12): Debian 12's scipy 1.10 runs this too
    matrix = sp.csr_array(sp.random(20, 30, density=0.1, random_state=1, format="csr",
                                    dtype=np.float64))
    with ztensor.Writer(tmp_path / "m.zt") as w:
        w.write("m", matrix, compress=True)
        w.write("c", matrix.tocoo())
    with ztensor.Reader(tmp_path / "m.zt") as r:
        back = r.read_sparse("m")
        assert r.metadata("c").format == "sparse_coo"
        np.testing.assert_array_equal(back.toarray(), matrix.toarray())
        np.testing.assert_array_equal(r.read("c").to_scipy().toarray(), matrix.toarray())
