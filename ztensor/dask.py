"""Dask arrays over zTensor tensors: ``ztensor.dask.from_zt(path_or_url, name)``.

For tensors larger than one machine, or work spread over a cluster: the array is
chunked along its first axis and each chunk is read where it is computed, as the
rows it covers (``safe_open(...).get_slice(name)[r0:r1]``): a view of the mapping on
a local file, one range request on a URL.  Nothing is read until dask computes; the
graph holds only the path, the object's name and the row ranges, so it pickles to
worker processes.  Needs ``pip install dask`` (and ``distributed`` for a cluster).

``source`` may also be a sharded checkpoint (a directory, or its
``*.zt.index.json`` / ``*.safetensors.index.json``): the array reads the shard that
holds ``name`` (ztensor/sharded.py).

Three rules keep a graph honest about the file it reads:

* Its size is bounded: the chunks are planned from the object's bytes (rows of
  no bytes make one chunk, however many), and a plan of more than ``max_chunks``
  chunks is refused with a LimitError before the graph is built (:func:`_plan`).
* Its work follows the bytes: a tensor is chunked as its format reads it
  (:func:`_row_block`), so no two chunks decode the same bytes: an HDF5 dataset in
  whole chunks of its own (each dask chunk reads only its rows' HDF5 chunks); a
  deflated ``.npz`` member or a zTensor zstd stream without a seek table, which
  cannot be read from its middle, read whole once per compute and split into the
  chunks ``rows`` or ``chunk_bytes`` ask for.
* A worker's open handle never outlives the file it was opened on: handles are
  cached per file *identity* (device, inode, size, modification and change time
  for a local file; the server's size, ETag or modification time for a URL), looked
  up again for every chunk, so a file rewritten in place or replaced (``ztensor``'s
  edits, an atomic rename) is reopened (:class:`_Handles`).  A chunk that finds
  another identity than the array was made with (of a URL whose server names no
  version: another size), or an object of another shape or dtype, is a ClosedError
  naming the file and the object: make a new array.

:func:`from_zt_all` builds its arrays from one open of the file, or of the
checkpoint's index and of each shard (:func:`_arrays_of`), with the checks
:func:`from_zt` makes for one: a checkpoint of thousands of tensors opened its
index and a shard once per tensor (over HTTP, 400 tensors took 5,242 requests).
"""

from __future__ import annotations

import atexit
import collections
import hmac
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any, Dict, Optional

import numpy as np

from ztensor.container.reader import Reader
from ztensor.errors import (
    ClosedError,
    LimitError,
    UnsupportedError,
    ZTensorError,
    url_without_secrets,
)
from ztensor.io import components, seekable, values
from ztensor.io.source import file_version, is_url
from ztensor.io.upload import check_storage_options
from ztensor.safe import safe_open
from ztensor.sharded import is_checkpoint, open_sharded

_DEFAULT_CHUNK_BYTES = 64 << 20
# dask's own guidance keeps graphs well below a million tasks; each chunk is one
DEFAULT_MAX_CHUNKS = 100_000

if TYPE_CHECKING:  # from_zt's return type; at run time dask is imported on first use
    import dask.array


def from_zt(
    source: Any,
    name: str,
    *,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    rows: Optional[int] = None,
    max_chunks: int = DEFAULT_MAX_CHUNKS,
    storage_options: Optional[Dict[str, Any]] = None,
) -> dask.array.Array:
    """A lazily read ``dask.array.Array`` over dense object ``name`` of ``source``
    (a path, an fsspec URL, or a sharded checkpoint's directory or index).  Chunks
    span ``rows`` rows of the first axis (default: about ``chunk_bytes`` each) and
    the whole of the other axes; rounded up to the rows another format decodes
    together (an HDF5 chunk; all of a deflated ``.npz`` member: module doc).
    ``storage_options``: fsspec's options for a URL's filesystem (credentials,
    endpoint); they travel in the graph to the workers, shown by no repr of it and
    in no key name (:class:`_Target`; its pickled form holds them: docs/remote.md).

    The array reads the file as it was when the array was made: a chunk computed
    after the file changed raises ClosedError (make a new array).  Over a URL the
    version is the one the server names (ETag, Last-Modified); a server naming none
    is refused unless ``storage_options`` opt in (docs/remote.md), and then only a
    change of size is seen.

    Raises LimitError when that makes more than ``max_chunks`` chunks (pass larger
    ``rows`` or ``chunk_bytes``), UnsupportedError for an object that is not dense
    or cannot be decoded, ValueError for ``rows``/``chunk_bytes`` below 1."""
    _check_chunking(rows, chunk_bytes, max_chunks)
    source = _path_of(source)
    options = check_storage_options(source, storage_options)
    source = _shard_of(source, name, options)
    # the version every chunk must find (_read): a rewrite between two chunks of one
    # compute would otherwise mix the two files' values in one array
    version = file_version(source, options)[0]
    with safe_open(source, framework="np", storage_options=options) as f:
        f.get_slice(name)  # UnsupportedError unless dense
        plan = _FileArrays(source, options, version, chunk_bytes, rows, max_chunks)
        return plan.array(f.reader, name)


def from_zt_all(
    source: Any,
    *,
    chunk_bytes: int = _DEFAULT_CHUNK_BYTES,
    rows: Optional[int] = None,
    max_chunks: int = DEFAULT_MAX_CHUNKS,
    storage_options: Optional[Dict[str, Any]] = None,
) -> Dict[str, dask.array.Array]:
    """name -> dask array for every dense object of ``source`` (a file, or a
    sharded checkpoint's directory or index), in its order; keywords and errors as
    :func:`from_zt`'s.  The file, or the index and each shard, is opened once for
    all of them (:func:`_arrays_of`)."""
    _check_chunking(rows, chunk_bytes, max_chunks)
    source = _path_of(source)
    options = check_storage_options(source, storage_options)
    settings = (chunk_bytes, rows, max_chunks)
    if not _is_sharded(source):
        return _arrays_of(
            source, options, settings, lambda: Reader(source, storage_options=options)
        )
    arrays: Dict[str, dask.array.Array] = {}
    with open_sharded(source, storage_options=options) as s:
        for file in s.files():
            # the checked open every read of a shard makes (ShardedReader.open_shard:
            # it holds exactly the tensors the index places there), once per shard
            arrays.update(
                _arrays_of(s.shard_path(file), options, settings, lambda f=file: s.open_shard(f))
            )
        return {n: arrays[n] for n in s.keys() if n in arrays}


def _arrays_of(path, options, settings, open_reader) -> Dict[str, Any]:
    """name -> array for every dense object of the one file ``path``, opened once
    (by ``open_reader``) after its identity is taken, as :func:`from_zt` takes it."""
    try:
        version = file_version(path, options)[0]
    except OSError as exc:
        if isinstance(exc, ZTensorError) or is_url(path):  # said already: no second try
            raise
        # a local file: said as the reader's own open says it (a shard its index
        # names that is missing or a symlink loop: the FormatError naming the
        # index); re-raised should that open find the file after all
        with open_reader():
            pass
        raise
    with open_reader() as reader:
        plan = _FileArrays(path, options, version, *settings)
        return {
            n: plan.array(reader, n) for n in reader.keys() if reader.metadata(n).format == "dense"
        }


def _check_chunking(rows, chunk_bytes, max_chunks) -> None:
    """Each a whole number of at least 1 (numpy's integers too), else a ValueError
    naming it: ``max_chunks=nan`` compared False with every count and
    switched the chunk guard off, and ``None`` failed deep in the plan."""
    for keyword, value in (
        ("rows", rows),
        ("chunk_bytes", chunk_bytes),
        ("max_chunks", max_chunks),
    ):
        if value is None and keyword == "rows":
            continue
        if not _is_count(value) or value < 1:
            raise ValueError(f"{keyword} must be a whole number of at least 1, got {value!r:.40}")


class _FileArrays:
    """The arrays of one file: its path, storage options and identity when opened
    (the version each chunk must find, :func:`_read`), and the chunking asked for."""

    def __init__(self, path, options, version, chunk_bytes, rows, max_chunks) -> None:
        # the file and its credentials travel in the graph as one object that shows
        # neither (_Target): printed, tokenized into key names or drawn, a graph holds
        # no URL secret or storage option
        self.target = _Target(path, options)
        self.version = version
        self.chunk_bytes, self.rows, self.max_chunks = chunk_bytes, rows, max_chunks

    def array(self, reader, name) -> dask.array.Array:
        """The array of dense object ``name`` of ``reader`` (this plan's file),
        refused now for what every chunk would refuse."""
        import dask.array as da

        meta = reader.metadata(name)
        shape = tuple(meta.shape)
        dtype = _dtype_of(meta)
        _require_readable(reader, meta)
        block = _row_block(reader, name)
        if not shape:
            return da.from_delayed(
                _delayed_scalar(self.target, name, dtype, self.version), shape=(), dtype=dtype
            )
        chunks = _plan(
            shape,
            dtype,
            self.chunk_bytes,
            self.rows,
            self.max_chunks,
            block,
            path=self.target.source,
            obj=name,
        )
        # (map_blocks keeps name= for the graph key: the tensor's name travels as tensor=)
        array = da.map_blocks(
            _read_rows,
            dtype=dtype,
            chunks=chunks,
            target=self.target,
            tensor=name,
            meta=np.empty((0,) * len(shape), dtype),
            version=self.version,
            whole=block is None,
        )
        if block is None:
            # read whole once, then split into the chunks the caller asked for (rows=
            # or chunk_bytes: they were silently one chunk), each from that one read
            asked = _plan(
                shape,
                dtype,
                self.chunk_bytes,
                self.rows,
                self.max_chunks,
                1,
                path=self.target.source,
                obj=name,
            )
            if asked != chunks:
                array = array.rechunk(asked)
        return array


def _is_count(value) -> bool:
    # True is not 1 row; numpy's integers are counts, as Limits takes them
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _path_of(source: Any) -> str:
    """``source`` as the text of a path or URL.  The graph carries it to workers,
    which open it there: bytes in memory would travel in every task (and a bytes
    path was read as the file's contents), so both are refused here."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, str):
            return path
    raise TypeError(
        "from_zt reads a path or URL (str or os.PathLike of str), "
        f"not {type(source).__name__}: open bytes with ztensor.Reader"
    )


def _plan(shape, dtype, chunk_bytes, rows, max_chunks, block=1, **where):
    """The chunks along the first axis (the other axes whole), planned from the
    object's bytes: rows of ``row_bytes`` each, about ``chunk_bytes`` a chunk.  Rows
    holding no bytes (a zero-sized axis after the first) are one chunk however
    many there are: the count a file declares costs nothing to read, and must not
    cost a graph entry each.  A chunk is a whole number of ``block`` rows (the rows
    the format decodes together, :func:`_row_block`; None: all of them), so no two
    chunks decode the same bytes.  More than ``max_chunks`` chunks is a LimitError."""
    total = shape[0]
    row_bytes = int(np.prod(shape[1:], dtype=object)) * dtype.itemsize
    if rows is not None:
        step = rows
    elif row_bytes == 0:
        step = max(total, 1)
    else:
        step = max(1, chunk_bytes // row_bytes)
    if block is None:
        step = max(total, 1)
    else:
        step = -(-step // block) * block
    count = -(-total // step)
    if count > max_chunks:
        raise LimitError(
            f"{total} rows of {row_bytes} bytes in chunks of {step} rows make "
            f"{count} chunks, more than max_chunks={max_chunks} (pass larger "
            "rows or chunk_bytes)",
            **where,
        )
    first = tuple(min(step, total - s) for s in range(0, total, step)) or (0,)
    return (first,) + tuple((d,) for d in shape[1:])


def _dtype_of(meta) -> np.dtype:
    comp = meta.components["data"]
    empty = np.empty(0, components.storage_dtype(comp))
    return values.as_values(empty, comp.dtype, comp.type).dtype


def _row_block(reader, name) -> Optional[int]:
    """The rows of ``name`` that its file's format decodes together, from its entry
    (ztensor/foreign/base.py ``Entry``): an HDF5 chunk's first extent; None where
    every read decodes the whole tensor (a deflated ``.npz`` member, a zTensor zstd
    stream without a seek table); 1 for other zTensor objects and another format's
    views."""
    foreign = reader.internals.foreign
    entry = None if foreign is None else foreign.entries.get(name)
    if entry is None:
        comp = reader.metadata(name).components["data"]
        if (
            comp.encoding == "zstd"
            and (comp.uncompressed_length or 0) > seekable.FRAME_BYTES
            and reader.internals.source is not None
        ):
            # one stream without frames to seek to (v1.1 files, other writers): each
            # chunk of rows would decode all of it, and a worker keeps one tensor
            # decoded, so two such arrays computed together decoded one per chunk.
            # Asked only past one frame's size (a request each over a URL): a
            # smaller stream costs a chunk at most one frame's decoding
            # (and the writer makes a table only for larger ones)
            table = seekable.read_seek_table(
                reader.internals.source, comp, path=reader.path, obj=name, component="data"
            )
            if table is None:
                return None
        return 1
    if entry.read_rows is not None:
        return entry.row_block
    return None if entry.whole else 1


def _require_readable(reader, meta):
    """Refuse at graph time what every chunk would refuse: an object whose data this
    reader must not decode (components.require_readable) or whose encoding it does
    not know."""
    if reader.internals.foreign is not None:  # other formats: read by their own rules
        return
    comp = meta.components["data"]
    where = {"path": reader.path, "obj": meta.name, "component": "data"}
    components.require_readable(comp, **where)
    if comp.encoding not in ("raw", "zstd"):
        raise UnsupportedError(
            f"encoding {comp.encoding!r} is not one this reader decodes", **where
        )


# ------------------------------------------------------------------ sharded checkpoints
def _is_sharded(source: str) -> bool:
    return is_checkpoint(source)


def _shard_of(source: str, name: str, storage_options=None) -> str:
    """The file that holds ``name``: ``source`` itself, or for a sharded checkpoint
    the shard its index names (checked to hold it)."""
    if not _is_sharded(source):
        return source
    with open_sharded(source, storage_options=storage_options) as s:
        s.metadata(name)  # ObjectNotFoundError, or the index names a shard without it
        return s.shard_path(s.file_of(name))


# ------------------------------------------------------------------ the graph's file
# the key of _Target's tokens: a process's own, so a key name computed from a
# secret (a URL's signature, a storage option) cannot be tested against guesses
# elsewhere
_TOKEN_KEY = secrets.token_bytes(32)


class _Target:
    """The file a graph reads, and the ``storage_options`` that open it, as they
    travel in the graph: pickled whole to the workers (which need both), shown by
    nobody.  Its ``repr`` (in a task's repr, ``dask.visualize``, a dashboard) names
    the URL without its secrets and no option; its dask token, from which
    ``map_blocks`` names every key, is a keyed hash that changes with the options
    (another endpoint's file is another array) but tells nothing of them outside the
    process that made it.  The pickled graph (what distributed sends its scheduler
    and workers) still holds the credentials: docs/remote.md says what that means."""

    __slots__ = ("source", "storage_options")

    def __init__(self, source: str, storage_options=None) -> None:
        self.source = source
        self.storage_options = storage_options

    def __reduce__(self):
        return (_Target, (self.source, self.storage_options))

    def __repr__(self) -> str:
        hidden = "" if not self.storage_options else ", storage_options=***"
        return f"<ztensor.dask file {url_without_secrets(self.source)!r}{hidden}>"

    def __dask_tokenize__(self):
        text = repr((self.source, sorted((self.storage_options or {}).items(), key=repr)))
        return hmac.new(_TOKEN_KEY, text.encode("utf-8", "surrogatepass"), "sha256").hexdigest()


# ------------------------------------------------------------------ workers' handles
def _version_now(source: str, options):
    """file_version of ``source`` for a chunk being computed: a local file removed
    since its array was made is a ClosedError naming it, as a chunk of a file
    changed since is (os.stat's bare FileNotFoundError named no array)."""
    try:
        return file_version(source, options)
    except FileNotFoundError as exc:
        if isinstance(exc, ZTensorError):  # a URL's 404, said as a read says it
            raise
        raise ClosedError(
            "the file is gone since the array was made from it", path=source
        ) from None


class _Handles:
    """Open ``safe_open`` handles of one worker process, keyed by (source, file
    identity), at most ``limit`` of them; a handle of a file with no version
    (:func:`ztensor.io.source.file_version`) is its chunk's own, its key marked so.
    Every chunk looks its file up again: a handle opened on an earlier version of the file is never
    used once the file has changed, and is closed when the last chunk using it is done."""

    def __init__(self, limit: int = 16) -> None:
        self._lock = threading.Lock()
        self._limit = limit
        self._open: "collections.OrderedDict[Any, list]" = collections.OrderedDict()

    def acquire(self, source: str, storage_options=None):
        """(key, handle) for the file at ``source`` as it is now (opened with
        ``storage_options``); give the key back with :meth:`release`."""
        options = storage_options or None
        # a handle opened with other options (credentials) is not this caller's
        where = source if not options else (source, repr(sorted(options.items())))
        for _ in range(8):
            before, versioned = _version_now(source, options)
            key: Any = (where, before)
            if versioned:
                with self._lock:
                    entry = self._open.get(key)
                    if entry is not None:
                        entry[1] += 1
                        self._open.move_to_end(key)
                        return key, entry[0]
            handle = safe_open(source, framework="np", storage_options=options)
            if _version_now(source, options)[0] != before:  # changed while it was opened: again
                handle.close()
                continue
            if not versioned:  # nothing shows it unchanged later: this chunk's own handle
                key = (where, before, object())
                with self._lock:
                    self._open[key] = [handle, 1, True]  # closed on release
                return key, handle
            with self._lock:
                entry = self._open.get(key)
                if entry is None:
                    entry = self._open[key] = [handle, 0, False]
                else:  # another thread opened it meanwhile: use that one
                    handle.close()
                entry[1] += 1
                self._open.move_to_end(key)
                self._retire(where, key)
                return key, entry[0]
        raise ClosedError("the file kept changing while it was opened", path=source)

    def release(self, key) -> None:
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[2] and entry[1] == 0:
                del self._open[key]
                entry[0].close()

    def _retire(self, source, keep):
        """Under the lock: handles of earlier versions of ``source``, and the least
        recently used beyond the limit, go (now if unused, else after their last
        chunk)."""
        stale = [k for k in self._open if k[0] == source and k != keep]
        extra = len(self._open) - len(stale) - self._limit
        stale += [k for k in self._open if k != keep and k not in stale][: max(extra, 0)]
        for k in stale:
            entry = self._open[k]
            entry[2] = True
            if entry[1] == 0:
                del self._open[k]
                entry[0].close()

    def clear(self) -> None:
        with self._lock:
            for key in [k for k, e in self._open.items() if e[1] == 0]:
                self._open.pop(key)[0].close()
            for entry in self._open.values():
                entry[2] = True


_HANDLES = _Handles()
# the cache is the worker's, on purpose: closed at exit, not reported as a leak
atexit.register(_HANDLES.clear)


def _read(source, tensor, shape, dtype, select, storage_options, version):
    key, handle = _HANDLES.acquire(source, storage_options)
    try:
        if key[1] != version:  # keyed by (source, its identity, ...)
            raise ClosedError(
                "the file changed since this dask array was made (a chunk of the earlier "
                "file and one of this would be mixed): make a new array",
                path=source,
                obj=tensor,
            )
        piece = handle.get_slice(tensor)
        now = handle.reader.metadata(tensor)
        if tuple(piece.get_shape()) != tuple(shape) or _dtype_of(now) != dtype:
            raise ClosedError(
                f"the object is now {_dtype_of(now)}{list(piece.get_shape())}; "
                f"this dask array was made for {dtype}{list(shape)} (the file "
                "changed since: make a new array)",
                path=source,
                obj=tensor,
            )
        return select(handle, piece)
    finally:
        _HANDLES.release(key)


def _read_rows(block_info=None, *, target, tensor, version, whole=False):
    info = block_info[None]
    r0, r1 = info["array-location"][0]

    def select(handle, piece):
        if whole:
            return _entire(handle, tensor)
        return piece[r0:r1]

    return _read(
        target.source,
        tensor,
        info["shape"],
        np.dtype(info["dtype"]),
        select,
        target.storage_options,
        version,
    )


def _entire(handle, tensor):
    """The one chunk of a tensor read whole (:func:`_row_block`), as ``get_tensor``
    makes it: through a slice it would stay in the worker's cached handle after
    the compute (safe_open keeps what it decodes whole, for the next slice).  A
    read-only one (a deflated member's decoded bytes) is copied: chunks are
    writable, as every other format's are (map_blocks functions that write in place
    failed with numpy's read-only error)."""
    arr = handle.get_tensor(tensor)
    return arr if arr.flags.writeable else arr.copy()


def _delayed_scalar(target, name, dtype, version):
    import dask

    return dask.delayed(_read_target)(target, name, dtype, version)


def _read_target(target, name, dtype, version):
    return _read(target.source, name, (), dtype, _whole, target.storage_options, version)


def _whole(handle, piece):
    return piece[()]


__all__ = ["from_zt", "from_zt_all", "DEFAULT_MAX_CHUNKS"]
