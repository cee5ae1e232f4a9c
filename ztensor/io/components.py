"""READ 4 / WRITE 1: one component's stored bytes <-> a flat numpy array.

Reading: bounds-checked view of the stored bytes, digest check when asked, zstd
decoding into a buffer of exactly the declared size, then the storage dtype with
its byte order.  Writing: an array's little-endian bytes, in bounded chunks,
through optional zstd frames (with a seek table: ztensor/io/seekable.py) and digest,
into the blob writer.
"""

from __future__ import annotations

import numpy as np

from ztensor import dtypes, kernels
from ztensor.errors import FormatError, UnsupportedError
from ztensor.io import digests, seekable, zstd_stream
from ztensor.objects import ComponentSpec

_CHUNK = 4 << 20  # bytes per step when swapping or compressing while writing


def storage_dtype(comp) -> np.dtype:
    """numpy dtype of a component's stored elements, in the byte order on disk."""
    base = dtypes.STORAGE[comp.dtype].numpy
    return base.newbyteorder(">") if comp.byteorder == ">" else base


def read_component(source, comp, *, verify=False, limits, out=None, **where) -> np.ndarray:
    """The component's elements as a 1-D array of its storage dtype, in disk byte
    order: a view of the source for raw components (a copy where the view would be
    writable and another part shares the bytes: see below), a new array for zstd
    ones, or ``out`` (a uint8 buffer of exactly the decoded size, for zstd
    components: ``Reader.read_into`` decodes into the caller's memory).  ``where``
    (path, obj, component) names the component in errors.

    Every read of a whole component comes here (safe_open's slice of zstd frames,
    never used when digests are checked, calls :func:`require_readable` itself),
    so these rules hold on every path: the part may be decoded here
    (:func:`require_readable`), its digest is checked over the bytes it covers
    (:func:`check_digest`), and no writable view aliases another result.
    :func:`read_component_chunks` is its piecewise twin, under the same rules."""
    require_readable(comp, **where)
    stored = source.view(
        comp.offset,
        comp.length,
        "component",
        obj=where.get("obj"),
        component=where.get("component"),
    )
    if verify:
        check_digest(comp, stored, "stored", **where)
    dtype = storage_dtype(comp)
    if comp.encoding == "zstd":
        data = seekable.decode_whole(stored, comp, limits, out=out, **where)  # in parallel
        if data is None:
            data = zstd_stream.zstd_decode(
                stored, comp.uncompressed_length, limits, out=out, **where
            )
        unit = dtype.itemsize * dtypes.element_ratio(comp.dtype, comp.type)
        if len(data) % unit:  # only possible for v1.1 streams without a declared size
            raise FormatError(
                f"zstd stream yields {len(data)} bytes, not a whole number of "
                f"{comp.type or comp.dtype} elements",
                **where,
            )
    elif comp.encoding == "raw":
        if out is not None:
            raise ValueError("read_component: out is for zstd components")
        data = stored
        if comp.shared and source.copy_on_write and source.mapped:
            # a v2 blob another part also references (weight tying): a view of the
            # private mapping would be writable, and writing through one result
            # would change the other, so each gets its own copy
            data = copy_array(np.frombuffer(stored, np.uint8))
    else:
        raise UnsupportedError(
            f"encoding {comp.encoding!r} is not one this reader decodes", **where
        )
    if verify:
        check_digest(comp, data, "decoded", **where)
    return np.frombuffer(data, dtype)


def read_component_chunks(source, comp, *, verify=False, limits, chunk_bytes, **where):
    """The elements :func:`read_component` returns, yielded in order as 1-D arrays of
    the storage dtype (disk byte order) of about ``chunk_bytes`` bytes each (whole
    elements: a complex one's two floats stay together), under the same rules:
    :func:`require_readable`, the digest checked over the bytes it covers when
    ``verify`` (stored bytes first; decoded ones as they stream, a mismatch raised
    after the last piece), and for zstd exactly the declared size
    (zstd_stream.zstd_chunks: a short or long stream is a FormatError), and a seek
    table held to the rules of a whole read (seekable.frame_chunks).

    A zstd component is decoded a piece at a time, so memory stays at one piece
    whatever it decodes to; each piece is valid until the next is asked for.  It is
    decoded whole first (read_component, bounded by the limits as every read is)
    only for an xxh3 digest over the decoded bytes when ``verify`` (v2 parts: the C
    kernel hashes one buffer).  A v1.1 zstd component that declares no size is a
    ValueError: the Reader counts it against ``max_total_decompressed`` once decoded
    (Reader._count_undeclared), so it is read through the Reader."""
    hasher = None
    if verify and comp.digest is not None and comp.digest_over == "decoded":
        hasher = digests.incremental(comp.digest, **where)  # None for xxh3
    dtype = storage_dtype(comp)
    unit = dtype.itemsize * dtypes.element_ratio(comp.dtype, comp.type)
    chunk_bytes = max(unit, chunk_bytes - chunk_bytes % unit)
    if comp.encoding != "zstd" or (verify and comp.digest_over == "decoded" and hasher is None):
        data = read_component(source, comp, verify=verify, limits=limits, **where)
        step = chunk_bytes // dtype.itemsize
        for start in range(0, len(data), step):
            yield data[start : start + step]
        return
    if comp.uncompressed_length is None:
        raise ValueError("read_component_chunks: a zstd component that declares no size")
    require_readable(comp, **where)
    stored = source.view(
        comp.offset,
        comp.length,
        "component",
        obj=where.get("obj"),
        component=where.get("component"),
    )
    if verify:
        check_digest(comp, stored, "stored", **where)
    for piece in seekable.frame_chunks(stored, comp, limits, chunk_bytes, **where):
        if hasher is not None:
            hasher.update(piece)
        yield np.frombuffer(piece, dtype)
    if hasher is not None:
        digests.check(hasher, comp.digest, **where)


def check_digest(comp, data, covering, **where) -> None:
    """Verify ``comp.digest`` if it covers ``data``: ``covering`` says which bytes
    ``data`` is, ``"stored"`` (as in the file: v1 digests) or ``"decoded"`` (after
    decoding: v2 parts' digests, which name the content).  The one place that
    matches a digest to its bytes; ChecksumError on a mismatch."""
    if comp.digest is not None and comp.digest_over == covering:
        digests.verify(data, comp.digest, **where)


def require_local(comp, **where) -> None:
    """Refuse a v2 part whose bytes are in another file (a shard)."""
    if comp.shard is not None:
        raise UnsupportedError(
            f"its bytes are in shard {comp.shard!r} of a multi-file v2 "
            "model, which this reader does not open",
            **where,
        )


def require_readable(comp, **where) -> None:
    """Refuse to decode a component this reader must not: a v2 part in another file
    (:func:`require_local`), or one whose logical type v2 requires a reader to
    refuse rather than reinterpret (f8_e8m0, f4_e2m1, unknown types).  Structural
    access to the stored bytes (``Reader.stored_bytes``) needs only the first."""
    require_local(comp, **where)
    if comp.digest_over == "decoded" and comp.type not in dtypes.DECODED_TYPES:
        raise UnsupportedError(
            f"logical type {comp.type!r} is not one this reader "
            "decodes (a v2 reader must refuse, not reinterpret)",
            **where,
        )


_COPY_CHUNK = 16 << 20


def copy_array(arr: np.ndarray) -> np.ndarray:
    """An owned copy of a contiguous array.

    Large arrays are copied in 16 MiB pieces: measured here, one huge copy out of a
    file mapping into fresh pages runs at a third of the speed (2.3 vs 6.7 GB/s),
    and so does ``preadv`` into fresh pages (see bench/bench_container.py)."""
    if arr.nbytes <= _COPY_CHUNK:
        return arr.copy()
    out = np.empty_like(arr)
    src, dst = arr.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8)
    for start in range(0, src.size, _COPY_CHUNK):
        dst[start : start + _COPY_CHUNK] = src[start : start + _COPY_CHUNK]
    return out


def to_native(arr: np.ndarray) -> np.ndarray:
    """An owned, native-byte-order copy of an array of any shape (C byte swap when
    needed).  The swap kernel takes flat bytes: an object's data reaches here in its
    shape (a v0.1 big-endian matrix read as a torch tensor)."""
    if arr.dtype.isnative or arr.dtype.itemsize == 1:
        return copy_array(arr)
    native = arr.dtype.newbyteorder("=")
    out = np.empty(arr.shape, native)
    width = native.itemsize // 2 if native.kind == "c" else native.itemsize
    kernels.bswap(arr.reshape(-1).view(np.uint8), out.reshape(-1).view(np.uint8), width)
    return out


# ------------------------------------------------------------------ writing
def little_endian_chunks(arr: np.ndarray):
    """The bytes of a C-contiguous array as stored on disk (little-endian), as a
    zero-copy view when its bytes already are, else in swapped chunks of bounded
    size (big-endian input, or any multi-byte array on a big-endian host)."""
    flat = arr.reshape(-1).view(np.uint8)
    width = dtypes.swap_width(arr.dtype)
    if width == 0:
        return (flat,)
    return _swapped_chunks(flat, width)


def _swapped_chunks(flat, width):
    step = _CHUNK - _CHUNK % width
    buf = np.empty(min(step, flat.size), np.uint8)
    for start in range(0, flat.size, step):
        part = flat[start : start + step]
        out = buf[: part.size]
        kernels.bswap(part, out, width)
        yield out


class ComponentSink:
    """One component's blob, written as its bytes arrive (little-endian chunks, in
    order): at the next 64-byte boundary, compressed and digested on the way.
    :meth:`finish` returns its ComponentSpec."""

    def __init__(self, blobs, role, *, storage, ltype, compress, checksum):
        blobs.pad(64)
        self.blobs, self.role, self.storage, self.ltype = blobs, role, storage, ltype
        self.offset = blobs.pos
        self.hasher = digests.Hasher(checksum) if checksum else None
        # zstd as independent frames with a seek table (ztensor/io/seekable.py)
        self.compressor = seekable.FrameWriter(compress) if compress else None
        self.raw_length = 0

    def write(self, chunk) -> None:
        self.raw_length += len(chunk)
        if self.compressor is None:
            _emit(self.blobs, self.hasher, chunk)
            return
        for frame in self.compressor.write(chunk):
            _emit(self.blobs, self.hasher, frame)

    def finish(self):

        if self.compressor is not None:
            for frame in self.compressor.finish():
                _emit(self.blobs, self.hasher, frame)
        compressed = self.compressor is not None
        return ComponentSpec(
            self.role,
            self.storage,
            self.ltype,
            self.offset,
            self.blobs.pos - self.offset,
            "zstd" if compressed else "raw",
            self.raw_length if compressed else None,
            self.hasher.digest() if self.hasher else None,
        )


def write_component(blobs, role, chunks, *, storage, ltype, compress, checksum):
    """Append one component's blob (at the next 64-byte boundary) and return its
    ComponentSpec.  ``chunks`` yields the little-endian bytes."""
    sink = ComponentSink(
        blobs, role, storage=storage, ltype=ltype, compress=compress, checksum=checksum
    )
    for chunk in chunks:
        sink.write(chunk)
    return sink.finish()


def _emit(blobs, hasher, data):
    if len(data):
        if hasher is not None:
            hasher.update(data)
        blobs.write(data)
