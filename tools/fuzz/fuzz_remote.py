"""Fuzz target 11 (issue 21): the remote source.  The first byte picks the mode:

0. the file-object path of ztensor/io/source.py driven directly: a seekable object whose
   reads return more or fewer bytes than asked and whose ``fs.cat_ranges`` (fsspec's
   parallel range requests) returns blobs of any length, over a valid .zt file;
1. ``Reader(url)`` against a loopback HTTP server (127.0.0.1, a thread) that answers
   each request as drawn: status, Content-Range, Content-Length, Accept-Ranges, body
   (tests/http_servers.py's HostileHTTP, tests/hostile_strategies.py's http_answers);
2. ``open_sharded(url)`` of a served index with hostile shard names: every request
   must stay in the index's folder (the server decodes %2f and '..' as a naive static
   server does) and no byte of the secret above it comes back.

A result or a ZTensorError; a missing file (404 to the first request) may be a
FileNotFoundError, as for a local path.  Responses close their connection, so a short
body is an error, never a wait."""
import io

import atheris

from common import LIMITS, run
import hostile  # noqa: E402
from hostile import hs
from http_servers import HostileHTTP  # tests/, on the path once hostile is imported

import ztensor

CTX = hs.Ctx()
SERVER = HostileHTTP(honest=hs.Answer)
COUNT = [0]


class LyingFile(io.RawIOBase):
    """A seekable file object over ``data`` whose reads and range fetches lie as drawn."""

    def __init__(self, data, d):
        self.data, self.d, self.pos = data, d, 0
        self.fs = self
        self.path = "lying.zt"

    def seekable(self):
        return True

    def readable(self):
        return True

    def seek(self, offset, whence=0):
        self.pos = offset if whence == 0 else len(self.data) + offset if whence == 2 \
            else self.pos + offset
        return self.pos

    def read(self, n=-1):
        chunk = self.data[self.pos:] if n < 0 else self.data[self.pos:self.pos + n]
        how = self.d.int(0, 7)
        if how == 1:
            chunk = chunk[:len(chunk) // 2]
        elif how == 2:
            chunk = chunk + b"\0" * self.d.int(1, 9)
        elif how == 3:
            chunk = b""
        self.pos += len(chunk)
        return chunk

    def cat_ranges(self, paths, starts, ends, on_error="raise"):
        out = []
        for s, e in zip(starts, ends):
            blob = self.data[s:e]
            how = self.d.int(0, 5)
            if how == 1:
                blob = blob[:self.d.int(0, len(blob))]
            elif how == 2:
                blob = blob + self.d.bytes(8)
            out.append(blob)
        return out


def check_direct(d):
    blob, _ = hs.zt_file(d)
    f = LyingFile(blob, d)
    try:
        with ztensor.Reader(f, limits=LIMITS, verify=d.bool()) as r:
            names = r.keys()
            r.read_numpy(names, copy=True) if names and d.bool() else \
                [r.read_numpy(n, copy=True) for n in names]
    except ztensor.ZTensorError:
        pass


def check_http(d):
    COUNT[0] += 1
    blob, _ = hs.zt_file(d)
    plan = hs.http_answers(d)
    path = f"/r{COUNT[0]}/model.zt"
    SERVER.reset({path: blob}, plan)
    try:
        with ztensor.Reader(SERVER.url(path), limits=LIMITS, verify=True) as r:
            for name in r.keys():
                hs.check_array(r.read_numpy(name), 1 << 24, name)
    except ztensor.ZTensorError:
        pass
    except FileNotFoundError:
        if not (plan and plan[0].status == 404):
            raise


def check_sharded(d):
    COUNT[0] += 1
    case = hs.gen_sharded(d, CTX)
    folder = f"/s{COUNT[0]}"
    files = {f"{folder}/{n}": b for n, b in case.files.items()}
    files["/secret.zt"] = CTX.secret_zt.read_bytes()
    files["/secret.safetensors"] = CTX.secret_st.read_bytes()
    SERVER.reset(files, [])
    try:
        with ztensor.open_sharded(SERVER.url(f"{folder}/{case.main}")) as r:
            for name in r.keys():
                hs.check_array(r.read_numpy(name), 1 << 24, name)
    except ztensor.ZTensorError:
        pass
    import posixpath
    from urllib.parse import unquote, urlsplit
    for _, raw, _ in SERVER.requests:
        local = posixpath.normpath(unquote(urlsplit(raw).path))
        if not local.startswith(folder + "/"):
            raise hs.Breach(f"request {raw!r} outside {folder}/: {case!r}")


def test_one_input(data: bytes):
    if not data:
        return
    d = hs.ProviderDraw(atheris.FuzzedDataProvider(data[1:]))
    [check_direct, check_http, check_sharded][data[0] % 3](d)


if __name__ == "__main__":
    run(test_one_input)
