"""zstd components as independent frames with a seek table: slices decode only the
frames they touch.

The layout is zstd's "seekable format" (contrib/seekable_format in the zstd
repository), so the bytes stay one valid zstd stream for every other reader:

* the data cut into frames of ``FRAME_BYTES`` decoded bytes, each an ordinary zstd
  frame that declares its content size;
* then a skippable frame (magic ``0x184D2A5E``, which every zstd decoder skips)
  holding the seek table: per frame its compressed and decompressed size (u32 LE
  each; no per-frame checksums: the component's digest covers the stored bytes),
  then the 9-byte footer: frame count (u32), descriptor byte (0), seekable magic
  ``0x8F92EAB1``.

A component of one frame or less is written as a plain single frame: there is
nothing to seek.  Writers compress full frames in parallel threads (zstandard
releases the GIL), in order.

Reading trusts nothing in the table: it must lie inside the component, its sizes
must add up to the component's stored length and to its ``uncompressed_length``,
and its length is bounded by the bytes present (8 bytes per frame), so parsing is
proportional to what the file holds (numpy arrays, 32 bytes a frame).  Where a
whole read decodes frame by frame (frames of 64 KiB or more on average:
SeekTable.by_frame), each decoded frame must yield exactly its declared size
(zstd_stream.zstd_decode); a table of many tiny or empty frames is decoded as one
stream instead, so its work follows the bytes, not the frame count.  ``stats``
streams under the same rules (:func:`frame_chunks`).  A table that does not add up is a
FormatError naming the component; data written without one is decoded whole, once
per safe_open handle.
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Tuple

import numpy as np
import zstandard

from ztensor import kernels
from ztensor.errors import FormatError
from ztensor.io import zstd_stream

FRAME_BYTES = 1 << 20  # decoded bytes per frame
SKIPPABLE_MAGIC = 0x184D2A5E  # the seek table's skippable frame
SEEKABLE_MAGIC = 0x8F92EAB1  # the last 4 bytes of a seekable stream
_FOOTER = 9  # frame count u32, descriptor u8, magic u32
_ENTRY = 8  # compressed size u32, decompressed size u32
_CHECKSUM_FLAG = 0x80  # entries carry a 4-byte checksum (others' writers)
MIN_FRAME_BYTES = 64 << 10  # average decoded frame below which frames are not decoded one by one


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
    byte, ``offsets[i]`` its first stored byte (relative to the component).  Held
    in numpy arrays (32 bytes a frame), not Python lists of ints (about 150 bytes
    a frame: a 100 MB table of empty entries took gigabytes)."""

    def __init__(self, sizes) -> None:
        self.sizes = np.asarray(sizes, np.int64).reshape(-1, 2)  # (compressed, decompressed)
        self.offsets = np.zeros(len(self.sizes) + 1, np.int64)
        self.starts = np.zeros(len(self.sizes) + 1, np.int64)
        np.cumsum(self.sizes[:, 0], out=self.offsets[1:])  # at most 2**32 * 2**32: no overflow
        np.cumsum(self.sizes[:, 1], out=self.starts[1:])

    def frames_for(self, lo: int, hi: int) -> Tuple[int, int]:
        """[first, last) frames holding decoded bytes [lo, hi) (hi > lo)."""
        first = int(np.searchsorted(self.starts, lo, "right")) - 1
        last = int(np.searchsorted(self.starts, hi, "left"))
        return first, min(last, len(self.sizes))

    def by_frame(self, size: int) -> bool:
        """Whether a whole read decodes this table's frames one by one (in parallel,
        each held to its declared size: :func:`decode_whole`, :func:`frame_chunks`).
        Only where the frames average :data:`MIN_FRAME_BYTES` decoded or more: each
        costs a decoder and a task (tens of microseconds), so a table of 200,000
        empty or tiny frames (1.6 MB) took 6 s to read this way; such a stream is
        decoded as one (its sums are checked all the same), in one C loop."""
        return 1 < len(self.sizes) <= 1 + size // MIN_FRAME_BYTES


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
    # the entries straight from the bytes (u32 pairs, a checksum word skipped)
    rows = np.frombuffer(table, "<u4", count * entry // 4, 8).reshape(count, entry // 4)
    found = SeekTable(rows[:, :2])
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


def decode_whole(stored, comp, limits, out=None, threads=None, **where):
    """The whole component decoded frame by frame in parallel threads, each frame
    straight into its place (3x the single-stream decoder here, on 2 cores), or
    None where the stream has no table (the caller decodes it as one stream).

    The output is allocated at the declared size only when that is no more than
    the single-stream decoder's own first allocation would be (zstd_stream.py);
    beyond that the stream decoder's grow-as-bytes-arrive rule applies instead."""

    table = parse_seek_table(stored, comp, **where)
    size = comp.uncompressed_length
    if table is None or not table.by_frame(size):
        return None
    if out is None:
        if size > zstd_stream.first_allocation(len(stored)):
            return None
        out = zstd_stream.alloc(size, where)
    elif len(out) != size:
        raise ValueError(f"decode_whole: out must hold exactly {size} bytes")
    view = memoryview(stored).cast("B")
    target = memoryview(out).cast("B")

    offsets, starts = table.offsets.tolist(), table.starts.tolist()

    def one(i):
        zstd_stream.zstd_decode(
            view[offsets[i] : offsets[i + 1]],
            starts[i + 1] - starts[i],
            limits,
            out=target[starts[i] : starts[i + 1]],
            **where,
        )

    workers = min(len(table.sizes), threads or kernels.cpu_threads())
    if workers <= 1:
        for i in range(len(table.sizes)):
            one(i)
    else:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(len(table.sizes))))
    return out


def decode_range(source, comp, table: SeekTable, lo: int, hi: int, limits, **where):
    """Decoded bytes [lo, hi) of a component with a seek table: only the frames
    that hold them are read and decoded.  Returns (buffer, offset of lo in it)."""

    first, last = table.frames_for(lo, hi)
    begin, end = int(table.offsets[first]), int(table.offsets[last])
    decoded_first = int(table.starts[first])
    stored = source.view(
        comp.offset + begin,
        end - begin,
        "component",
        obj=where.get("obj"),
        component=where.get("component"),
    )
    data = zstd_stream.zstd_decode(stored, int(table.starts[last]) - decoded_first, limits, **where)
    return data, lo - decoded_first


def frame_chunks(stored, comp, limits, chunk_bytes, **where):
    """The decoded bytes of a zstd component in pieces of ``chunk_bytes`` (the last
    may be shorter; each a view valid until the next is asked for), under the
    rules of a whole read (:func:`decode_whole`): a seek table must add up, and
    where its frames are decoded one by one (:meth:`SeekTable.by_frame`) each must
    yield exactly its declared size.  Memory stays at two pieces.  The streaming
    twin of :func:`decode_whole` (components.read_component_chunks: ``stats``),
    so a file every read refuses has no statistics either."""
    size = comp.uncompressed_length
    table = parse_seek_table(stored, comp, **where)
    if table is None or not table.by_frame(size):
        yield from zstd_stream.zstd_chunks(stored, size, limits, chunk_bytes, **where)
        return
    view = memoryview(stored).cast("B")
    buf = zstd_stream.alloc(max(1, min(chunk_bytes, size)), where)
    fill = 0
    offsets, starts = table.offsets.tolist(), table.starts.tolist()
    for i in range(len(table.sizes)):
        frame = view[offsets[i] : offsets[i + 1]]
        for piece in zstd_stream.zstd_chunks(
            frame, starts[i + 1] - starts[i], limits, chunk_bytes, **where
        ):
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
    "frame_chunks",
    "FRAME_BYTES",
]
