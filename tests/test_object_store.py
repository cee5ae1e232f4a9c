"""Object stores: reading and writing ``s3://`` against a real S3 endpoint on loopback
(moto's server, started here as a subprocess; s3fs and boto3 as its clients), and
``memory://``.  Credentials come from the environment, the endpoint from
``storage_options`` (or, for the command, AWS_ENDPOINT_URL), as a user would give
them; nothing of ztensor's own is mocked."""
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest

import ztensor
import ztensor.numpy
from ztensor.errors import UnsupportedError, WriteError

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_server(tmp_path_factory):
    """The URL of a moto S3 server on loopback, for this module's tests; the
    environment holds test credentials and no endpoint (tests give theirs)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    pytest.importorskip("boto3")
    saved = {k: os.environ.get(k) for k in list(CREDENTIALS) + [
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED"]}
    nowhere = str(tmp_path_factory.mktemp("aws") / "none")
    os.environ.update(CREDENTIALS, AWS_CONFIG_FILE=nowhere, AWS_SHARED_CREDENTIALS_FILE=nowhere,
                      AWS_EC2_METADATA_DISABLED="true")
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        os.environ.pop(k, None)
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto's server did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def bucket(moto_server):
    """(bucket name, storage_options, boto3 client) of a new empty bucket."""
    import boto3
    name = f"zt-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_server)
    client.create_bucket(Bucket=name)
    return name, {"client_kwargs": {"endpoint_url": moto_server}}, client


def s3(opts):
    """The s3fs filesystem these options give (fsspec hands every caller with the
    same options the same instance): the client a failure is injected into."""
    import fsspec
    return fsspec.filesystem("s3", **opts)


def keys(client, name):
    """Every key in the bucket, and every multipart upload left unfinished."""
    listed = client.list_objects_v2(Bucket=name).get("Contents", [])
    uploads = client.list_multipart_uploads(Bucket=name).get("Uploads", [])
    return sorted(o["Key"] for o in listed) + [f"upload:{u['Key']}" for u in uploads]


def tensors():
    return {"embed": np.arange(24, dtype=np.float32).reshape(4, 6),
            "bias": np.linspace(-1, 1, 7).astype(np.float16),
            "ids": np.arange(5, dtype=np.int64)}


def check(got):
    for name, want in tensors().items():
        np.testing.assert_array_equal(got[name], want)
        assert got[name].dtype == want.dtype


# ------------------------------------------------------------------ write, read back
def test_write_then_read_back_with_reader_safe_open_and_load_file(bucket):
    name, opts, client = bucket
    url = f"s3://{name}/models/m.zt"
    ztensor.numpy.save_file(tensors(), url, metadata={"step": "3"}, storage_options=opts)
    assert keys(client, name) == ["models/m.zt"]
    with ztensor.Reader(url, storage_options=opts) as r:
        assert r.path == url
        check({n: r.read_numpy(n) for n in r.keys()})
        assert r.verify() >= 0
    with ztensor.safe_open(url, framework="np", storage_options=opts) as f:
        assert f.metadata() == {"step": "3"}
        np.testing.assert_array_equal(f.get_slice("embed")[1:3], tensors()["embed"][1:3])
    check(ztensor.numpy.load_file(url, storage_options=opts))
    check(ztensor.numpy.load_file(url, copy=True, storage_options=opts))


def test_writer_with_a_torch_tensor_and_overwrite(bucket):
    torch = pytest.importorskip("torch")
    import ztensor.torch
    name, opts, client = bucket
    url = f"s3://{name}/t.zt"
    ztensor.torch.save_file({"w": torch.arange(6.0)}, url, storage_options=opts)
    ztensor.torch.save_file({"w": torch.ones(3)}, url, storage_options=opts)
    with ztensor.Reader(url, storage_options=opts) as r:
        np.testing.assert_array_equal(r.read_numpy("w"), np.ones(3, np.float32))
    assert keys(client, name) == ["t.zt"]


def test_a_writer_that_raises_leaves_nothing(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the file is built
    name, opts, client = bucket
    url = f"s3://{name}/m.zt"
    with pytest.raises(RuntimeError, match="midway"):
        with ztensor.Writer(url, storage_options=opts) as w:
            w.write_numpy("a", np.zeros(1000))
            assert len(os.listdir(tmp_path)) == 1   # built locally, nothing uploaded yet
            raise RuntimeError("midway")
    assert keys(client, name) == []
    assert os.listdir(tmp_path) == []
    # an earlier object under the name is left as it was
    ztensor.numpy.save_file({"old": np.ones(2)}, url, storage_options=opts)
    with pytest.raises(ztensor.UnsupportedError):
        with ztensor.Writer(url, storage_options=opts) as w:
            w.write_numpy("s", np.array(["text"]))   # a dtype the writer refuses
    assert keys(client, name) == ["m.zt"]
    assert list(ztensor.numpy.load_file(url, storage_options=opts)) == ["old"]
    assert os.listdir(tmp_path) == []


def test_a_failed_upload_is_a_write_error_and_leaves_nothing(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    name, opts, client = bucket

    async def refuse(lpath, rpath, **kwargs):   # the upload upload.Upload._put runs
        raise PermissionError(13, "Access Denied")
    monkeypatch.setattr(s3(opts), "_put_file", refuse)
    url = f"s3://{name}/m.zt"
    with pytest.raises(WriteError, match="cannot upload.*Access Denied") as info:
        ztensor.numpy.save_file(tensors(), url, storage_options=opts)
    assert info.value.path == url
    monkeypatch.undo()
    assert keys(client, name) == []
    assert os.listdir(tmp_path) == []
    # a bucket that does not exist: the store's own refusal, the same promise
    with pytest.raises(WriteError) as info:
        ztensor.numpy.save_file(tensors(), f"s3://{name}-missing/m.zt", storage_options=opts)
    assert info.value.path == f"s3://{name}-missing/m.zt"
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ sharded
def test_save_sharded_to_s3_then_open_sharded(bucket):
    name, opts, client = bucket
    folder = f"s3://{name}/ckpt"
    files = ztensor.save_sharded(tensors(), folder, max_shard_size=100, storage_options=opts)
    assert len(files) == 3
    assert keys(client, name) == sorted([f"ckpt/{f}" for f in files]
                                        + ["ckpt/model.zt.index.json"])
    with ztensor.open_sharded(f"{folder}/model.zt.index.json", storage_options=opts) as s:
        check({n: s.read_numpy(n) for n in s.keys()})
        check(s.read_all())
        assert s.verify() >= 0
        np.testing.assert_array_equal(s.get_slice("embed")[2:], tensors()["embed"][2:])


def test_save_sharded_failing_midway_leaves_no_index(bucket, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    name, opts, client = bucket
    folder = f"s3://{name}/ckpt"
    ztensor.save_sharded(tensors(), folder, max_shard_size=100, storage_options=opts)
    assert "ckpt/model.zt.index.json" in keys(client, name)
    # a re-save whose second shard's upload fails: the earlier index is gone (it
    # would name shards being replaced), no new index, no temporary object
    fs = s3(opts)
    real = fs._put_file   # the upload upload.Upload._put runs
    uploads = []

    async def second_fails(lpath, rpath, **kwargs):
        uploads.append(rpath)
        if len(uploads) == 2:
            raise ConnectionResetError(104, "connection reset by peer")
        return await real(lpath, rpath, **kwargs)
    monkeypatch.setattr(fs, "_put_file", second_fails)
    with pytest.raises(WriteError, match="connection reset"):
        ztensor.save_sharded(tensors(), folder, max_shard_size=100, storage_options=opts)
    monkeypatch.undo()
    left = keys(client, name)
    assert "ckpt/model.zt.index.json" not in left
    assert all(k.startswith("ckpt/model-0000") and k.endswith("-of-00003.zt") for k in left)
    assert os.listdir(tmp_path) == []
    # a tensor the writer refuses, in the last shard: refused before any shard is
    # uploaded (sharded._check_before_writing), so nothing at all
    with pytest.raises(ztensor.UnsupportedError):
        ztensor.save_sharded({"a": np.zeros(20), "z": np.array(["text"])}, f"s3://{name}/two",
                             max_shard_size=100, storage_options=opts)
    assert [k for k in keys(client, name) if k.startswith("two/")] == []
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ only what is asked travels
class CountingProxy:
    """A TCP proxy on loopback in front of the S3 server, counting the bytes the server
    sends back (headers and bodies): what a range read costs on the wire."""

    def __init__(self, upstream):
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.sent = 0
        self._lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True),
                             daemon=True).start()

    def _pump(self, src, dst, count):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if count:
                    with self._lock:
                        self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.sock.close()


def test_a_range_read_fetches_only_that_tensor(bucket):
    name, opts, _ = bucket
    url = f"s3://{name}/big.zt"
    big = np.ones((4096, 1024), np.float32)    # 16 MiB
    small = np.arange(1024, dtype=np.float32)  # 4 KiB
    ztensor.numpy.save_file({"big": big, "small": small}, url, storage_options=opts)
    proxy = CountingProxy(opts["client_kwargs"]["endpoint_url"])
    try:
        via = {"client_kwargs": {"endpoint_url": proxy.url}}
        with ztensor.Reader(url, storage_options=via) as r:
            np.testing.assert_array_equal(r.read_numpy("small"), small)
            one = proxy.sent
            # the manifest, footer, header and the 4 KiB tensor, plus HTTP headers:
            # far below the 16 MiB the file holds
            assert small.nbytes < one < small.nbytes + (16 << 10), one
            with ztensor.safe_open(url, storage_options=via) as f:
                np.testing.assert_array_equal(f.get_slice("big")[7:9], big[7:9])
            rows = proxy.sent - one
            assert 2 * 4096 < rows < 2 * 4096 + (32 << 10), rows
            # and the counter sees bodies: the whole large tensor costs its bytes
            r.read_numpy("big")
            assert proxy.sent - one - rows >= big.nbytes
    finally:
        proxy.close()


# ------------------------------------------------------------------ dask, command, memory
def test_dask_from_zt_over_s3(bucket):
    pytest.importorskip("dask.array")
    import ztensor.dask
    name, opts, _ = bucket
    url = f"s3://{name}/d.zt"
    w = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    ztensor.numpy.save_file({"w": w, "s": np.array(2.5, np.float32)}, url, storage_options=opts)
    arr = ztensor.dask.from_zt(url, "w", rows=10, storage_options=opts)
    assert arr.numblocks == (7, 1)
    np.testing.assert_array_equal(arr.compute(scheduler="threads"), w)
    np.testing.assert_array_equal(arr.sum(axis=0).compute(), w.sum(axis=0))
    every = ztensor.dask.from_zt_all(url, storage_options=opts)
    assert float(every["s"].compute()) == 2.5
    ztensor.save_sharded({"w": w}, f"s3://{name}/ck", storage_options=opts)
    arr = ztensor.dask.from_zt(f"s3://{name}/ck/model.zt.index.json", "w", rows=32,
                               storage_options=opts)
    np.testing.assert_array_equal(arr.compute(), w)


def test_command_reads_s3_with_credentials_and_endpoint_from_the_environment(bucket):
    name, opts, _ = bucket
    url = f"s3://{name}/c.zt"
    ztensor.numpy.save_file(tensors(), url, storage_options=opts)
    ztensor.save_sharded(tensors(), f"s3://{name}/ck", max_shard_size=100,
                         storage_options=opts)
    env = dict(os.environ, AWS_ENDPOINT_URL=opts["client_kwargs"]["endpoint_url"])
    for args, want in ((["ls", url], "embed"), (["info", url], "3"),
                       (["verify", url], "OK"),
                       (["verify", f"s3://{name}/ck/model.zt.index.json"], "OK")):
        proc = subprocess.run([sys.executable, "-m", "ztensor", *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and want in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ztensor", "ls", f"s3://{name}/nothing.zt"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"s3://{name}/nothing.zt" in proc.stderr and "Traceback" not in proc.stderr


def test_memory_filesystem_write_and_read(tmp_path, monkeypatch):
    fsspec = pytest.importorskip("fsspec")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    fs = fsspec.filesystem("memory")
    folder = f"memory://zt-{uuid.uuid4().hex[:8]}"
    url = f"{folder}/m.zt"
    with ztensor.Writer(url) as w:
        for n, a in tensors().items():
            w.write_numpy(n, a, compress=True, checksum="crc32c")
    assert fs.ls(folder, detail=False) == [f"{folder[len('memory:/'):]}/m.zt"]
    check(ztensor.numpy.load_file(url))
    with ztensor.Reader(url) as r:
        assert r.verify() == 3
    with ztensor.Writer.append(url) as w:   # read from the URL, written back whole
        w.write_numpy("extra", np.ones(2))
    assert sorted(ztensor.numpy.load_file(url)) == ["bias", "embed", "extra", "ids"]
    # a failure of the final move (memory:// goes through a temporary key): a
    # WriteError, the temporary key removed, the earlier object kept
    monkeypatch.setattr(type(fs), "mv", lambda self, *a, **k: (_ for _ in ()).throw(
        OSError(5, "I/O error")))
    with pytest.raises(WriteError, match="I/O error"):
        ztensor.numpy.save_file({"new": np.zeros(3)}, url)
    monkeypatch.undo()
    assert fs.ls(folder, detail=False) == [f"{folder[len('memory:/'):]}/m.zt"]
    check(ztensor.numpy.load_file(url))
    assert os.listdir(tmp_path) == []
    ztensor.save_sharded(tensors(), f"{folder}/ck", max_shard_size=100)
    with ztensor.open_sharded(f"{folder}/ck/model.zt.index.json") as s:
        check(s.read_all())


# ------------------------------------------------------------------ the options themselves
def test_storage_options_with_a_local_path_is_an_error(tmp_path):
    path = tmp_path / "m.zt"
    ztensor.numpy.save_file(tensors(), path)
    opts = {"key": "secret"}
    calls = [
        lambda: ztensor.Reader(path, storage_options=opts),
        lambda: ztensor.Reader(path.read_bytes(), storage_options=opts),
        lambda: ztensor.safe_open(path, storage_options=opts),
        lambda: ztensor.numpy.load_file(path, storage_options=opts),
        lambda: ztensor.numpy.save_file(tensors(), tmp_path / "n.zt", storage_options=opts),
        lambda: ztensor.Writer(tmp_path / "n.zt", storage_options=opts),
        lambda: ztensor.save_sharded(tensors(), tmp_path / "ck", storage_options=opts),
        lambda: ztensor.open_sharded(tmp_path, storage_options=opts),
    ]
    try:
        import dask  # noqa: F401
        from ztensor.dask import from_zt
        calls.append(lambda: from_zt(path, "embed", storage_options=opts))
    except ImportError:
        pass
    for call in calls:
        with pytest.raises(ValueError, match="storage_options passed with a non-URL path"):
            call()
    assert sorted(os.listdir(tmp_path)) == ["m.zt"]   # nothing was written
    with pytest.raises(TypeError, match="storage_options must be a dict"):
        ztensor.Reader(path, storage_options="key=secret")
    # empty or None options with a local path are no options, as in pandas
    with ztensor.Reader(path, storage_options={}) as r:
        assert len(r) == 3


def test_http_options_keep_the_range_checks():
    pytest.importorskip("aiohttp")
    from ztensor.io.source import url_options
    got = url_options("https://host/m.zt", {"client_kwargs": {
        "headers": {"Authorization": "Bearer x", "Accept-Encoding": "gzip"},
        "response_class": object}, "block_size": 0})
    client = got["client_kwargs"]
    assert client["headers"] == {"Authorization": "Bearer x", "Accept-Encoding": "identity"}
    assert client["response_class"].__name__ == "_CheckedResponse"
    assert got["block_size"] == 0 and "timeout" in client


def test_writing_to_http_is_refused():
    pytest.importorskip("fsspec")
    with pytest.raises(UnsupportedError, match="cannot write a file to an https URL"):
        ztensor.Writer("https://host/m.zt")
