"""One zstd stream decoded under the limits: the output grows only as decoded bytes
arrive, never on the strength of a declared size.  Used by every zstd read
(io/components.py for whole components, io/seekable.py for frames)."""

from __future__ import annotations

import numpy as np
import zstandard

from ztensor import spec
from ztensor.errors import FormatError, LimitError

_FIRST_EXTRA = 4 << 20  # bytes a first allocation may exceed the ratio guess by


def zstd_decode(stored, size, limits, out=None, **where):
    """Decode a zstd stream (one or more frames, skippable ones too) that must yield
    exactly ``size`` bytes (``size=None``, v1.1 files: whatever it yields, up to the
    per-component limit).

    Nothing is allocated on the strength of a declaration alone: frame headers are
    not trusted, and the output buffer starts at a size the compressed bytes make
    plausible and doubles only as bytes actually arrive, never past ``size`` (nor
    past what zstd can expand the stored bytes to).  A lying stream therefore costs
    at most twice what it really decodes to."""
    cap = spec.zstd_max_output(len(stored))
    if size is None:
        cap = min(cap, limits.max_component_size)
    elif size > cap:
        raise FormatError(
            f"uncompressed_length {size} is more than {len(stored)} bytes of zstd data can produce",
            **where,
        )
    want = cap if size is None else size
    if out is not None and (size is None or len(out) != size):
        raise ValueError(f"zstd_decode: out must hold exactly {size} bytes")
    reader = zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=True)
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
        if size is None:
            if done == cap and reader.read(1):
                raise LimitError(
                    f"zstd stream yields more than the per-component limit of {cap} bytes", **where
                )
            return out[:done] if done < len(out) else out
        if done < size:
            raise FormatError(
                f"zstd stream ends after {done} bytes; uncompressed_length declares {size}", **where
            )
        if reader.read(1):
            raise FormatError(
                f"zstd stream yields more than the {size} bytes its uncompressed_length declares",
                **where,
            )
        return out
    except zstandard.ZstdError as exc:
        raise FormatError(f"corrupt zstd data: {exc}", **where) from None
    finally:
        reader.close()


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
