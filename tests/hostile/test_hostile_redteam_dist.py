"""Red-team variants of issue 21 for sharded checkpoints, remote sources and dask:
inputs nobody listed, each a break found by trying the promises of
docs/threat-model.md.  Each test names the rule it holds and the one function that
keeps it.

* A shard name that a server or filesystem normalising Unicode turns into ``..`` or
  ``/`` (fullwidth dots, U+2025, fullwidth solidus and percent), or one of dots and
  spaces alone (a dot segment on Windows), is refused: sharded.check_shard_name.
* An HTTP(S) file replaced on the server while it is open is an error, not the
  manifest of one version read with the bytes of another: source.open_url pins every
  range request to the version its HEAD described (source._pinned_version).
* Refusals are clean and bounded: a shard that is a directory, a shard name of
  100 000 characters, a redirect loop, a URL gone between a dask graph and its
  compute.
"""
import json
import os
import posixpath
import unicodedata

import numpy as np
import pytest
from http_servers import web  # noqa: F401  (a fixture)
from hypothesis import given, settings
from hypothesis import strategies as st

import ztensor
from ztensor import sharded
from ztensor.errors import NetworkNotFoundError

try:  # the nginx fixture of tests/test_remote.py (a real server on loopback)
    from test_remote import NGINX, server  # noqa: F401  (server: a fixture)
except ImportError:
    NGINX = None


def two_versions(tmp_path):
    """Two .zt files of one size whose tensors lie in other places: v1 holds x then
    y, v2 holds y (sevens) then x."""
    first, second = tmp_path / "v1.zt", tmp_path / "v2.zt"
    x = np.arange(1000, dtype=np.float32)
    with ztensor.Writer(first) as w:
        w.write_numpy("x", x)
        w.write_numpy("y", np.ones(1000, np.float32))
    with ztensor.Writer(second) as w:
        w.write_numpy("y", np.full(1000, 7, np.float32))
        w.write_numpy("x", -x)
    one, two = first.read_bytes(), second.read_bytes()
    assert len(one) == len(two) and one != two
    return one, two, x


# ----------------------------------------------------------------- shard names
NORMALISED_ESCAPES = {
    "fullwidth dots": "\uff0e\uff0e",            # NFKC: ..
    "two dot leader": "\u2025",                  # NFKC: ..
    "one dot leader pair": "\u2024\u2024",       # NFKC: ..
    "fullwidth solidus": "\uff0e\uff0e\uff0fsecret.zt",   # NFKC: ../secret.zt
    "fullwidth percent": "\uff05\uff12\uff45\uff05\uff12\uff45\uff05\uff12\uff46secret.zt",
    "fullwidth backslash": "..\uff3csecret.zt",  # NFKC: ..\\secret.zt
    "fullwidth colon": "c\uff1asecret.zt",        # NFKC: c:secret.zt
    "three dots": "...",                         # Windows drops trailing dots: ..
    "dots and a space": ".. ",
    "spaces": "   ",
}


@pytest.mark.parametrize("name", NORMALISED_ESCAPES.values(), ids=NORMALISED_ESCAPES.keys())
def test_shard_names_that_normalise_to_an_escape_are_refused(tmp_path, name):
    """Each of these passed sharded.check_shard_name (refused only later, locally, as
    a file that is not there; served by a server that folds Unicode)."""
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        sharded.check_shard_name(name, "index.json")
    folder = tmp_path / "ckpt"
    ztensor.save_sharded({"a": np.arange(4.0)}, folder)
    (folder / "model.zt.index.json").write_text(
        '{"weight_map": {"a": %s}}' % json.dumps(name))
    with pytest.raises(ztensor.FormatError, match="not a file beside the index") as err:
        with ztensor.open_sharded(folder) as r:
            r["a"]
    assert str(folder) in str(err.value)


@pytest.mark.parametrize("name", ["\uff0e\uff0e\uff0fsecret.zt", "\u2025\uff0fsecret.zt",
                                  "\uff0e\uff0e\uff05\uff12\uff46secret.zt"])
def test_a_server_that_folds_unicode_is_not_led_out_of_the_folder(web, tmp_path, name):  # noqa: F811
    """The index's shard is percent-encoded into its URL; a server that decodes it
    and folds it to NFKC (as some do, to match file names) sees ``../secret.zt``.
    Before the fix the shard above the checkpoint's folder was read and its tensor
    returned."""
    server = web(nfkc=True)
    ztensor.save_sharded({"a": np.arange(4.0)}, tmp_path / "ckpt")
    secret = (tmp_path / "ckpt" / "model-00001-of-00001.zt").read_bytes()
    server.files["/secret.zt"] = secret
    server.files["/ckpt/model.zt.index.json"] = (
        '{"weight_map": {"a": %s}}' % json.dumps(name)).encode()
    with pytest.raises(ztensor.FormatError, match="not a file beside the index"):
        with ztensor.open_sharded(server.url("/ckpt/model.zt.index.json")) as r:
            r["a"]
    assert "/secret.zt" not in server.requests


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(".. \uff0e\u2024\u2025\u2026\uff0f\uff3c\uff05\uff1a\uff1b;a2e")
               | st.characters(codec="utf-8"), min_size=1, max_size=12))
def test_every_accepted_shard_name_stays_beside_the_index(name):
    """Property: a name check_shard_name accepts is one plain file name, as given
    and NFKC-normalised, with the trailing dots and spaces Windows drops removed."""
    try:
        sharded.check_shard_name(name, "index.json")
    except ztensor.FormatError:
        return
    for form in (name, unicodedata.normalize("NFKC", name)):
        plain = form.rstrip(". ")
        assert plain and plain not in (".", "..")
        assert not set(form) & set("/\\%:;\0"), form
        folder = "/ckpt"
        assert posixpath.dirname(posixpath.normpath(posixpath.join(folder, form))) == folder


def test_shard_refusals_are_bounded_and_name_the_index(tmp_path):
    """A 100 000-character shard name was repeated whole in the message (the check of
    the name shortens it; the open's did not); a shard that is a directory was a
    NotAFileError naming the shard, advising to open it with open_sharded."""
    folder = tmp_path / "ckpt"
    ztensor.save_sharded({"a": np.arange(4.0)}, folder)
    index = folder / "model.zt.index.json"
    index.write_text('{"weight_map": {"a": "%s"}}' % ("x" * 100_000))
    with pytest.raises(ztensor.FormatError, match="cannot be opened") as err:
        with ztensor.open_sharded(folder) as r:
            r["a"]
    assert len(str(err.value)) < 400 and str(folder) in str(err.value)
    errors = []
    with ztensor.open_sharded(folder) as r:
        r.verify(errors=errors)
    assert errors and all(len(str(e)) < 400 for e in errors)
    (folder / "sub.zt").mkdir()
    index.write_text('{"weight_map": {"a": "sub.zt"}}')
    with pytest.raises(ztensor.FormatError, match="which is a directory") as err:
        with ztensor.open_sharded(folder) as r:
            r["a"]
    assert str(folder) in str(err.value) and "'a'" in str(err.value)


# ----------------------------------------------------------------- one version per read
def test_a_file_replaced_on_the_server_while_open_is_an_error(web, tmp_path):  # noqa: F811
    """The manifest of v1 read with the bytes of v2: x came back as v2's y (sevens),
    silently.  Now every range request carries If-Match: the ETag of the HEAD."""
    one, two, x = two_versions(tmp_path)
    server = web()
    server.files["/m.zt"], server.tags["/m.zt"] = one, '"v1"'
    url = server.url("/m.zt")
    with ztensor.Reader(url) as r:
        server.files["/m.zt"], server.tags["/m.zt"] = two, '"v2"'
        with pytest.raises(ztensor.FormatError, match="changed on the server") as err:
            r.read_numpy("x", copy=True)
    assert url in str(err.value) and "412" in str(err.value)
    with ztensor.Reader(url) as r:  # opened again: the new version, whole
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), -x)


def test_a_weak_etag_pins_nothing(web, tmp_path):  # noqa: F811
    """If-Match compares strongly: a weak ETag never matches, so pinning one would
    make every read a 412.  It names no version then: read only when the caller
    says so (source._pinned_version)."""
    one, _, x = two_versions(tmp_path)
    server = web()
    server.files["/w.zt"], server.tags["/w.zt"] = one, 'W/"v1"'
    with pytest.raises(ztensor.UnsupportedError, match="no version"):
        ztensor.Reader(server.url("/w.zt"))
    with ztensor.Reader(server.url("/w.zt"),
                        storage_options={"ztensor_allow_unversioned": True}) as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), x)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (.ci/run installs it)")
def test_nginx_replacing_a_file_while_open_is_an_error(server, tmp_path):
    """The same against a real server: nginx's ETag follows the file's time and
    size, and nginx answers If-Match with 412."""
    url, www, _ = server
    one, two, x = two_versions(tmp_path)
    (www / "m.zt").write_bytes(one)
    os.utime(www / "m.zt", (1_000_000_000, 1_000_000_000))
    with ztensor.Reader(f"{url}/m.zt") as r:
        (www / "next.zt").write_bytes(two)
        os.replace(www / "next.zt", www / "m.zt")   # the way a checkpoint is updated
        with pytest.raises(ztensor.FormatError, match="changed on the server"):
            r.read_numpy("x", copy=True)
    with ztensor.Reader(f"{url}/m.zt") as r:
        np.testing.assert_array_equal(r.read_numpy("x", copy=True), -x)


def test_a_redirect_loop_says_so(web):  # noqa: F811
    """aiohttp's TooManyRedirects is a ClientResponseError of status 0: it read as
    'HTTP 0 error'."""
    server = web()

    def loop(h):
        h.send_response(302)
        h.send_header("Location", "/loop.zt")
        h.send_header("Content-Length", "0")
        h.end_headers()
    server.routes["/loop.zt"] = loop
    with pytest.raises(ztensor.NetworkError, match="too many redirects") as err:
        ztensor.Reader(server.url("/loop.zt"))
    assert server.url("/loop.zt") in str(err.value)


# ----------------------------------------------------------------- dask
def test_dask_url_gone_before_compute_says_404(web, tmp_path):  # noqa: F811
    """A worker's look-up of the file's version (source.file_version) let fsspec's bare
    FileNotFoundError out: no status, not a ZTensorError."""
    pytest.importorskip("dask")  # an optional dependency: the clean-wheel run has none
    zdask = pytest.importorskip("ztensor.dask")
    one, _, x = two_versions(tmp_path)
    server = web()
    server.files["/d.zt"], server.tags["/d.zt"] = one, '"v1"'
    arr = zdask.from_zt(server.url("/d.zt"), "x", rows=100)
    np.testing.assert_array_equal(arr.compute(scheduler="synchronous"), x)
    del server.files["/d.zt"]
    with pytest.raises(NetworkNotFoundError, match="404") as err:
        arr.compute(scheduler="synchronous")
    assert server.url("/d.zt") in str(err.value)


def test_dask_source_must_be_a_path(tmp_path):
    """from_zt(bytes) built a graph carrying the whole file in every task, and its
    compute failed with a bare TypeError; a bytes path was read as file contents
    ('<bytes>: not a zTensor file').  Both are refused when the graph is made."""
    pytest.importorskip("dask")  # an optional dependency: the clean-wheel run has none
    zdask = pytest.importorskip("ztensor.dask")
    path = tmp_path / "d.zt"
    with ztensor.Writer(path) as w:
        w.write_numpy("x", np.arange(20, dtype=np.float32).reshape(20, 1))
    for source in (path.read_bytes(), os.fsencode(path)):
        with pytest.raises(TypeError, match="path or URL"):
            zdask.from_zt(source, "x")
        with pytest.raises(TypeError, match="path or URL"):
            zdask.from_zt_all(source)
    with pytest.raises(ValueError, match="rows"):
        zdask.from_zt(path, "x", rows=True)   # True is not one row
    np.testing.assert_array_equal(zdask.from_zt(path, "x", rows=7).compute(),
                                  np.arange(20, dtype=np.float32).reshape(20, 1))


def test_dask_reads_a_checkpoint_of_unevenly_divided_rows(tmp_path):
    """Chunks that do not divide the rows, over a sharded checkpoint (held)."""
    pytest.importorskip("dask")  # an optional dependency: the clean-wheel run has none
    zdask = pytest.importorskip("ztensor.dask")
    a = np.arange(1001 * 3, dtype=np.int32).reshape(1001, 3)
    folder = tmp_path / "ckpt"
    ztensor.save_sharded({"a": a, "b": a[:5].astype(np.float64)}, folder, max_shard_size=100)
    arr = zdask.from_zt(folder, "a", rows=97)
    assert arr.chunks[0][-1] == 1001 % 97
    np.testing.assert_array_equal(arr.compute(scheduler="threads"), a)
