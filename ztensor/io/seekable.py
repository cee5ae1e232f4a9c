"""zstd components as independent frames with a seek table: slices decode only the
frames they touch.

The layout is zstd's "seekable format" (contrib/seekable_format in the zstd
repository), so the bytes stay one valid zstd stream for every other reader:

* the data cut into frames of ``FRAME_BYTES`` decoded bytes, each an ordinary zstd
  frame that declares its content size;
* then a skippable frame (magic ``0x184D2A5E``, which every zstd decoder skips)
  holding the seek table: per frame its compressed and decompressed size (u32 LE
  each; we write no per-frame checksums: the component's digest covers the stored
  bytes), then the 9-byte footer: frame count (u32), descriptor byte (0), seekable
  magic ``0x8F92EAB1``.

A component of one frame or less is written as a plain single frame: there is
nothing to seek.  Writers compress full frames in parallel threads (zstandard
releases the GIL), in order.

Reading trusts nothing in the table: it must lie inside the component, its sizes
must add up to the component's stored length and to its ``uncompressed_length``,
and its length is bounded by the bytes present (8 bytes per frame), so parsing is
proportional to what the file holds (numpy arrays, 32 bytes a frame).  Every read
of a component with a table, whole (:func:`decode_whole`), a slice or a dask chunk
(:func:`decode_range`) or ``stats`` streaming (:func:`frame_chunks`), decodes its
frames one by one under one rule (:func:`decode_frames`): each frame's stored bytes
decode to exactly the size the table declares for it, and to the table's checksum
where it carries per-frame checksums (others' writers: the descriptor's checksum
flag; the low 32 bits of XXH64, taken with zstd's own hash, see
:func:`frame_checksum`).  A table that lies is a FormatError (a checksum mismatch a
ChecksumError) naming the component on every path; data written without one is
decoded whole, once per safe_open handle.
"""

from __future__ import annotations

import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import numpy as np
import zstandard

from ztensor import kernels
from ztensor.errors import ChecksumError, FormatError
from ztensor.io import zstd_stream

FRAME_BYTES = 1 << 20  # decoded bytes per frame
SKIPPABLE_MAGIC = 0x184D2A5E  # the seek table's skippable frame
SEEKABLE_MAGIC = 0x8F92EAB1  # the last 4 bytes of a seekable stream
_FOOTER = 9  # frame count u32, descriptor u8, magic u32
_ENTRY = 8  # compressed size u32, decompressed size u32
_CHECKSUM_FLAG = 0x80  # entries carry a 4-byte checksum (others' writers: checked)
MIN_FRAME_BYTES = 64 << 10  # average decoded frame below which frames are not decoded in threads


class FrameWriter:
    """Compresses bytes fed in order into independent frames; :meth:`finish`
    returns the last frame and the seek table.  Holds at most one frame of input."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.sizes: List[Tuple[int, int]] = []  # (compressed, decompressed) per frame
        self._pending = bytearray()
        self._threads = min(8, kernels.cpu_threads())

    def write(self, chunk) -> List[bytes]:
        """Frames completed by ``chunk``, in order."""
        view = memoryview(chunk).cast("B")
        out: List[bytes] = []
        if self._pending:
            take = min(FRAME_BYTES - len(self._pending), len(view))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < FRAME_BYTES:
                return out
            out.append(self._frame(self._pending))
            self._pending = bytearray()
        whole = len(view) - len(view) % FRAME_BYTES
        if whole:
            out.extend(self._frames(view[:whole]))
        self._pending += view[whole:]
        return out

    def finish(self) -> List[bytes]:
        """The last frame, then the seek table when there is more than one frame."""
        out = []
        if self._pending or not self.sizes:
            out.append(self._frame(self._pending))
            self._pending = bytearray()
        if len(self.sizes) > 1:
            out.append(seek_table(self.sizes))
        return out

    def _frame(self, data) -> bytes:
        frame = zstandard.ZstdCompressor(level=self.level).compress(data)
        self.sizes.append((len(frame), len(data)))
        return frame

    def _frames(self, view) -> List[bytes]:
        parts = [view[i : i + FRAME_BYTES] for i in range(0, len(view), FRAME_BYTES)]
        if len(parts) == 1 or self._threads == 1:
            return [self._frame(p) for p in parts]

        def compress(part):  # one compressor per call: they are not thread-safe
            return zstandard.ZstdCompressor(level=self.level).compress(part)

        with ThreadPoolExecutor(self._threads) as pool:
            frames = list(pool.map(compress, parts))
        self.sizes.extend((len(f), len(p)) for f, p in zip(frames, parts))
        return frames


def seek_table(sizes: List[Tuple[int, int]]) -> bytes:
    """The skippable frame holding the seek table for frames of ``sizes``."""
    body = b"".join(struct.pack("<II", c, d) for c, d in sizes)
    body += struct.pack("<IBI", len(sizes), 0, SEEKABLE_MAGIC)
    return struct.pack("<II", SKIPPABLE_MAGIC, len(body)) + body


class SeekTable:
    """Frame offsets of one component: ``starts[i]`` is frame i's first decoded
    byte, ``offsets[i]`` its first stored byte (relative to the component), and
    ``checksums[i]`` (None when the table carries none) the low 32 bits of the
    XXH64 of its decoded bytes.  Held in numpy arrays (32 bytes a frame), not
    Python lists of ints (about 150 bytes a frame: a 100 MB table of empty entries
    took gigabytes)."""

    def __init__(self, sizes, checksums=None) -> None:
        self.sizes = np.asarray(sizes, np.int64).reshape(-1, 2)  # (compressed, decompressed)
        self.offsets = np.zeros(len(self.sizes) + 1, np.int64)
        self.starts = np.zeros(len(self.sizes) + 1, np.int64)
        np.cumsum(self.sizes[:, 0], out=self.offsets[1:])  # at most 2**32 * 2**32: no overflow
        np.cumsum(self.sizes[:, 1], out=self.starts[1:])
        self.checksums = None if checksums is None else np.asarray(checksums, np.uint32)

    def frames_for(self, lo: int, hi: int) -> Tuple[int, int]:
        """[first, last) frames holding decoded bytes [lo, hi) (hi > lo)."""
        first = int(np.searchsorted(self.starts, lo, "right")) - 1
        last = int(np.searchsorted(self.starts, hi, "left"))
        return first, min(last, len(self.sizes))

    def parallel(self, first: int, last: int) -> bool:
        """Whether frames [first, last) are decoded in parallel threads: only where
        there are several and they average :data:`MIN_FRAME_BYTES` decoded or more.
        A thread pool task costs tens of microseconds, so a table of 200,000 empty or
        tiny frames is decoded in one loop (a reused decoder: about 2 us a frame)."""
        count = last - first
        size = int(self.starts[last] - self.starts[first])
        return 1 < count <= 1 + size // MIN_FRAME_BYTES


def read_seek_table(source, comp, **where) -> Optional[SeekTable]:
    """The component's seek table, read from the end of its stored bytes (only the
    table is fetched), or None when its stream has none (written as one frame, or
    by a writer that makes none).  FormatError when a table is there and does not
    add up."""
    if comp.encoding != "zstd" or comp.uncompressed_length is None or comp.length < _FOOTER + 8:
        return None
    at = {"obj": where.get("obj"), "component": where.get("component")}
    end = comp.offset + comp.length
    footer = bytes(source.view(end - _FOOTER, _FOOTER, "zstd seek table", **at))
    size = _table_size(footer, comp, where)
    if size is None:
        return None
    table = bytes(source.view(end - size, size, "zstd seek table", **at))
    return _parse(table, comp, where)


def parse_seek_table(stored, comp, **where) -> Optional[SeekTable]:
    """:func:`read_seek_table` over the component's stored bytes in memory."""
    if comp.encoding != "zstd" or comp.uncompressed_length is None or len(stored) < _FOOTER + 8:
        return None
    view = memoryview(stored).cast("B")
    size = _table_size(bytes(view[-_FOOTER:]), comp, where)
    return None if size is None else _parse(bytes(view[-size:]), comp, where)


def _table_size(footer, comp, where):
    """Bytes of the skippable frame holding the table, from the 9-byte footer."""
    count, descriptor, magic = struct.unpack("<IBI", footer)
    if magic != SEEKABLE_MAGIC:
        return None
    entry = _ENTRY + (4 if descriptor & _CHECKSUM_FLAG else 0)
    size = 8 + count * entry + _FOOTER
    if descriptor & 0x7C or size > comp.length:
        raise FormatError(
            f"zstd seek table of {count} frames does not fit in the "
            f"component's {comp.length} bytes",
            **where,
        )
    return size


def _parse(table, comp, where):
    count, descriptor, _ = struct.unpack("<IBI", table[-_FOOTER:])
    entry = _ENTRY + (4 if descriptor & _CHECKSUM_FLAG else 0)
    head_magic, size = struct.unpack_from("<II", table)
    if head_magic != SKIPPABLE_MAGIC or size != len(table) - 8:
        raise FormatError("zstd seek table is not in a skippable frame of its size", **where)
    # the entries straight from the bytes: u32 pairs, then the checksum word if flagged
    rows = np.frombuffer(table, "<u4", count * entry // 4, 8).reshape(count, entry // 4)
    found = SeekTable(rows[:, :2], rows[:, 2] if entry > _ENTRY else None)
    frames_end = comp.length - len(table)
    stored, decoded = int(found.offsets[-1]), int(found.starts[-1])
    if stored != frames_end or decoded != comp.uncompressed_length:
        raise FormatError(
            f"zstd seek table sums to {stored} stored and "
            f"{decoded} decoded bytes; the component holds "
            f"{frames_end} and {comp.uncompressed_length}",
            **where,
        )
    return found


# The seekable format's per-frame checksum is the low 32 bits of XXH64 (seed 0) of the
# frame's decoded bytes: exactly the content checksum zstd ends a frame with.  zstandard
# (a run-time dependency) has no hash function of its own, so the checksum is taken
# from a compressor at zstd's fastest level (about 5 GB/s: faster than decoding), its
# output dropped; docs/format-decisions.md says why.
_HASH_LEVEL = -(1 << 17)  # ZSTD_minCLevel()
_HASH_PIECE = 1 << 20  # bytes fed to the hashing compressor at a time: its output is dropped


class _FrameDecoder:
    """Decodes the frames of one table for one thread (zstandard contexts are not
    thread-safe; one reused across frames costs about 2 us a frame, a new one 10)."""

    def __init__(self, table: SeekTable, limits, where) -> None:
        self.table, self.limits, self.where = table, limits, where
        self.dctx = zstandard.ZstdDecompressor()
        self._cctx: Optional[zstandard.ZstdCompressor] = None

    def decode(self, i: int, frame, out=None):
        """Frame ``i`` (its stored bytes ``frame``) decoded: into ``out`` (exactly its
        declared size), else into a buffer that grows as bytes arrive."""
        size = int(self.table.sizes[i, 1])
        data = zstd_stream.zstd_decode(
            frame, size, self.limits, out=out, dctx=self.dctx, **self.where
        )
        self.check(i, [data])
        return data

    def chunks(self, i: int, frame, chunk_bytes: int):
        """Frame ``i`` decoded in pieces (:func:`zstd_stream.zstd_chunks`), its checksum
        checked after its last piece."""
        size = int(self.table.sizes[i, 1])
        hasher = self._hasher()
        for piece in zstd_stream.zstd_chunks(
            frame, size, self.limits, chunk_bytes, dctx=self.dctx, **self.where
        ):
            if hasher is not None:
                _feed(hasher, piece)
            yield piece
        if hasher is not None:
            self._compare(i, hasher)

    def check(self, i: int, pieces) -> None:
        """Frame ``i``'s decoded bytes (``pieces``, in order) against the table's
        checksum, when it carries one."""
        hasher = self._hasher()
        if hasher is None:
            return
        for piece in pieces:
            _feed(hasher, piece)
        self._compare(i, hasher)

    def _hasher(self):
        if self.table.checksums is None:
            return None
        if self._cctx is None:
            self._cctx = zstandard.ZstdCompressor(
                level=_HASH_LEVEL, write_checksum=True, write_content_size=False
            )
        return self._cctx.compressobj()

    def _compare(self, i: int, hasher) -> None:
        assert self.table.checksums is not None
        found = int.from_bytes(hasher.flush()[-4:], "little")
        declared = int(self.table.checksums[i])
        if found != declared:
            raise ChecksumError(
                f"zstd frame {i} decodes to bytes whose XXH64 is {found:08x}; "
                f"the seek table says {declared:08x}",
                **self.where,
            )


def _feed(hasher, piece) -> None:
    view = memoryview(piece).cast("B")
    for at in range(0, len(view), _HASH_PIECE):
        hasher.compress(view[at : at + _HASH_PIECE])


def frame_checksum(data) -> int:
    """The low 32 bits of XXH64 (seed 0) of ``data``: a seek table's per-frame
    checksum (and a zstd frame's content checksum)."""
    cctx = zstandard.ZstdCompressor(
        level=_HASH_LEVEL, write_checksum=True, write_content_size=False
    )
    hasher = cctx.compressobj()
    _feed(hasher, data)
    return int.from_bytes(hasher.flush()[-4:], "little")


def _live(table: SeekTable, first: int, last: int) -> List[int]:
    """The frames in [first, last) that hold bytes: an entry of no stored and no
    decoded bytes is nothing to decode (a stored size of 0 with decoded bytes is
    decoded, and refused as a stream that cannot produce them)."""
    sizes = table.sizes[first:last]
    return (np.flatnonzero(sizes[:, 0] | sizes[:, 1]) + first).tolist()


def decode_frames(
    stored, table: SeekTable, first: int, last: int, limits, out=None, threads=None, **where
):
    """Decoded bytes of frames [first, last) of ``table``, whose stored bytes begin
    ``stored`` (``stored`` starts at frame ``first``).  The ONE rule every read of a
    component with a table keeps (whole reads: :func:`decode_whole`; slices and dask
    chunks: :func:`decode_range`; ``stats``: :func:`frame_chunks`, its streaming
    twin): each frame's stored bytes, as the table cuts them, decode on their own to
    exactly the decoded size it declares (and to its checksum, when the table carries
    them), else a FormatError (ChecksumError) naming the component.  So a table that
    lies about its frames is refused by every path, never read one way by one and
    another way by another.

    Into ``out`` (exactly the decoded size), else a new buffer: allocated whole only
    when that is no more than the stream decoder's own first allocation would be
    (zstd_stream.first_allocation); beyond that frames are decoded one after another
    into a buffer that grows as their bytes arrive, so a lying table costs at most
    twice what its frames really decode to.  Frames of 64 KiB or more on average are
    decoded in parallel threads (:meth:`SeekTable.parallel`)."""
    view = memoryview(stored).cast("B")
    base, begin = int(table.offsets[first]), int(table.starts[first])
    size = int(table.starts[last]) - begin
    # the positions of frames [first, last) only: a slice's work and memory follow
    # the frames it reads, never the whole table (a one-row slice of a table of
    # 200,000 frames made lists of all of them: 16 MB and 12 ms a read)
    offsets = (table.offsets[first : last + 1] - base).tolist()
    starts = (table.starts[first : last + 1] - begin).tolist()
    live = _live(table, first, last)

    def frame(i):
        return view[offsets[i - first] : offsets[i - first + 1]]

    def place(i):  # frame i's decoded bytes [lo, hi) in the output
        return starts[i - first], starts[i - first + 1]

    if out is None and size > zstd_stream.first_allocation(len(view)):
        decoder = _FrameDecoder(table, limits, where)
        buf = zstd_stream.alloc(0, where)
        for i in live:
            data = decoder.decode(i, frame(i))
            lo, hi = place(i)
            if hi > len(buf):
                buf = zstd_stream.grow(buf, max(hi, min(size, 2 * len(buf))), where)
            buf[lo:hi] = np.frombuffer(data, np.uint8)
        return buf
    if out is None:
        out = zstd_stream.alloc(size, where)
    elif len(out) != size:
        raise ValueError(f"decode_frames: out must hold exactly {size} bytes")
    target = memoryview(out).cast("B")

    def run(indices):
        decoder = _FrameDecoder(table, limits, where)
        for i in indices:
            decoder.decode(i, frame(i), out=target[slice(*place(i))])

    workers = min(len(live), threads or kernels.cpu_threads())
    if workers <= 1 or not table.parallel(first, last):
        run(live)
    else:
        with ThreadPoolExecutor(workers) as pool:
            # one task a frame (frames of one table can decode at different speeds),
            # one decoder a thread
            local = threading.local()

            def one(i):
                decoder = getattr(local, "decoder", None)
                if decoder is None:
                    decoder = local.decoder = _FrameDecoder(table, limits, where)
                decoder.decode(i, frame(i), out=target[slice(*place(i))])

            list(pool.map(one, live))
    return out


def decode_whole(stored, comp, limits, out=None, threads=None, **where):
    """The whole component decoded frame by frame under :func:`decode_frames`' rule
    (in parallel threads where its frames are large: 3x the single-stream decoder
    here, on 2 cores), or None where the stream has no table (the caller decodes it
    as one stream)."""
    table = parse_seek_table(stored, comp, **where)
    if table is None:
        return None
    if out is not None and len(out) != comp.uncompressed_length:
        raise ValueError(f"decode_whole: out must hold exactly {comp.uncompressed_length} bytes")
    return decode_frames(stored, table, 0, len(table.sizes), limits, out, threads, **where)


def decode_range(source, comp, table: SeekTable, lo: int, hi: int, limits, **where):
    """Decoded bytes [lo, hi) of a component with a seek table: only the frames
    that hold them are read and decoded, each under :func:`decode_frames`' rule.
    Returns (buffer, offset of lo in it)."""

    first, last = table.frames_for(lo, hi)
    begin, end = int(table.offsets[first]), int(table.offsets[last])
    stored = source.view(
        comp.offset + begin,
        end - begin,
        "component",
        obj=where.get("obj"),
        component=where.get("component"),
    )
    data = decode_frames(stored, table, first, last, limits, **where)
    return data, lo - int(table.starts[first])


def frame_chunks(stored, comp, limits, chunk_bytes, **where):
    """The decoded bytes of a zstd component in pieces of ``chunk_bytes`` (the last
    may be shorter; each a view valid until the next is asked for), under the
    rules of a whole read: a seek table must add up, and each of its frames must
    decode to exactly its declared size and checksum (:func:`decode_frames`).
    Memory stays at two pieces.  The streaming twin of :func:`decode_whole`
    (components.read_component_chunks: ``stats``), so a file every read refuses has
    no statistics either."""
    size = comp.uncompressed_length
    table = parse_seek_table(stored, comp, **where)
    if table is None:
        yield from zstd_stream.zstd_chunks(stored, size, limits, chunk_bytes, **where)
        return
    view = memoryview(stored).cast("B")
    buf = zstd_stream.alloc(max(1, min(chunk_bytes, size)), where)
    fill = 0
    offsets = table.offsets.tolist()
    decoder = _FrameDecoder(table, limits, where)
    declared = table.sizes[:, 1].tolist()
    for i in _live(table, 0, len(table.sizes)):
        frame = view[offsets[i] : offsets[i + 1]]
        if declared[i] <= len(buf) - fill:  # fits the piece being filled: straight into it
            decoder.decode(i, frame, out=buf[fill : fill + declared[i]])
            fill += declared[i]
            if fill == len(buf):
                yield buf
                fill = 0
            continue
        for piece in decoder.chunks(i, frame, chunk_bytes):
            at = 0
            while at < len(piece):
                take = min(len(buf) - fill, len(piece) - at)
                buf[fill : fill + take] = piece[at : at + take]
                fill, at = fill + take, at + take
                if fill == len(buf):
                    yield buf
                    fill = 0
    if fill:
        yield buf[:fill]


__all__ = [
    "FrameWriter",
    "SeekTable",
    "read_seek_table",
    "decode_range",
    "decode_frames",
    "frame_checksum",
    "frame_chunks",
    "FRAME_BYTES",
]
