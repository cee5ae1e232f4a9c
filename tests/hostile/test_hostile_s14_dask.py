"""Session 14: ztensor.dask against a file that changes under it, and against a
checkpoint of many tensors.  Each test says what broke and names the one function
that keeps its rule.  Work is counted (opens, requests), never timed."""

import json
import os

import numpy as np
import pytest
from http_servers import web  # noqa: F401  (a fixture)

import ztensor
import ztensor.numpy as znp
from ztensor.container import reader as reader_module

pytest.importorskip("dask")
zdask = pytest.importorskip("ztensor.dask")

UNVERSIONED = {"ztensor_allow_unversioned": True}


def _bytes_of(tmp_path, tensors, name="f.zt"):
    path = tmp_path / name
    znp.save_file(tensors, str(path))
    return path.read_bytes()


def _checkpoint(tmp_path, count, per_shard=50):
    """A sharded checkpoint of ``count`` small tensors, ``per_shard`` to a shard."""
    tensors = {f"layer.{i:05d}.weight": np.full(4, i, np.float32) for i in range(count)}
    folder = tmp_path / "ckpt"
    shards = ztensor.save_sharded(tensors, folder, max_shard_size=16 * per_shard)
    index = next(n for n in os.listdir(folder) if n.endswith(".index.json"))
    return tensors, folder, index, len(shards)


# ----------------------------------------------------------------- unversioned URLs
def test_unversioned_url_replaced_by_another_size_is_refused(web, tmp_path):  # noqa: F811
    """A server naming no version (read with ztensor_allow_unversioned): the
    array's identity was None, so chunks checked only shape and dtype, and a file
    swapped for one of another size between chunks gave one array of both files'
    rows (row sums [0, 0, 1000, 1000]).  docs/remote.md says a change of size is
    seen; the size is now the identity (source.file_version), and a chunk of the other
    file is the ClosedError a versioned change gives (dask._read)."""
    first = _bytes_of(tmp_path, {"w": np.zeros((4, 1000), np.float32)})
    other = _bytes_of(
        tmp_path,
        {"w": np.ones((4, 1000), np.float32), "pad": np.zeros(100, np.uint8)},
        "g.zt",
    )
    assert len(first) != len(other)
    server = web(versioned=False)
    server.files["/m.zt"] = first
    url = server.url("/m.zt")
    arr = zdask.from_zt(url, "w", rows=1, storage_options=UNVERSIONED)
    assert [float(arr[i].compute(scheduler="synchronous").sum()) for i in range(2)] == [0, 0]
    server.files["/m.zt"] = other
    for i in (2, 3):
        with pytest.raises(ztensor.ClosedError, match="changed") as err:
            arr[i].compute(scheduler="synchronous")
        assert url in str(err.value) and "'w'" in str(err.value)
    # a new array reads the new file
    again = zdask.from_zt(url, "w", rows=1, storage_options=UNVERSIONED)
    np.testing.assert_array_equal(again.compute(scheduler="threads"), np.ones((4, 1000)))


def test_unversioned_url_unchanged_reads_whole(web, tmp_path):  # noqa: F811
    """The size as identity refuses nothing that did not change: every chunk of an
    unchanged file reads, each through its own handle (dask._Handles.acquire)."""
    want = np.arange(40, dtype=np.float32).reshape(10, 4)
    server = web(versioned=False)
    server.files["/m.zt"] = _bytes_of(tmp_path, {"w": want})
    arr = zdask.from_zt(server.url("/m.zt"), "w", rows=3, storage_options=UNVERSIONED)
    for scheduler in ("synchronous", "threads"):
        np.testing.assert_array_equal(arr.compute(scheduler=scheduler), want)


# ----------------------------------------------------------------- from_zt_all
@pytest.fixture
def opens(monkeypatch):
    """Every Reader opened (safe_open's and the checkpoint's shards' included),
    by path, and every identity looked up (source.file_version, through dask), by path."""
    seen = {"readers": [], "identities": []}
    init, identity = reader_module.Reader.__init__, zdask.file_version

    def counting_init(self, source, *args, **kwargs):
        seen["readers"].append(os.fspath(source))
        return init(self, source, *args, **kwargs)

    def counting_identity(source, storage_options=None):
        seen["identities"].append(source)
        return identity(source, storage_options)

    monkeypatch.setattr(reader_module.Reader, "__init__", counting_init)
    monkeypatch.setattr(zdask, "file_version", counting_identity)
    return seen


def test_from_zt_all_opens_each_shard_once(tmp_path, opens):
    """from_zt_all called from_zt per tensor, which read the index, opened the
    tensor's shard twice (checked, then safe_open) and looked up its identity: 2000
    tensors in 40 shards, 4040 opens.  Now the index and each shard are opened once
    for the whole graph (dask._arrays_of), with the same checks, and the arrays
    come in the index's order."""
    tensors, folder, index, shards = _checkpoint(tmp_path, 300)
    assert shards == 6
    for source in (folder, folder / index):
        opens["readers"].clear()
        opens["identities"].clear()
        arrays = zdask.from_zt_all(source, rows=2)
        assert list(arrays) == list(tensors)
        assert len(opens["readers"]) == shards == len(set(opens["readers"]))
        assert sorted(opens["identities"]) == sorted(opens["readers"])
        for name in ("layer.00000.weight", "layer.00299.weight"):
            np.testing.assert_array_equal(arrays[name].compute(scheduler="threads"), tensors[name])


def test_from_zt_all_of_one_file_opens_it_once(tmp_path, opens):
    """A single file: one open and one identity, however many tensors."""
    tensors = {f"t{i}": np.full((3, 2), i, np.int16) for i in range(200)}
    path = str(tmp_path / "one.zt")
    znp.save_file(tensors, path)
    arrays = zdask.from_zt_all(path, rows=1)
    assert opens["readers"] == [path] and opens["identities"] == [path]
    assert sorted(arrays) == sorted(tensors)
    np.testing.assert_array_equal(arrays["t7"].compute(scheduler="synchronous"), tensors["t7"])


def test_from_zt_all_over_http_asks_per_shard_not_per_tensor(web, tmp_path):  # noqa: F811
    """Over HTTP, 400 tensors took 5,242 requests (the index 802 times).  Now the
    index is read once and each shard costs one open plus its identity's request
    (dask._arrays_of), and one question of the index's version."""
    tensors, folder, index, shards = _checkpoint(tmp_path, 400)
    server = web()
    for name in os.listdir(folder):
        server.files["/ck/" + name] = (folder / name).read_bytes()
    shard = next(n for n in os.listdir(folder) if n.endswith(".zt"))
    ztensor.Reader(server.url("/ck/" + shard)).close()
    one_open = len(server.requests)
    server.requests.clear()
    index_alone = ztensor.open_sharded(server.url("/ck/" + index))
    index_alone.close()
    index_requests = len(server.requests)
    server.requests.clear()

    arrays = zdask.from_zt_all(server.url("/ck/" + index), rows=2)
    assert list(arrays) == list(tensors)
    # read once, then asked its version (a HEAD) once per shard opened, so that no
    # shard of a newer release is read under it (sharded.ShardedReader._open_checked)
    assert server.requests.count("/ck/" + index) == index_requests + shards
    per_shard = [server.requests.count("/ck/" + n) for n in os.listdir(folder) if n != index]
    assert len(per_shard) == shards and max(per_shard) <= one_open + 1
    np.testing.assert_array_equal(
        arrays["layer.00399.weight"].compute(scheduler="synchronous"), tensors["layer.00399.weight"]
    )


def test_from_zt_all_holds_each_shard_to_its_version(web, tmp_path):  # noqa: F811
    """Each shard's identity is taken once and travels with every array of it: a
    shard replaced after the graph was made is the ClosedError from_zt gives."""
    tensors, folder, index, _ = _checkpoint(tmp_path, 100)
    server = web()
    for name in os.listdir(folder):
        server.files["/ck/" + name] = (folder / name).read_bytes()
    arrays = zdask.from_zt_all(server.url("/ck/" + index), rows=2)
    first = "layer.00000.weight"
    with ztensor.open_sharded(folder) as ck:
        shard = ck.file_of(first)
        names = ck.names_in(shard)
    replaced = {n: tensors[n] + 1 for n in names}
    server.files["/ck/" + shard] = _bytes_of(tmp_path, replaced, "replaced.zt")
    with pytest.raises(ztensor.ClosedError, match="changed") as err:
        arrays[first].compute(scheduler="synchronous")
    assert shard in str(err.value) and repr(first) in str(err.value)


def test_from_zt_all_keeps_the_checkpoint_checks(tmp_path):
    """The checks from_zt makes for one tensor hold for all: an index placing a
    tensor in a shard that does not hold it is a FormatError naming the index
    (ShardedReader.open_shard), a plan of too many chunks a LimitError naming the
    shard and the object (dask._plan), bad chunking a ValueError."""
    tensors, folder, index, _ = _checkpoint(tmp_path, 100)
    index_path = folder / index
    doc = json.loads(index_path.read_text())
    files = sorted(set(doc["weight_map"].values()))
    moved = next(n for n, f in doc["weight_map"].items() if f == files[0])
    doc["weight_map"][moved] = files[1]
    index_path.write_text(json.dumps(doc))
    for call in (lambda: zdask.from_zt(folder, moved), lambda: zdask.from_zt_all(folder)):
        with pytest.raises(ztensor.FormatError) as err:
            call()
        assert str(index_path) in str(err.value) or str(folder) in str(err.value)

    tensors, folder, index, _ = _checkpoint(tmp_path / "two", 100)
    with pytest.raises(ztensor.LimitError, match="max_chunks") as err:
        zdask.from_zt_all(folder, rows=1, max_chunks=3)
    assert "layer.00000.weight" in str(err.value) and str(folder) in str(err.value)
    for bad in ({"rows": 0}, {"rows": True}, {"chunk_bytes": 0}):
        with pytest.raises(ValueError):
            zdask.from_zt_all(folder, **bad)
    with pytest.raises(TypeError):
        zdask.from_zt_all(folder, row=1)  # a misspelt keyword, as from_zt refuses it
