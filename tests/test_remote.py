"""Remote range reads against a real HTTP server on loopback (nginx from Debian's
packages; .ci/run installs it): only the footer, the manifest and the components
asked for travel, counted from nginx's own access log."""
import os
import time

import numpy as np
import pytest

import ztensor

from http_servers import NGINX, nginx

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed "
                                "(.ci/run installs it: apt-get install nginx-light)")


@pytest.fixture
def server(tmp_path):
    with nginx(tmp_path) as (url, www, log):
        def served():
            text = log.read_text() if log.exists() else ""
            return sum(int(line.split()[3]) for line in text.splitlines() if line.strip())
        yield url, www, served


def test_one_tensor_of_a_large_file_costs_that_tensor_and_the_manifest(server):
    url, www, served = server
    with ztensor.Writer(www / "big.zt") as w:
        for i in range(48):
            w.write_numpy(f"t{i}", np.full(1 << 18, i, np.float32))   # 1 MiB each
    size = os.path.getsize(www / "big.zt")
    with ztensor.Reader(f"{url}/big.zt") as r:
        time.sleep(0.2)
        after_open = served()
        assert after_open < 16 << 10                       # footer and manifest
        arr = r.read_numpy("t7")
        assert (arr == 7).all()
    time.sleep(0.2)                                        # nginx writes its log after
    total = served()
    assert total - after_open == 1 << 20                   # exactly that tensor
    assert total < (1 << 20) + (16 << 10) and total < size // 40


def test_opening_a_url_asks_for_each_piece_once(server):
    """Each read of a URL is a round trip: opening a .zt file asks for its size (HEAD),
    its header, its footer and its manifest, once each.  The header was asked for
    twice (the v2 check and the footer check each read it)."""
    url, www, _ = server
    with ztensor.Writer(www / "m.zt") as w:
        for i in range(20):
            w.write_numpy(f"t{i}", np.arange(1000, dtype=np.float32))
    size = os.path.getsize(www / "m.zt")
    with ztensor.Reader(f"{url}/m.zt") as r:
        assert len(r.keys()) == 20
    time.sleep(0.2)  # nginx writes its log after
    lines = (www.parent / "access.log").read_text().splitlines()
    asked = [(line.split()[0], line.split('"')[1]) for line in lines]
    assert asked[0] == ("HEAD", "-")
    assert [a for a in asked if a[0] == "GET"][:1] == [("GET", "bytes=0-7")]
    assert ("GET", f"bytes={size - 16}-{size - 1}") in asked
    assert len(asked) == 4 and len(set(asked)) == 4


def test_verify_and_zstd_over_http(server):
    url, www, served = server
    with ztensor.Writer(www / "z.zt") as w:
        w.write_numpy("z", np.arange(100_000, dtype=np.int64), compress=True,
                      checksum="sha256")
    with ztensor.Reader(f"{url}/z.zt", verify=True) as r:
        assert r.verify() == 1 and r["z"][99_999] == 99_999


def test_a_lying_server_is_a_clean_error(server):
    url, www, served = server
    with ztensor.Writer(www / "m.zt") as w:
        w.write_numpy("a", np.arange(10))
    r = ztensor.Reader(f"{url}/m.zt")
    (www / "m.zt").write_bytes(b"short")                   # the file changes under us
    with pytest.raises((ztensor.ZTensorError, OSError)):
        r["a"]
    with pytest.raises(FileNotFoundError):
        ztensor.Reader(f"{url}/missing.zt")


def test_many_tensors_coalesced_into_few_concurrent_requests(server):
    url, www, served = server
    tensors = {f"t{i:02d}": np.full(25_000, i, np.float32) for i in range(40)}  # 100 KB each
    with ztensor.Writer(www / "many.zt") as w:
        for name, arr in tensors.items():
            w.write_numpy(name, arr)
    wanted = [f"t{i:02d}" for i in range(5, 25)]
    with ztensor.Reader(f"{url}/many.zt") as r:
        time.sleep(0.2)
        log = www.parent / "access.log"
        requests_before, bytes_before = len(log.read_text().splitlines()), served()
        out = r.read_numpy(wanted, copy=True)
        time.sleep(0.2)
        requests = len(log.read_text().splitlines()) - requests_before
        fetched = served() - bytes_before
    for name in wanted:
        np.testing.assert_array_equal(out[name], tensors[name])
        assert out[name].flags.writeable
    needed = sum(tensors[n].nbytes for n in wanted)
    assert requests < len(wanted) // 4                  # neighbours share one request
    assert needed <= fetched < needed + len(wanted) * 64  # only alignment padding between


def test_memory_filesystem_and_file_objects(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    import io
    tensors = {f"t{i}": np.arange(i * 1000, dtype=np.int32) for i in range(1, 9)}
    buf = io.BytesIO()
    with ztensor.Writer(tmp_path / "m.zt") as w:
        for name, arr in tensors.items():
            w.write_numpy(name, arr)
    data = (tmp_path / "m.zt").read_bytes()
    with fsspec.open("memory://ckpt/m.zt", "wb") as f:
        f.write(data)
    buf.write(data)
    for source in ("memory://ckpt/m.zt", buf, str(tmp_path / "m.zt")):
        kw = {"mmap": False} if isinstance(source, str) else {}
        with ztensor.Reader(source, **kw) as r:
            out = r.read_numpy(list(tensors)[::-1], copy=True, threads=3)
        for name, arr in tensors.items():
            np.testing.assert_array_equal(out[name], arr)


def test_get_slice_reads_only_its_rows_over_http(server):
    url, www, served = server
    weight = np.arange(1024 * 256, dtype=np.float32).reshape(1024, 256)  # 1 MiB
    with ztensor.Writer(www / "tp.zt") as w:
        w.write_numpy("w", weight)
    with ztensor.safe_open(f"{url}/tp.zt", framework="np") as f:
        time.sleep(0.2)
        before = served()
        part = f.get_slice("w")[128:256]       # one rank's eighth
        time.sleep(0.2)
        fetched = served() - before
    np.testing.assert_array_equal(part, weight[128:256])
    assert fetched == 128 * 256 * 4


@pytest.mark.parametrize("index", [
    np.s_[3], np.s_[-1], np.s_[2:9], np.s_[2:9:3], np.s_[9:2], np.s_[:, 1], np.s_[5:, 2:4],
    np.s_[-4:-1, ::2], np.s_[...], np.s_[0, 1:3], np.s_[::5]])
def test_row_slices_of_unmapped_sources_equal_numpy(tmp_path, index):
    data = np.arange(13 * 6, dtype=np.int16).reshape(13, 6)
    path = tmp_path / "s.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("d", data)
    with open(path, "rb") as fileobj:  # a file object: not mapped, rows read as one range
        for source in (fileobj, str(path)):
            with ztensor.safe_open(source, framework="np") as f:
                np.testing.assert_array_equal(f.get_slice("d")[index], data[index])


def test_sharded_checkpoint_behind_a_url(server):
    url, www, served = server
    tensors = {f"layer.{i}.w": np.full((64, 64), i, np.float32) for i in range(6)}
    ztensor.save_sharded(tensors, www / "ckpt", max_shard_size=40_000)
    with ztensor.open_sharded(f"{url}/ckpt/model.zt.index.json") as ckpt:
        assert len(ckpt.shards) > 1 and sorted(ckpt.keys()) == sorted(tensors)
        time.sleep(0.2)
        before = served()
        np.testing.assert_array_equal(ckpt["layer.4.w"], tensors["layer.4.w"])
        time.sleep(0.2)
        one = served() - before
        everything = ckpt.read_all()
        assert ckpt.verify() == 0
    for name, arr in tensors.items():
        np.testing.assert_array_equal(everything[name], arr)
    assert one < 64 * 64 * 4 + (16 << 10)  # that tensor, its shard's footer and manifest
    with pytest.raises(ztensor.FormatError, match="index"):
        ztensor.open_sharded(f"{url}/ckpt/")


def test_an_index_url_with_a_token_query_sends_it_with_every_shard(tmp_path):
    """A server wanting a token with every request (a CDN's or an Azure SAS
    ``?token=``): the index's query goes with each shard's URL (sharded._url_parts);
    an index URL with a query was refused ("opened by its index")."""
    guard = 'location /private/ { if ($arg_token != "s3cret") { return 403; } }'
    with nginx(tmp_path, locations=guard) as (url, www, log):
        tensors = {f"layer.{i}.w": np.full((64, 64), i, np.float32) for i in range(4)}
        (www / "private").mkdir()
        ztensor.save_sharded(tensors, www / "private" / "ckpt", max_shard_size=40_000)
        index = f"{url}/private/ckpt/model.zt.index.json"
        with pytest.raises(ztensor.ZTensorError, match="403"):
            ztensor.open_sharded(index)
        with ztensor.open_sharded(index + "?token=s3cret") as ckpt:
            assert len(ckpt.shards) > 1
            got = ckpt.read_all()
            assert ckpt.verify() == 0
        for name, value in tensors.items():
            np.testing.assert_array_equal(got[name], value)
        time.sleep(0.2)  # nginx writes its log after the reply
        shard_statuses = [line.split()[2] for line in log.read_text().splitlines()
                          if line.split()[1:2] and line.split()[1].endswith(".zt")]
        # the shards were asked for, each with the token (none refused)
        assert shard_statuses and set(shard_statuses) <= {"200", "206"}


def test_a_checkpoint_replaced_on_the_server_while_open_is_not_mixed(server):
    """A release replaced on the server between two shards' reads (its index and
    shards rewritten, the same names): shard two of the new release was read under
    the old index, one checkpoint of two releases' values.  Every shard opened
    after the index changed (its ETag) is refused (``sharded.ShardedReader._open_checked``
    through ``source.file_version``), as for a local index; what was read stays."""
    url, www, _ = server
    def release(value):
        ztensor.save_sharded({"a": np.full(100, value), "b": np.full(100, value)},
                             www / "ck", max_shard_size=900)
    release(1.0)
    with ztensor.open_sharded(f"{url}/ck/model.zt.index.json") as ck:
        a = ck["a"]
        time.sleep(1.1)  # nginx's ETag is the mtime in seconds and the size
        release(2.0)
        with pytest.raises(ztensor.FormatError, match="changed while open") as err:
            ck["b"]
        assert err.value.obj == "b"
        assert float(a[0]) == 1.0
    with ztensor.open_sharded(f"{url}/ck/model.zt.index.json") as ck:
        assert float(ck["a"][0]) == float(ck["b"][0]) == 2.0
