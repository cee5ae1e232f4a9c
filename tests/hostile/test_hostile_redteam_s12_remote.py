"""Red team, session 12, remote reads: URLs over HTTP (servers on loopback,
tests/http_servers.py), ``memory://``, S3 through moto, and dask graphs over them.
Each test names the one function keeping its rule.

* A URL given with a raw space (or a line break) in its query, path or password
  was shown in part: in running text a URL ends at its first space, so the query
  items after it (``&sig=SECRET``) were printed as they were, in every error and
  in the handles' reprs.  An error's path, and a handle's, is now scrubbed as one
  URL whole (errors.url_without_secrets, applied by errors.without_secrets to the
  URLs a text is known to hold).  A bare query item (``?TOKEN``) is hidden too.
* Errors raised by the checked replies named aiohttp's spelling of the URL (``a+b``
  for ``a b``, ``%22`` for ``"``): ``err.path`` was a string the caller never gave.
  They now name the caller's URL, and a redirect's target in their message
  (source.network_errors, source._name_as_given).
* A dask graph carried its ``storage_options`` (and the URL's signature) where
  anyone printing it saw them (a task's args and kwargs), and its key names were a
  plain hash of them.  They now travel inside one object that shows neither and
  tokenizes to a keyed hash (dask._Target); the graph still computes on worker
  processes, the credentials reaching them.
* An fsspec file object the caller opened from a store whose reads do not carry
  the version it records (gcsfs's generation, adlfs's ETag, an s3fs file opened
  with ``size=``) was read unpinned, with no opt-in asked: the rule refusing such a
  store for a URL now refuses the file object too (source._version_held, used by
  source.open_url and source.refuse_unchecked_file).
"""
import json
import pickle

import numpy as np
import pytest
from http_servers import RawServer, raw, serving, serving_files  # noqa: F401  (raw: a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hostile_redteam_dist import two_versions

import ztensor
import ztensor.numpy
from ztensor.errors import NetworkError, NetworkTimeoutError, url_without_secrets, without_secrets

try:  # moto's S3 server on loopback, as tests/test_object_store.py starts it
    from test_object_store import bucket, moto_server  # noqa: F401  (fixtures)
except ImportError:  # pragma: no cover
    pass

SECRET = "S3CRETq9"
ALLOW = {"ztensor_allow_unversioned": True}


def _lying_after_open(data):
    """An honest server until the first tensor read, which gets a Content-Range
    naming other bytes."""
    honest = serving(data)
    lying = serving(data, content_range=lambda a, b, n: b"bytes 5-6/%d" % n)

    def reply(method, asked, headers):
        if method == "GET" and asked is not None and asked[1] - asked[0] > 1000:
            return lying(method, asked, headers)
        return honest(method, asked, headers)
    return reply


# ------------------------------------------------------------------ 1a. URLs shown whole
@pytest.mark.parametrize("query", [
    f"token=ab cd&sig={SECRET}",              # a raw space in a value
    f"sig=ab\ncd&x={SECRET}",                 # a line break
    f"a b=1&sig={SECRET}",                    # a space in a name
    f"{SECRET}",                              # a bare item: a token itself
    f"sig={SECRET} tail",                     # a space inside the secret
])
def test_a_url_with_a_raw_space_shows_no_secret(raw, tmp_path, query):
    """The query items after a raw space were printed as given: a URL in running
    text ends at its first space.  The error's path is one URL whole, and is
    scrubbed as one (errors.url_without_secrets through ZTensorError._render)."""
    one, _, _ = two_versions(tmp_path)
    server = raw(_lying_after_open(one))
    url = server.url(f"/m.zt?{query}")
    with pytest.raises(ztensor.FormatError, match="Content-Range") as err:
        with ztensor.Reader(url) as r:
            r.read_numpy("x", copy=True)
    text = str(err.value)
    assert SECRET not in text and "tail" not in text, text
    assert text.startswith(server.url("/m.zt?")), text
    # the path the caller gave, not aiohttp's spelling of it (source._name_as_given)
    assert err.value.path == url


def test_a_refused_connection_names_the_whole_url_without_secrets():
    url = f"http://alice:pa ss\nword@127.0.0.1:1/a dir/m.zt;sid={SECRET} x?q=a b&sig={SECRET}#f g"
    with pytest.raises(ztensor.ZTensorError) as err:
        ztensor.Reader(url)
    text = str(err.value)
    assert SECRET not in text and "word" not in text and "pa ss" not in text, text
    assert text.startswith("http://***@127.0.0.1:1/a dir/m.zt;sid=***?q=***&sig=***#***: "), text


def test_reprs_show_no_secret_after_a_space(raw, tmp_path):
    """Reader's and Writer's repr quote the path: the heuristic found the URL up
    to its space, and showed the rest (Reader.__repr__, Writer.__repr__ and
    ShardedReader.__repr__ pass their path to errors.without_secrets)."""
    one, _, _ = two_versions(tmp_path)
    server = raw(serving_files({"/m.zt": one}))
    with ztensor.Reader(server.url(f"/m.zt?v=a b&sig={SECRET}")) as r:
        assert SECRET not in repr(r) and "/m.zt?v=***&sig=***" in repr(r), repr(r)
    w = ztensor.Writer(f"memory://s12/m.zt?v=a b&sig={SECRET}")
    try:
        assert SECRET not in repr(w), repr(w)
    finally:
        w.abort()


_VALUE = st.text(st.characters(min_codepoint=1, max_codepoint=0x10FFFF,
                               exclude_characters="&#", exclude_categories=("Cs",)),
                 max_size=30).map(lambda text: "Q9" + text)
# a bare query item (no '='): a token itself
_BARE = _VALUE.map(lambda text: text.replace("=", ""))


@settings(max_examples=300, deadline=None)
@given(value=_VALUE, other=_BARE, scheme=st.sampled_from(["http", "https", "s3", "gs"]))
def test_property_any_query_value_is_hidden_from_an_errors_path(value, other, scheme):
    """Any query value (spaces, quotes, line breaks, any script) in the URL an error
    names is absent from its message, and the rest of the URL is shown whole."""
    url = f"{scheme}://host.example:8080/d ir/m.zt?sig={value}&{other}"
    for err in (ztensor.NetworkError("HTTP 404", path=url),
                ztensor.FormatError(f"cannot read {url}", path=url, obj="w")):
        text = str(err)
        assert value not in text and other not in text, text
        assert text.startswith(f"{scheme}://host.example:8080/d ir/m.zt?sig=***&***: "), text
    assert url_without_secrets(url) == f"{scheme}://host.example:8080/d ir/m.zt?sig=***&***"
    assert value not in without_secrets(f"<x {url!r}>", url)


def test_a_redirects_target_is_said_and_the_given_url_named(raw, tmp_path):
    """A lie from the host a redirect leads to: the error names the caller's URL
    as its path and says which URL answered (source._name_as_given)."""
    one, _, _ = two_versions(tmp_path)
    target = raw(_lying_after_open(one))

    def redirect(method, asked, headers):
        return (b"HTTP/1.1 302 Found\r\nLocation: " + target.url("/b.zt?sig=" + SECRET).encode()
                + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    front = raw(redirect)
    url = front.url("/m.zt")
    with pytest.raises(ztensor.FormatError, match="Content-Range") as err:
        with ztensor.Reader(url) as r:
            r.read_numpy("x", copy=True)
    assert err.value.path == url
    text = str(err.value)
    assert f"answered by {target.url('/b.zt?sig=***')}" in text and SECRET not in text, text


# ------------------------------------------------------------------ 1b. dask graphs
def _graph_text(array):
    """What anyone printing a dask graph sees: every task's args and kwargs, and
    the keys."""
    graph = dict(array.__dask_graph__())
    parts = []
    for key, task in graph.items():
        parts.append(repr(key))
        for attr in ("args", "kwargs"):
            parts.append(repr(getattr(task, attr, task)))
        for dep in getattr(task, "dependencies", ()):
            parts.append(repr(dep))
    return "\n".join(parts)


def _authorized(data, seen):
    """An honest server that answers 403 to a request without the bearer token."""
    honest = serving(data)

    def reply(method, asked, headers):
        seen.append(headers.get("authorization"))
        if headers.get("authorization") != f"Bearer {SECRET}":
            return b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        return honest(method, asked, headers)
    return reply


@pytest.mark.parametrize("scalar", [False, True])
def test_a_dask_graph_shows_no_credentials(raw, tmp_path, scalar):
    """storage_options (a bearer token) and a URL's signature were in every task's
    kwargs, and the key names were a plain hash of them (dask._Target)."""
    pytest.importorskip("dask")
    import dask
    import ztensor.dask as zdask

    path = tmp_path / "m.zt"
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    ztensor.numpy.save_file({"x": x, "s": np.array(3.5, np.float32)}, str(path))
    seen = []
    server = raw(_authorized(path.read_bytes(), seen))
    url = server.url(f"/m.zt?sig={SECRET}")
    opts = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}}
    arr = zdask.from_zt(url, "s" if scalar else "x", rows=2, storage_options=opts)
    assert SECRET not in _graph_text(arr)
    assert SECRET not in arr.name and SECRET not in repr(arr)
    # another token is another array (another endpoint's file is another file)
    other = zdask.from_zt(url, "s" if scalar else "x", rows=2,
                          storage_options={**opts, "ztensor_allow_unversioned": True})
    assert other.name != arr.name
    # the graph still carries what the workers need: it computes after a pickle
    arr = pickle.loads(pickle.dumps(arr))
    got = dask.compute(arr, scheduler="sync")[0]
    np.testing.assert_array_equal(got, np.float32(3.5) if scalar else x)
    assert seen and set(seen) == {f"Bearer {SECRET}"}


def test_a_dask_graph_with_credentials_computes_on_worker_processes(raw, tmp_path):
    """The credentials reach workers in other processes (the pickled graph holds
    them: docs/remote.md), while no printed part of the graph does."""
    distributed = pytest.importorskip("distributed")
    import ztensor.dask as zdask

    path = tmp_path / "m.zt"
    x = np.arange(400, dtype=np.float32).reshape(40, 10)
    ztensor.numpy.save_file({"x": x}, str(path))
    seen = []
    server = raw(_authorized(path.read_bytes(), seen))
    opts = {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}}
    arr = zdask.from_zt(server.url(), "x", rows=10, storage_options=opts)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        total = client.compute(arr.astype(np.float64).sum()).result()
    assert total == float(x.astype(np.float64).sum())
    assert set(seen) == {f"Bearer {SECRET}"}


# ------------------------------------------------------------------ 1c. unpinnable file objects
def _generations_fs():
    """A memory filesystem whose files record a generation, as gcsfs's do, that
    their reads do not send."""
    fsspec = pytest.importorskip("fsspec")
    from fsspec.implementations.memory import MemoryFileSystem

    class Generations(MemoryFileSystem):
        protocol = ("s12gen",)

        def _open(self, path, mode="rb", **kwargs):
            f = super()._open(path, mode, **kwargs)
            f.details = {"name": path, "size": len(self.cat_file(path)), "generation": 7}
            return f
    fsspec.register_implementation("s12gen", Generations, clobber=True)
    return fsspec.filesystem("s12gen")


def test_a_callers_file_of_an_unpinnable_store_is_refused(tmp_path):
    """The URL was refused unless opted in; the same store's file object handed to
    Reader was read, unpinned, with no opt-in asked (source.refuse_unchecked_file
    by source._version_held, the rule source.open_url uses)."""
    fs = _generations_fs()
    data, _, x = two_versions(tmp_path)
    fs.pipe("s12gen://s12/m.zt", data)  # (a memory store keeps the URL as its key)
    with fs.open("s12gen://s12/m.zt", "rb") as f:
        with pytest.raises(ztensor.UnsupportedError, match="cannot be held") as err:
            ztensor.Reader(f)
    assert "ztensor_allow_unversioned" in str(err.value)
    with pytest.raises(ztensor.UnsupportedError, match="cannot be held"):
        ztensor.Reader("s12gen://s12/m.zt")
    with ztensor.Reader("s12gen://s12/m.zt", storage_options=ALLOW) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)


def test_a_callers_s3_file_is_read_only_when_its_reads_are_pinned(bucket, tmp_path):
    """An s3fs file sends IfMatch its ETag with every read, unless opened with
    ``size=``: then it reads whatever object is there now, and is refused as the
    unpinnable stores are.  A pinned one still reads, and a replacement while it is
    open is "changed on the server"."""
    import fsspec

    name, opts, client = bucket
    one, two, x = two_versions(tmp_path)
    client.put_object(Bucket=name, Key="m.zt", Body=one)
    fs = fsspec.filesystem("s3", **opts)
    with fs.open(f"{name}/m.zt", "rb", size=len(one), cache_type="none") as f:
        with pytest.raises(ztensor.UnsupportedError, match="cannot be held"):
            ztensor.Reader(f)
    with fs.open(f"{name}/m.zt", "rb", cache_type="none") as f, ztensor.Reader(f) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
        client.put_object(Bucket=name, Key="m.zt", Body=two)
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy("y", copy=True)


def test_a_dask_graph_over_s3_shows_no_key_or_secret(bucket, tmp_path):
    """The object-store case: s3fs's ``key`` and ``secret`` in storage_options
    (moto takes any) reach the read and appear nowhere in the printed graph."""
    pytest.importorskip("dask")
    import dask
    import ztensor.dask as zdask

    name, opts, client = bucket
    x = np.arange(60, dtype=np.float32).reshape(6, 10)
    path = tmp_path / "m.zt"
    ztensor.numpy.save_file({"x": x}, str(path))
    client.put_object(Bucket=name, Key="m.zt", Body=path.read_bytes())
    opts = {**opts, "key": "AKIAS12TESTKEY", "secret": SECRET}
    arr = zdask.from_zt(f"s3://{name}/m.zt", "x", rows=3, storage_options=opts)
    text = _graph_text(arr)
    assert SECRET not in text and "AKIAS12TESTKEY" not in text
    assert f"s3://{name}/m.zt" in text  # the file is still named
    np.testing.assert_array_equal(dask.compute(arr, scheduler="sync")[0], x)


# ------------------------------------------------------------------ 2. red team: replies
def _on_tensor_read(data, answer):
    """An honest server but for the range requests of a tensor's bytes (more than
    1000 bytes: the open's reads are smaller), which get ``answer(asked)``."""
    honest = serving(data)

    def reply(method, asked, headers):
        if method == "GET" and asked is not None and asked[1] - asked[0] > 1000:
            return answer(asked)
        return honest(method, asked, headers)
    return reply


def test_a_416_inside_the_file_opened_says_so(raw, tmp_path):
    """A 416 to a range inside the size the server gave at the open: fsspec reads a
    416 as the end of the file (b""), so it was "the source ends at byte 64", a
    size no reply gave (source._reply_limit).  One tensor's read and the parallel
    reads of many say the same."""
    one, _, _ = two_versions(tmp_path)
    opened = []
    honest = serving(one)

    def reply(method, asked, headers):
        if opened and method == "GET":
            return (b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */4\r\n"
                    b"Content-Length: 0\r\nConnection: close\r\n\r\n")
        return honest(method, asked, headers)
    server = raw(reply)
    with ztensor.Reader(server.url()) as r:
        opened.append(1)
        with pytest.raises(ztensor.FormatError, match="answered 416") as err:
            r.read_numpy("x", copy=True)
        assert "ends at byte" not in str(err.value)
        with pytest.raises(ztensor.FormatError, match="answered 416"):
            r.read_numpy(["x", "y"], copy=True)


def test_a_per_read_timeout_is_not_called_the_deadline(raw, tmp_path, monkeypatch):
    """A 206 whose chunked body never ends (no last chunk, then silence): fsspec
    wraps aiohttp's per-read timeout in its own TimeoutError, which was said as the
    whole-request deadline ("did not complete within 600 s" after 1 s)
    (source._network_error)."""
    import time

    from ztensor.io import source as src

    one, _, x = two_versions(tmp_path)
    stop = []

    def endless(asked):
        body = one[asked[0]:asked[1] + 1]
        yield (b"HTTP/1.1 206 Partial Content\r\nConnection: close\r\nETag: \"v1\"\r\n"
               b"Content-Range: bytes %d-%d/%d\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (asked[0], asked[1], len(one)))
        yield b"%x\r\n" % len(body) + body + b"\r\n"
        for _ in range(100):  # no last chunk: silence until the test ends
            if stop:
                return
            time.sleep(0.1)
    monkeypatch.setattr(src, "URL_TIMEOUT", 1.0)
    server = raw(_on_tensor_read(one, endless))
    try:
        with ztensor.Reader(server.url()) as r:
            with pytest.raises(NetworkTimeoutError) as err:
                r.read_numpy("x", copy=True)
    finally:
        stop.append(1)
    assert "no answer within 1 s" in str(err.value) and "URL_DEADLINE" not in str(err.value)


def _gzip_range(data):
    import gzip

    def answer(asked):
        body = gzip.compress(data[asked[0]:asked[1] + 1])
        return (b"HTTP/1.1 206 Partial Content\r\nConnection: close\r\nETag: \"v1\"\r\n"
                b"Content-Range: bytes %d-%d/%d\r\nContent-Encoding: gzip\r\n"
                b"Content-Length: %d\r\n\r\n" % (asked[0], asked[1], len(data), len(body)) + body)
    return answer


def _chunked_without_end(data):
    def answer(asked):
        yield (b"HTTP/1.1 206 Partial Content\r\nConnection: close\r\nETag: \"v1\"\r\n"
               b"Content-Range: bytes %d-%d/%d\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (asked[0], asked[1], len(data)))
        for _ in range(1 << 16):  # 256 MiB if it were all read
            yield b"1000\r\n" + b"\0" * 4096 + b"\r\n"
    return answer


def _etag_changes(data):
    return lambda asked: serving(data, etag=b'"v2"')("GET", asked, {})


def _redirect_to(location):
    return lambda asked: (b"HTTP/1.1 302 Found\r\nLocation: " + location +
                          b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def _headers(count, size):
    def answer(asked):
        return (b"HTTP/1.1 206 Partial Content\r\nConnection: close\r\n" +
                b"".join(b"X-H%d: %s\r\n" % (i, b"a" * size) for i in range(count)) + b"\r\n")
    return answer


@pytest.mark.parametrize("how,error,words", [
    ("gzip", ztensor.FormatError, "Content-Encoding"),
    ("chunked without end", ztensor.FormatError, "more than the"),
    ("etag changes", ztensor.FormatError, "changed on the server"),
    ("redirect to file://", NetworkError, "file:///etc/passwd"),
    ("many headers", NetworkError, "not HTTP"),
    ("a huge header", NetworkError, "not HTTP"),
])
def test_hostile_tensor_replies_held(raw, tmp_path, how, error, words):
    """What held in this round (each by the rule its earlier round made): a
    compressed range (source._range_reply_size), a chunked 206 that never ends
    (_CheckedResponse._bounded_body), another ETag mid-read (source._check_version),
    a redirect to a file:// URL (aiohttp refuses it; said by source._network_error),
    a reply of 20,000 headers or one header of 1 MiB (aiohttp's parser)."""
    one, _, _ = two_versions(tmp_path)
    answer = {"gzip": _gzip_range(one), "chunked without end": _chunked_without_end(one),
              "etag changes": _etag_changes(one),
              "redirect to file://": _redirect_to(b"file:///etc/passwd"),
              "many headers": _headers(20000, 100), "a huge header": _headers(1, 1 << 20)}[how]
    server = raw(_on_tensor_read(one, answer))
    with ztensor.Reader(server.url()) as r:
        with pytest.raises(error, match=words) as err:
            r.read_numpy("x", copy=True)
    assert err.value.path == server.url()


@pytest.mark.parametrize("shard", ["http://127.0.0.1:{port}/m.zt", "//127.0.0.1:{port}/m.zt",
                                   "../m.zt", "..%2fm.zt", "%2e%2e", "．．", "a\\..\\m.zt",
                                   "m.zt／x", "C:m.zt"])
def test_a_remote_index_names_no_shard_elsewhere(raw, tmp_path, shard):
    """A remote index naming a shard on another host, or above its folder, spelled
    any way: refused before that host or path is asked for (sharded.check_shard_name);
    held."""
    one, _, _ = two_versions(tmp_path)
    elsewhere = []

    def other_host(method, asked, headers):
        elsewhere.append(headers[":path"])
        return serving(one)(method, asked, headers)
    other = raw(other_host)
    port = other.url().split(":")[2].split("/")[0]
    index = json.dumps({"weight_map": {"x": shard.format(port=port)}}).encode()
    seen = []

    def home(method, asked, headers):
        seen.append(headers[":path"])
        return serving_files({"/ck/m.zt.index.json": index, "/m.zt": one})(method, asked, headers)
    server = raw(home)
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        with ztensor.open_sharded(server.url("/ck/m.zt.index.json")) as s:
            s.read_numpy("x")
    assert not elsewhere and all(p.startswith("/ck/") for p in seen), (elsewhere, seen)


@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["verify"],
                                     ["verify", "--json"], ["diff", "--json"]])
def test_the_command_prints_a_url_with_a_space_without_secrets(raw, tmp_path, command):
    """``ztensor info`` and ``verify`` print the file they were given, and the JSON
    outputs carry it: the text heuristic cut the URL at its space and printed the
    rest (``?v=*** b&sig=SECRET``) (cli: each path through
    errors.url_without_secrets)."""
    import subprocess
    import sys

    one, _, _ = two_versions(tmp_path)
    server = raw(serving_files({"/m.zt": one}))
    url = server.url(f"/m.zt?v=a b&sig={SECRET}")
    args = [url, url] if command[0] == "diff" else [url]
    done = subprocess.run([sys.executable, "-m", "ztensor", *command, *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "/m.zt?v=***&sig=***" in done.stdout, done.stdout


def test_from_pretrained_over_a_url_warns_without_its_credentials(raw, tmp_path):
    """A checkpoint holding a tensor the model has no place for is loaded with a
    warning naming the checkpoint: over a URL it named the URL as given, password
    and all (transformers._load_weights, through errors.without_secrets)."""
    import warnings

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import ztensor.torch
    import ztensor.transformers as ztf

    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, vocab_size=32, n_positions=16))
    folder = tmp_path / "m"
    ztf.save_pretrained(model, folder)
    weights = sorted(folder.glob("*.zt"))
    assert len(weights) == 1, weights
    tensors = ztensor.torch.load_file(str(weights[0]))
    tensors["not.in.the.model"] = torch.ones(3)
    ztensor.torch.save_file(tensors, str(weights[0]))
    files = {f"/m/{p.name}": p.read_bytes() for p in folder.iterdir()}
    server = raw(serving_files(files))
    scheme, rest = server.url(f"/m/{weights[0].name}").split("://", 1)
    url = f"{scheme}://alice:{SECRET}@{rest}"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ztf.from_pretrained(transformers.AutoModelForCausalLM, url)
    said = [str(w.message) for w in seen if "no place for" in str(w.message)]
    assert said and all(SECRET not in text for text in said), said
    assert "***@127.0.0.1" in said[0]
