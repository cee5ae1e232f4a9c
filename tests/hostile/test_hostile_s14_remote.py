"""Session 14: remote sources, tried as a hostile server and as threads would.
Each test names the one function that keeps its rule."""
import sys
import threading

import numpy as np
import pytest
from http_servers import raw  # noqa: F401  (a fixture)

import ztensor
import ztensor.numpy as ztnp


def test_two_readers_of_one_memory_url_keep_their_own_position():
    """fsspec's memory filesystem hands every opener its one stored file object:
    two Readers of one memory:// URL moved each other's position between a seek and
    a read, and threads got another tensor's values, or the manifest's bytes as
    floats.  Each gets a position of its own (``source._OwnPosition``)."""
    pytest.importorskip("fsspec")
    url = "memory://s14-bucket/m.zt"
    ztnp.save_file({f"t{i}": np.full(64, i, np.float32) for i in range(8)}, url)
    readers = [ztensor.Reader(url) for _ in range(4)]
    bad = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def run(k):
        for j in range(200):
            i = (j + k) % 8
            got = readers[k].read_numpy(f"t{i}", copy=True)
            if not (got == i).all():
                bad.append((k, i))

    try:
        threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
        for r in readers:
            r.close()
    assert bad == []


def test_a_reply_holding_part_of_the_range_is_refused(raw, tmp_path):
    """A server answering every range with at most 100 bytes, honestly labelled,
    was read piece by piece, a request each: a 64 MiB read of 1-byte replies would
    be 67 million requests, each inside the deadline.  A reply holding less than
    was asked is a FormatError, as docs/remote.md says and the batch read already
    had it (``source._read_exactly``)."""
    path = tmp_path / "m.zt"
    ztnp.save_file({"w": np.arange(50000, dtype=np.uint8)}, str(path))
    data = path.read_bytes()
    count = [0]

    def reply(method, asked, headers):
        count[0] += 1
        if method == "HEAD" or asked is None:
            return (b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\nETag: "v"\r\n'
                    b"Connection: close\r\n\r\n" % len(data))
        first = asked[0]
        last = min(asked[1], first + 99, len(data) - 1)
        return (b'HTTP/1.1 206 P\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n'
                b'ETag: "v"\r\nConnection: close\r\n\r\n'
                % (first, last, len(data), last - first + 1)) + data[first:last + 1]

    with pytest.raises(ztensor.FormatError, match="returned 100 bytes") as err:
        with ztensor.Reader(raw(reply).url("/m.zt")) as r:
            r.read_numpy("w")
    assert "127.0.0.1" in str(err.value)
    assert count[0] < 20  # refused at the first short reply, not read piece by piece


@pytest.mark.parametrize("head_length", [None, b"-5", b"*"])
def test_a_remote_checkpoint_without_lengths_is_a_clean_refusal(raw, tmp_path, head_length):
    """A server stating no usable length for a shard (none, -5, "*"): verify() and
    read_all() raised a bare TypeError (int(None)) while ls and info said what was
    wrong (``sharded._size``)."""
    ztensor.save_sharded({"a": np.ones(1000, np.float32), "b": np.ones(1000, np.float32)},
                         str(tmp_path), max_shard_size=4000)
    files = {"/ck/" + p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def reply(method, asked, headers):
        data = files.get(headers[":path"])
        if data is None:
            return b"HTTP/1.1 404 NF\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        if method == "HEAD":
            length = b"" if head_length is None else b"Content-Length: " + head_length + b"\r\n"
            return b"HTTP/1.1 200 OK\r\n" + length + b'ETag: "v"\r\nConnection: close\r\n\r\n'
        if asked is None:
            return b'HTTP/1.1 200 OK\r\nETag: "v"\r\nConnection: close\r\n\r\n' + data
        first, last = asked[0], min(asked[1], len(data) - 1)
        return (b'HTTP/1.1 206 P\r\nContent-Range: bytes %d-%d/%d\r\nContent-Length: %d\r\n'
                b'ETag: "v"\r\nConnection: close\r\n\r\n'
                % (first, last, len(data), last - first + 1)) + data[first:last + 1]

    url = raw(reply).url("/ck/model.zt.index.json")
    for call in (lambda ck: ck.verify(), lambda ck: ck.read_all()):
        with pytest.raises(ztensor.ZTensorError, match="no length"):
            with ztensor.open_sharded(url) as ck:
                call(ck)


def test_a_checkpoint_rewritten_while_open_is_not_mixed(tmp_path):
    """open_sharded, read a; save_sharded rewrote the checkpoint; reading b opened
    shard two of the new version: a 1.0 and b 2.0, one silently mixed checkpoint.
    A shard opened after the local index was rewritten or removed is refused
    (``sharded.ShardedReader._open_checked``); what was read stays valid."""
    folder = str(tmp_path / "ck")
    ztensor.save_sharded({"a": np.full(100, 1.0), "b": np.full(100, 1.0)}, folder,
                         max_shard_size=900)
    with ztensor.open_sharded(folder) as ck:
        a = ck["a"]
        ztensor.save_sharded({"a": np.full(100, 2.0), "b": np.full(100, 2.0)}, folder,
                             max_shard_size=900)
        with pytest.raises(ztensor.FormatError, match="changed while open") as err:
            ck["b"]
        assert err.value.obj == "b"
        assert float(a[0]) == 1.0
    with ztensor.open_sharded(folder) as ck:  # opened again: the new version, whole
        assert float(ck["a"][0]) == float(ck["b"][0]) == 2.0


def test_get_slice_of_a_checkpoint_keeps_one_handle_a_shard(tmp_path):
    """ShardedReader.get_slice opened a new safe_open for every call and never
    closed it: 300 kept slices held 307 descriptors past MAX_OPEN_SHARDS, each
    collected one a ResourceWarning, and close() closed none.  One handle a shard,
    closed with the checkpoint (``sharded.ShardedReader.get_slice``)."""
    import os

    folder = str(tmp_path / "ck")
    ztensor.save_sharded({"a": np.arange(100.0), "b": np.arange(100.0)}, folder,
                         max_shard_size=900)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    ck = ztensor.open_sharded(folder)
    slices = [ck.get_slice("a" if i % 2 else "b") for i in range(300)]
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds + 4
    assert slices[7][2:5].tolist() == [2.0, 3.0, 4.0]
    ck.close()
    with pytest.raises(ztensor.ClosedError):
        slices[8][0:1]
