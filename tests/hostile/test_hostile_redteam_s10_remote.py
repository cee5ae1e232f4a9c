"""Red team, session 10, remote round: hostile servers (loopback HTTP, moto's S3)
against the promise of docs/remote.md: a clean ZTensorError naming the URL, never
a hang, never memory driven by a declared size, never wrong bytes.  Each test is a
break found in this round and names the one function that now keeps the rule.

* One version per read on object stores: fsspec's ``cat_ranges`` requests go by
  path and do not carry s3fs's If-Match, so they are used only where the pin travels
  (source._pin_travels); s3fs's "FileExpired" is the FormatError "changed on the
  server" (source._network_error).
* A server naming no version (no ETag, no Last-Modified) that replaces the file: the
  reply's Content-Range total (or a 200's length) is held to the size opened
  (source.check_range_reply), for Source's reads and the sharded index's.
* A shard name holding ``?`` or ``#`` is refused (sharded.check_shard_name): s3fs
  reads ``s.zt?versionId=...`` as an older (or deleted) version of ``s.zt``.
* A redirect to a host name the resolver cannot encode was a bare UnicodeError; a
  server's 8 KiB header line was repeated in the error, newlines and all
  (source._network_error, source._said).
* Content-Range is parsed by RFC 9110's grammar (source._CONTENT_RANGE).
"""
import json

import numpy as np
import pytest

import ztensor
from ztensor import sharded
from ztensor.errors import NetworkConnectionError

from test_hostile_redteam_dist import two_versions
from http_servers import raw, serving, web  # noqa: F401  (raw, web: fixtures)

try:  # moto's S3 server on loopback, as tests/test_object_store.py starts it
    from test_object_store import bucket, moto_server  # noqa: F401  (fixtures)
except ImportError:  # pragma: no cover
    pass


def _two_sizes(tmp_path):
    """Two .zt files of other sizes, x in other places: v1 x = 0..999, v2 x = sevens
    after a pad."""
    first, second = tmp_path / "a.zt", tmp_path / "b.zt"
    x = np.arange(1000, dtype=np.float32)
    with ztensor.Writer(first) as w:
        w.write_numpy("x", x)
    with ztensor.Writer(second) as w:
        w.write_numpy("pad", np.zeros(64, np.float32))
        w.write_numpy("x", np.full(1000, 7, np.float32))
    return first.read_bytes(), second.read_bytes(), x


# ----------------------------------------------------------------- object stores
def test_s3_object_replaced_while_open_is_refused(bucket, tmp_path):
    """read_numpy([...], copy=True) fetched through s3fs's cat_ranges, whose requests
    carry no If-Match: v1's manifest was read over v2's bytes (x came back as
    sevens).  One tensor through the file was s3fs's FileExpired, a NetworkError
    that did not say the file changed."""
    name, opts, client = bucket
    one, two, x = two_versions(tmp_path)
    client.put_object(Bucket=name, Key="m.zt", Body=one)
    url = f"s3://{name}/m.zt"
    with ztensor.Reader(url, storage_options=opts) as r:
        np.testing.assert_array_equal(r.read_numpy(["x", "y"], copy=True)["x"], x)
        client.put_object(Bucket=name, Key="m.zt", Body=two)
        for read in (lambda: r.read_numpy(["x", "y"], copy=True),
                     lambda: r.read_numpy("x", copy=True)):
            with pytest.raises(ztensor.FormatError, match="changed on the server") as err:
                read()
            assert url in str(err.value)
    with ztensor.Reader(url, storage_options=opts) as r:   # opened again: v2, whole
        np.testing.assert_array_equal(r.read_numpy(["x", "y"], copy=True)["x"], -x)


def test_s3_shard_name_with_a_version_query_is_refused(bucket, tmp_path):
    """An index naming ``s.zt?versionId=<old>`` made s3fs read the superseded version
    of the shard (arange, where the object now holds -arange): another object's
    bytes than the one the name says, from a versioned bucket's history."""
    name, opts, client = bucket
    client.put_bucket_versioning(Bucket=name,
                                 VersioningConfiguration={"Status": "Enabled"})
    for i, sign in enumerate((1, -1)):
        ztensor.save_sharded({"a": sign * np.arange(4.0)}, tmp_path / f"c{i}")
    shard = "model-00001-of-00001.zt"
    old = client.put_object(Bucket=name, Key=f"ck/{shard}",
                            Body=(tmp_path / "c0" / shard).read_bytes())["VersionId"]
    client.put_object(Bucket=name, Key=f"ck/{shard}", Body=(tmp_path / "c1" / shard).read_bytes())
    index = f"s3://{name}/ck/model.zt.index.json"
    for trick in (f"?versionId={old}", "#1"):
        client.put_object(Bucket=name, Key="ck/model.zt.index.json",
                          Body=json.dumps({"weight_map": {"a": shard + trick}}).encode())
        with pytest.raises(ztensor.FormatError, match="not a file beside the index") as err:
            with ztensor.open_sharded(index, storage_options=opts) as r:
                r["a"]
        assert index in str(err.value)


@pytest.mark.parametrize("name", ["s.zt?versionId=1", "s.zt#1", "s.zt\uff1fx", "s.zt\uff03x"])
def test_query_and_fragment_are_not_in_shard_names(name):
    """The rule of sharded.check_shard_name, as given and NFKC-normalised."""
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        sharded.check_shard_name(name, "index.json")


@pytest.mark.parametrize("prefix", ["../out", "a?b", "a/b"])
def test_save_sharded_refuses_a_prefix_its_reader_would(tmp_path, prefix):
    """save_sharded(prefix="../out") wrote the checkpoint outside its folder, and
    "a?b" one whose index open_sharded then refuses: now a ValueError before a byte,
    and (session 16) before the folder is made."""
    folder = tmp_path / "ck"
    with pytest.raises(ValueError, match="prefix"):
        ztensor.save_sharded({"a": np.arange(4.0)}, folder, prefix=prefix)
    assert sorted(p.name for p in tmp_path.rglob("*")) == []


# ----------------------------------------------------------------- HTTP: versions
def test_http_file_replaced_on_a_server_naming_no_version(web, tmp_path):
    """A server with no ETag and no Last-Modified pins nothing; the file replaced by
    one of another size was read with the old manifest: x came back as zeros, by
    each read path.  The reply's Content-Range total now must be the size opened."""
    one, two, x = _two_sizes(tmp_path)
    server = web(versioned=False)
    server.files["/m.zt"] = one
    url = server.url("/m.zt")
    with ztensor.Reader(url, storage_options={"ztensor_allow_unversioned": True}) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
        server.files["/m.zt"] = two
        for read in (lambda: r.read_numpy("x", copy=True),
                     lambda: r.read_numpy(["x"], copy=True)):
            with pytest.raises(ztensor.FormatError, match="changed on the server") as err:
                read()
            assert url in str(err.value) and str(len(two)) in str(err.value)


def test_http_index_replaced_while_read_is_refused(web, tmp_path, monkeypatch):
    """The sharded index is read in 64 KiB ranges: replaced between two of them on a
    server naming no version, it was read spliced from two files."""
    server = web(versioned=False)
    big = {"weight_map": {f"t{i:06d}": "model-00001-of-00001.zt" for i in range(8000)}}
    first = json.dumps(big).encode()
    second = json.dumps({"weight_map": {"t": "x.zt"}, "pad": "p" * 70_000}).encode()
    server.files["/ck/model.zt.index.json"] = first
    answer = server.answer
    asked = []

    def swapping(h, head):   # the file is replaced after its first range
        if not head and h.headers.get("Range"):
            asked.append(h.headers["Range"])
            if len(asked) == 2:
                server.files["/ck/model.zt.index.json"] = second
        return answer(h, head)
    server.answer = swapping
    with pytest.raises(ztensor.FormatError, match="changed on the server"):
        ztensor.open_sharded(server.url("/ck/model.zt.index.json"),
                             storage_options={"ztensor_allow_unversioned": True})


# ----------------------------------------------------------------- HTTP: raw lies
@pytest.mark.parametrize("label", [b"a" * 64, b"a..b"])
def test_a_redirect_to_a_host_name_that_cannot_be_resolved(raw, label):
    """A Location whose host has a label over 63 characters (or an empty one) raised
    the resolver's bare UnicodeError ("encoding with 'idna' codec failed")."""
    server = raw(lambda method, asked, headers: b"HTTP/1.1 302 Found\r\nLocation: http://" + label +
                 b".invalid/m.zt\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    with pytest.raises(NetworkConnectionError, match="host name") as err:
        ztensor.Reader(server.url())
    assert server.url() in str(err.value)


def test_a_url_whose_host_name_cannot_be_resolved():
    """The same for the caller's own URL."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    url = "http://" + "a" * 64 + ".invalid/m.zt"
    with pytest.raises(NetworkConnectionError, match="host name") as err:
        ztensor.Reader(url)
    assert url in str(err.value)


@pytest.mark.parametrize("what", ["header", "status"])
def test_a_servers_huge_line_is_not_repeated_in_the_error(raw, tmp_path, what):
    """aiohttp's error for an 8 KiB+ header line (or an HTTP/0.9 reply: the file's
    bytes as a status line) holds that line: the error ran to 8 KiB over several
    lines.  It is one line of bounded length now."""
    data = two_versions(tmp_path)[0]
    if what == "header":
        server = raw(serving(data, extra=b"X-Big: " + b"a\nb " * 50_000 + b"\r\n"))
    else:
        server = raw(lambda method, asked, headers: b"\n".join([b"garbage " * 2000] * 8) + b"\r\n\r\n")
    with pytest.raises(ztensor.NetworkError) as err:
        with ztensor.Reader(server.url()) as r:
            r["x"]
    text = str(err.value)
    assert server.url() in text and len(text) < 400 and "\n" not in text


@pytest.mark.parametrize("content_range", [
    lambda a, b, n: b"bytes +%d-%d/%d" % (a, b, n),
    lambda a, b, n: b"bytes %d-%d/%s" % (a, b, "_".join(str(n)).encode()),
    lambda a, b, n: ("bytes %d-%d/%s" % (a, b, "".join(chr(0x660 + int(c)) for c in str(n)))
                     ).encode(),
    lambda a, b, n: b"bytes  %d - %d / %d" % (a, b, n),
    lambda a, b, n: b"bytes %d-%d/%d" % (a, b, b),         # a total the range passes
])
def test_content_range_is_read_by_its_grammar(raw, tmp_path, content_range):
    """int() took '+0', '1_0', Arabic-Indic digits and spaces, so a malformed
    Content-Range passed as the range asked for; a total no larger than the range's
    end passed too."""
    data = two_versions(tmp_path)[0]
    server = raw(serving(data, content_range))
    with pytest.raises(ztensor.FormatError, match="Content-Range") as err:
        ztensor.Reader(server.url())
    assert server.url() in str(err.value)


def test_an_honest_raw_server_reads(raw, tmp_path):
    """The server above, honest: every read path gives the values (the checks refuse
    lies, not this)."""
    data, _, x = two_versions(tmp_path)
    server = raw(serving(data))
    with ztensor.Reader(server.url()) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
        np.testing.assert_array_equal(r.read_numpy(["x", "y"], copy=True)["x"], x)
    star = raw(serving(data, lambda a, b, n: b"bytes %d-%d/*" % (a, b)))
    with ztensor.Reader(star.url()) as r:    # an unknown total is no lie
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)
