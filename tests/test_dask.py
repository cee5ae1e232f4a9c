"""ztensor.dask: lazily chunked dask arrays over tensors, computed in this process and
by a dask.distributed LocalCluster with worker processes (the graph carries only the
path and row ranges)."""
import numpy as np
import pytest

import ztensor

da = pytest.importorskip("dask.array")
zdask = pytest.importorskip("ztensor.dask")
RNG = np.random.default_rng(9)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dask") / "d.zt"
    with ztensor.Writer(str(path)) as w:
        w.write_numpy("w", RNG.standard_normal((1000, 33)).astype(np.float32))
        w.write_numpy("z", np.arange(5000, dtype=np.int64).reshape(100, 50), compress=True)
        w.write_numpy("bf", np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8), type="bf16")
        w.write_numpy("s", np.float64(2.5))
        w.write_numpy("e", np.zeros((0, 3), np.int8))
    return str(path)


def test_chunks_and_values(path):
    with ztensor.Reader(path) as r:
        expected = {n: r.read_numpy(n) for n in r.keys()}
    arr = zdask.from_zt(path, "w", rows=128)
    assert arr.chunks[0] == (128,) * 7 + (104,) and arr.chunks[1] == (33,)
    np.testing.assert_array_equal(arr.compute(), expected["w"])
    np.testing.assert_allclose(arr.sum(axis=0).compute(), expected["w"].sum(axis=0), rtol=1e-5)
    everything = zdask.from_zt_all(path, rows=7)
    for name, lazy in everything.items():
        got = lazy.compute()
        assert got.shape == expected[name].shape and got.dtype == lazy.dtype, name
        np.testing.assert_array_equal(np.asarray(got, np.float64),
                                      np.asarray(expected[name], np.float64))


def test_local_cluster_with_worker_processes(path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        arr = zdask.from_zt(path, "w", rows=100)
        total = client.compute(arr.astype(np.float64).sum()).result()
        pids = set(client.run(lambda: __import__("os").getpid()).values())
    with ztensor.Reader(path) as r:
        assert total == pytest.approx(float(r.read_numpy("w").astype(np.float64).sum()))
    assert len(pids) == 2
