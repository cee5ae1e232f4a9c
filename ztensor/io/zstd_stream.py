"""One zstd stream decoded under the limits: the output grows only as decoded bytes
arrive, never on the strength of a declared size.  Used by every zstd read
(io/components.py for whole components, io/seekable.py for frames);
:func:`zstd_chunks` is the same stream a bounded piece at a time, under the same
rules (:func:`_output_cap` before decoding, :func:`_check_end` after), for readers
that need never hold the whole of it (``ztensor stats``).  Both first hold the stored
bytes to whole frames (:func:`check_frames`)."""

from __future__ import annotations

import numpy as np
import zstandard

from ztensor import kernels, spec
from ztensor.errors import FormatError, LimitError

_FIRST_EXTRA = 4 << 20  # bytes a first allocation may exceed the ratio guess by


def zstd_decode(stored, size, limits, out=None, dctx=None, **where):
    """Decode a zstd stream (one or more frames, skippable ones too) that must yield
    exactly ``size`` bytes (``size=None``, v1.1 files: whatever it yields, up to the
    per-component limit).

    Nothing is allocated on the strength of a declaration alone: frame headers are
    not trusted, and the output buffer starts at a size the compressed bytes make
    plausible and doubles only as bytes actually arrive, never past ``size`` (nor
    past what zstd can expand the stored bytes to).  A lying stream therefore costs
    at most twice what it really decodes to.  ``dctx``: a ZstdDecompressor to reuse
    (one thread's: seekable.py decodes many small frames with one)."""
    cap = _output_cap(stored, size, limits, where)
    check_frames(stored, where)
    want = cap if size is None else size
    if out is not None and (size is None or len(out) != size):
        raise ValueError(f"zstd_decode: out must hold exactly {size} bytes")
    reader = (zstandard.ZstdDecompressor() if dctx is None else dctx).stream_reader(
        stored, read_across_frames=True
    )
    try:
        if out is None:  # else: the caller's buffer, of exactly the declared size
            out = alloc(min(want, first_allocation(len(stored))), where)
        done = 0
        while True:
            if done == len(out):
                if done == want:
                    break
                out = grow(out, min(want, 2 * done), where)
            n = reader.readinto(memoryview(out)[done:])
            if n == 0:
                break
            done += n
        _check_end(reader, done, size, cap, where)
        if size is None:
            return out[:done] if done < len(out) else out
        return out
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd data: {exc}", **where) from None
    finally:
        reader.close()


def zstd_chunks(stored, size, limits, chunk_bytes, dctx=None, **where):
    """The bytes :func:`zstd_decode` would return, yielded in order as uint8 arrays of
    ``chunk_bytes`` each (the last may be shorter), under the same rules: a declared
    ``size`` the stored bytes cannot produce is refused before anything is decoded,
    a stream that ends short of ``size`` or yields more is a FormatError (raised
    where the stream ends: a short one's last partial chunk is never yielded, a long
    one's error follows the ``size`` bytes), corrupt data a FormatError, and with
    ``size=None`` the per-component limit applies.

    Memory stays at one chunk whatever the stream decodes to: every chunk is a view
    of the same buffer, valid until the next is asked for (copy what must outlive
    that).  A caller that needs whole elements passes a multiple of their size;
    ``dctx`` is as for :func:`zstd_decode`."""
    if type(chunk_bytes) is not int or chunk_bytes < 1:
        raise ValueError(f"zstd_chunks: chunk_bytes must be a positive int, got {chunk_bytes!r}")
    cap = _output_cap(stored, size, limits, where)
    check_frames(stored, where)
    want = cap if size is None else size
    buf = alloc(max(1, min(chunk_bytes, want)), where)
    reader = (zstandard.ZstdDecompressor() if dctx is None else dctx).stream_reader(
        stored, read_across_frames=True
    )
    try:
        done = 0
        while done < want:
            piece = memoryview(buf)[: min(len(buf), want - done)]
            n = _fill(reader, piece)
            done += n
            if n < len(piece):  # the stream has ended
                # checked before its last piece is handed out: a stream short of its
                # declared size never gives the caller a partial element
                _check_end(reader, done, size, cap, where)
                if n:
                    yield buf[:n]
                return
            yield buf[:n]
        _check_end(reader, done, size, cap, where)
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd data: {exc}", **where) from None
    finally:
        reader.close()


_FRAME_FAULTS = {
    1: "the stored bytes end inside the frame that starts at byte {at}",
    2: "no zstd frame starts at byte {at}",
    3: "the frame at byte {at} has a reserved header bit or block type",
}


def check_frames(stored, where) -> None:
    """FormatError unless the stored bytes are exactly whole zstd frames (skippable
    ones too), walked by their headers before anything is decoded.  A decoder that
    runs out of input inside a frame stops without a word, so a stream cut short
    (its checksum or last block missing) whose bytes so far match the declared
    size read as whole (kernels.zstd_frames)."""
    data = stored if isinstance(stored, bytes) else memoryview(stored).cast("B")
    verdict, at, _ = kernels.zstd_frames(data)
    if verdict:
        fault = _FRAME_FAULTS[verdict].format(at=at)
        raise FormatError(f"corrupt zstd data: {fault} ({len(data)} bytes stored)", **where)


def _fill(reader, view) -> int:
    """Read into all of ``view`` unless the stream ends first; the bytes read."""
    done = 0
    while done < len(view):
        n = reader.readinto(view[done:])
        if n == 0:
            break
        done += n
    return done


def _output_cap(stored, size, limits, where) -> int:
    """The most the stream may yield: what its stored bytes can decode to, and with
    no declared size the per-component limit too.  FormatError, before anything is
    decoded, when a declared ``size`` is more than the stored bytes can produce."""
    cap = spec.zstd_max_output(len(stored))
    if size is None:
        return min(cap, limits.max_component_size)
    if size > cap:
        raise FormatError(
            f"uncompressed_length {size} is more than {len(stored)} bytes of zstd data can produce",
            **where,
        )
    return cap


def _check_end(reader, done, size, cap, where) -> None:
    """After ``done`` bytes were read and the reader stopped: the stream must yield
    exactly the declared ``size`` (FormatError when short or long), or with none
    declared no more than ``cap`` (LimitError).  The one home of the length rule."""
    if size is None:
        if done == cap and reader.read(1):
            raise LimitError(
                f"zstd stream yields more than the per-component limit of {cap} bytes", **where
            )
        return
    if done < size:
        raise FormatError(
            f"zstd stream ends after {done} bytes; uncompressed_length declares {size}", **where
        )
    if reader.read(1):
        raise FormatError(
            f"zstd stream yields more than the {size} bytes its uncompressed_length declares",
            **where,
        )


_FIRST_GUESS_RATIO = 16  # typical weights compress 1.1-3x; zeros far more


def first_allocation(stored_length: int) -> int:
    """The most a decoder allocates before decoded bytes show more is needed."""
    return _FIRST_GUESS_RATIO * stored_length + _FIRST_EXTRA


def alloc(nbytes, where):
    try:
        return np.empty(nbytes, np.uint8)
    except MemoryError:
        raise LimitError(f"cannot allocate {nbytes} bytes to decode into", **where) from None


def grow(buf, nbytes, where):
    bigger = alloc(nbytes, where)
    bigger[: len(buf)] = buf
    return bigger
