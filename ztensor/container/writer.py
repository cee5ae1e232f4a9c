"""Writer: arrays -> components -> aligned blobs -> manifest -> footer.

Blobs are streamed to a temporary file beside the target as they are given
(memory stays bounded by the largest tensor, usually far less); :meth:`Writer.close`
appends the manifest and footer and renames the file into place, so the final
name only ever holds a complete file.
"""

from __future__ import annotations

import builtins
import functools
import math
import os
import threading
import warnings
from typing import Any, Callable, Dict, Literal, Optional, TypeVar, Union, cast

import numpy as np

from ztensor import attributes as attrs
from ztensor import dtypes, formats, kernels, spec
from ztensor.arguments import caller_dtype, caller_shape, keyword_aliases
from ztensor.container import v2
from ztensor.container.footer import encode_footer
from ztensor.container.manifest import Checker, encode_manifest, gc_paused
from ztensor.container.manifest_checks import check_file_totals
from ztensor.container.reader import Reader
from ztensor.container.stream import TensorStream
from ztensor.errors import (
    ClosedError,
    FormatError,
    LimitError,
    UnsupportedError,
    WriteError,
    refuse_copy,
    without_secrets,
)
from ztensor.frameworks.torch_bridge import to_numpy_for_writing
from ztensor.io import atomic, components
from ztensor.io import floats as floatconv
from ztensor.io import upload as remote_write
from ztensor.io import values as logical
from ztensor.objects import ComponentSpec, ObjectSpec
from ztensor.tensor import Tensor, refuse_masked


def require_writable_version(reader):
    """Edits write v1.2: a v2 file (PyPI ztensor 2.x) would silently change container
    version, so it is refused; ``ztensor convert`` makes a v1.2 copy on purpose."""
    if reader.version == v2.VERSION:
        raise UnsupportedError(
            "a zTensor v2 file is read-only here (this package writes "
            "v1.2): `ztensor convert` it to a v1.2 file to edit that",
            path=reader.path,
        )


def _plain_storage():
    """numpy dtype -> storage for arrays written as they are: a spec primitive with no
    logical type, whose bytes are already little-endian on this host.  Not bool: its
    bytes are made 0 or 1 first (Writer._prepare)."""
    out = {}
    for code in ("f8", "f4", "f2", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1"):
        for order in "<>=|":
            dtype = np.dtype(code).newbyteorder(order) if order != "|" else np.dtype(code)
            found = dtypes.spec_types_for(dtype)
            if found is not None and found[1] is None and dtypes.swap_width(dtype) == 0:
                out[dtype] = found[0]
    return out


_PLAIN_STORAGE = _plain_storage()


_Method = TypeVar("_Method", bound=Callable[..., Any])


def _one_at_a_time(method: _Method) -> _Method:
    """Run a Writer method holding the writer's lock.  The C BlobWriter releases
    the GIL while it writes and keeps its buffer and position unguarded: two threads
    writing through one Writer (or one aborting while another wrote) corrupted the
    process's memory (a segmentation fault), or gave one object the offset of
    another's bytes.  Every call that writes, and abort, goes through here (_guard
    too), so they run one at a time.  A TensorStream's chunk writes and close hold
    the same lock (stream.py), so its overrun check sees every chunk before it."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(_Method, run)


class Writer:
    """Write a zTensor v1.2 file.

    Parameters
    ----------
    path : str or os.PathLike
        Final file name.  It is written only when :meth:`close` succeeds; until
        then the data goes to a hidden temporary file in the same folder.
    attributes : dict, optional
        File-level metadata (CBOR-encodable values, string keys).
    fsync : bool
        Flush the file to stable storage before renaming it into place (slower;
        protects against power loss, not only against crashes of this process).
    storage_options : dict, optional
        For an fsspec URL (``s3://``, ``gs://``, ``memory://``...): fsspec's options
        for its filesystem (credentials, endpoint).  The file is built in a local
        temporary file and uploaded when :meth:`close` succeeds, so the object
        appears complete or not at all (ztensor/io/upload.py).  With a local
        path they are a ValueError.

    Examples
    --------
    >>> with ztensor.Writer("model.zt", attributes={"framework": "numpy"}) as w:
    ...     w.write_numpy("embed.weight", np.zeros((4, 8), np.float32))
    ...     w.write_numpy("head.bias", np.ones(8, np.float16), compress=True)

    Objects' bytes go into the file in call order (the manifest lists them by
    name either way): the streaming Writer keeps the order it is given.  The
    functions that take a whole mapping (``ztensor.numpy.save_file``,
    ``ztensor.torch.save_file``, ``serialize``, ``save_sharded``, ``convert``) write
    in the one canonical order instead, by name (``_save.canonical_order``,
    docs/format-decisions.md), so their bytes do not depend on the dict's order.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        *,
        attributes: Optional[Dict[str, Any]] = None,
        fsync: bool = False,
        storage_options: Optional[Dict[str, Any]] = None,
        _replaces: Any = None,
    ) -> None:
        self._lock = threading.RLock()  # _one_at_a_time
        self._pid = os.getpid()  # a forked child's copy is not its writer (__del__)
        self.path = os.fspath(path)
        # a URL: built locally, uploaded at close (None for a local path)
        self._upload = remote_write.Upload.for_path(self.path, storage_options)
        self._attributes = _check_attributes(attributes, self.path)
        # the reader's own checks, run on every object before its bytes are written
        self._checker = Checker(
            self.path, spec.VERSIONS["1.2"], 1 << 64, spec.DEFAULT_LIMITS, decoded_text=False
        )
        self._fsync = fsync
        # name -> ObjectSpec, or (shape, storage, offset, length) for a plain raw array
        self._objects: Dict[str, Any] = {}
        self._target = atomic.final_target(self.path)
        # for an edit (rewrite): the version of the file it is built from, taken by
        # the caller before it opened that file (an object store holds no version)
        self._replaces: Any = _replaces if self._upload is None else None
        self._temp = (
            atomic.create_temp(self._target, label=self.path)
            if self._upload is None
            else atomic.Temp(*self._upload.create_temp())
        )
        self._state = "open"
        try:
            self._blobs = kernels.BlobWriter(self._temp.fd, 0, path=self.path)
        except BaseException as exc:
            atomic.note_leftover(exc, self._temp.discard())
            raise
        self._guard(self._blobs.write, spec.MAGIC_V1)

    # ------------------------------------------------------------ objects
    # data=: the reference's keyword for the array, beside ours (every write method)
    @keyword_aliases(data="array")
    @_one_at_a_time
    def write_numpy(
        self,
        name: str,
        array: Any,
        *,
        compress: Union[bool, int, None] = False,
        checksum: Optional[str] = None,
        attributes: Optional[Dict[str, Any]] = None,
        type: Optional[str] = None,
        saturate: bool = False,
    ) -> None:
        """Write a dense object.

        Parameters
        ----------
        name : str
            Unique, non-empty object name.
        array : numpy.ndarray
            Any layout and byte order; 0-d and empty arrays too.  bool, ints, floats,
            complex, and ml_dtypes bfloat16/float8 arrays (stored as ``u16``/``u8`` with
            their logical type).
        compress : bool or int
            False (or None): raw.  True: zstd level 3.  An int: that zstd level.
        checksum : None, "crc32c" or "sha256"  ("none" is accepted as None)
            Digest of the stored bytes, recorded in the manifest.
        attributes : dict, optional
            Per-object metadata.
        type : str, optional
            Store float values as ``"bf16"`` or an FP8 type (``"f8_e4m3fn"``,
            ``"f8_e5m2"``, ``"f8_e4m3fnuz"``, ``"f8_e5m2fnuz"``), encoded by the C
            kernels with round-to-nearest-even (ml_dtypes' rules; ml_dtypes not needed).
            ``type=`` always encodes values: uint8/uint16 arrays are refused as
            ambiguous (they may be encoded bits already; store bits with
            ``write(name, Tensor({"data": codes}, types={"data": type}))``).
        saturate : bool
            FP8 only.  False (the default, ml_dtypes' rule): values beyond the type's
            range become NaN (or infinity for ``f8_e5m2``).  True: they, and
            infinities, become the largest finite value with their sign (torch's rule
            for ``float8_e4m3fn``); NaN stays NaN.

        Raises
        ------
        FormatError
            Bad name (empty, not a string, already written) or attributes.
        UnsupportedError
            A numpy dtype zTensor cannot store (strings, objects, datetimes, records).
        WriteError
            The file could not be written; the writer is then abandoned.
        """
        refuse_masked(array, name)
        if (
            (compress is None or compress is False)
            and checksum is None
            and not attributes
            and type is None
            and self._write_plain(name, array)
        ):
            return
        arr, types = _encode_as(array_of(array, self.path, name), type, saturate, self.path, name)
        self._write_object(
            name, "dense", arr.shape, {"data": arr}, types, attributes, compress, checksum
        )

    def _write_plain(self, name, array) -> bool:
        """The common case (a C-contiguous numpy array of a plain dtype whose bytes are
        already little-endian, stored raw) in few steps; False leaves it to the
        general path.  manifest.Checker is not run: for such an array every rule it
        checks holds by construction (data holds shape x itemsize bytes, the rank is
        numpy's, at most 64, the offset is aligned and in bounds), and a test holds
        this path to the general one's bytes."""
        if builtins.type(array) is not np.ndarray or not array.flags.c_contiguous:
            return False
        storage = _PLAIN_STORAGE.get(array.dtype)
        if storage is None:
            return False
        self._require_open()
        name = self._check_name(name)
        blobs = self._blobs
        try:
            blobs.pad(spec.ALIGNMENT)
            offset = blobs.pos
            blobs.write(array.reshape(-1).view(np.uint8))
        except BaseException as exc:
            self._abandon(exc)
            raise
        # a plain entry, not an ObjectSpec: manifest.encode_manifest takes both
        self._objects[name] = (array.shape, storage, offset, array.nbytes)
        return True

    def __enter__(self) -> "Writer":
        return self

    @keyword_aliases(data="array")
    def add(
        self,
        name: str,
        array: Any,
        compress: Union[bool, int, None] = None,
        checksum: Optional[str] = None,
    ) -> None:
        """The reference implementation's name for :meth:`write_numpy`."""
        self.write_numpy(name, array, compress=compress, checksum=checksum)

    @keyword_aliases(data="tensor")
    @_one_at_a_time
    def write_torch(
        self,
        name: str,
        tensor: Any,
        *,
        compress: Union[bool, int, None] = None,
        checksum: Optional[str] = None,
        attributes: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Write a dense object from a ``torch.Tensor`` (any device, any layout; bf16,
        the float8 types and complex keep their torch dtype on the way back)."""
        arr, type_name = to_numpy_for_writing(tensor, name, self.path)
        arr, types = (arr, {"data": type_name}) if type_name else (arr, {})
        self._write_object(
            name, "dense", arr.shape, {"data": arr}, types, attributes, compress, checksum
        )

    @_one_at_a_time
    def stream(
        self,
        name: str,
        shape: Any,
        dtype: Any,
        *,
        compress: Union[bool, int] = False,
        checksum: Optional[str] = None,
        attributes: Optional[Dict[str, Any]] = None,
        type: Optional[str] = None,
    ) -> "TensorStream":
        """Write a dense object chunk by chunk: returns a :class:`ztensor.TensorStream`
        taking the elements in C order (numpy arrays of ``dtype``, torch tensors or
        little-endian bytes) until it holds ``shape`` x ``dtype`` bytes.  Chunks are
        compressed and digested as they arrive, so memory stays at one chunk.  Until
        the stream is closed the writer takes nothing else.  ``type`` is the logical
        type of raw elements, as in ``Tensor(types={"data": ...})``: ``"bf16"`` for
        uint16 bit patterns, an FP8 type for uint8 codes.

        >>> with w.stream("big", (1_000_000, 4096), np.float16) as s:
        ...     for block in blocks():
        ...         s.write(block)
        """

        self._require_open()
        name = self._check_name(name)
        level = _zstd_level(compress, self.path)
        checksum = None if checksum == "none" else checksum
        if checksum not in (None, "crc32c", "sha256"):
            raise ValueError(f"checksum must be None, 'crc32c' or 'sha256', got {checksum!r}")
        attributes = _check_attributes(attributes, self.path, name)
        shape = self._shape_of(name, shape)  # 0.9 is no dimension (int() made it 0)
        dtype = caller_dtype(dtype)  # "u8" means one thing everywhere
        storage, ltype = self._storage_of(name, "data", dtype, type)
        self._check_as_reader(
            name,
            "dense",
            shape,
            attributes,
            [("data", _Nbytes(math.prod(shape) * dtype.itemsize), storage, ltype)],
            ("data",) if level else (),
        )
        sink = self._guard(
            components.ComponentSink,
            self._blobs,
            "data",
            storage=storage,
            ltype=ltype,
            compress=level,
            checksum=checksum,
        )
        if logical.is_bool(storage, ltype):  # each chunk's bytes made 0 or 1 (_prepare)
            sink = _BoolSink(sink)
        self._state = "streaming"

        def finish(comp):
            self._state = "open"
            self._objects[name] = ObjectSpec(name, shape, "dense", attributes, {"data": comp})

        return TensorStream(
            self,
            name,
            shape,
            dtype,
            sink,
            finish,
            stored=(storage, ltype),
            guard=self._guard,
            abandon=self._abandon,
            lock=self._lock,
        )

    @_one_at_a_time
    def copy_from(self, reader: Any, name: str, *, as_name: Optional[str] = None) -> None:
        """Copy object ``name`` of an open :class:`ztensor.Reader` (of a zTensor file)
        into this file as it is stored: components byte for byte, with their
        encodings and digests, nothing decoded.  Used by :meth:`append` and the
        editing functions; version 0.1, 1.1 and 2 objects are re-encoded instead
        (their bytes may not be what v1.2 stores), each component keeping its
        encoding (zstd or raw) and a digest (its own algorithm, or crc32c where this
        writer has not that one): an edit of another object never drops a check.  A
        re-encoded object's old digests are checked first (ChecksumError): a new one
        is never computed over bytes the old one refused."""
        if not isinstance(reader, Reader):  # a path read as a Reader's attribute failed bare
            raise TypeError(
                f"copy_from takes an open ztensor.Reader, not {builtins.type(reader).__name__}"
                + (
                    ": open it with ztensor.Reader(path)"
                    if isinstance(reader, (str, os.PathLike))
                    else ""
                )
            )
        self._require_open()
        target = self._check_name(name if as_name is None else as_name)
        meta = reader.metadata(name)
        if (
            spec.parse_version(reader.version) != (1, 2)
            or meta.legacy is not None
            or any(c.byteorder != "<" or not c.aligned for c in meta.components.values())
        ):
            # the new digests are computed over what is read: the old ones must
            # vouch for it first, or an edit would make corrupt bytes check out
            reader.check_digests(name)
            obj = reader.read(name)
            kept = {role: _kept_encoding(c) for role, c in meta.components.items()}
            if len(kept) == 1:  # a legacy sparse object's one blob holds every component
                only = next(iter(kept.values()))
                kept = {role: only for role in obj.components}
            self._write_object(
                target,
                obj.format,
                obj.shape,
                obj.components,
                obj.types,
                obj.attributes,
                False,
                None,
                per_role=kept,
            )
            return
        # stored bytes are copied as they are, but an object a read refuses for its
        # attributes is not copied either (formats.check_attributes), nor one whose
        # bool bytes it refuses (a read checks them: io/values.check_bools)
        formats.check_attributes(
            meta.format, meta.shape, meta.attributes, path=self.path, obj=target
        )
        if any(logical.is_bool(c.dtype, c.type) for c in meta.components.values()):
            reader.read(name)
        # and what a default Reader refuses of this file: the source may have been
        # opened with raised limits, and its compressed sizes count toward this
        # file's max_total_decompressed with the new objects'
        sizes = [
            (
                role,
                _Nbytes(c.uncompressed_length if c.encoding == "zstd" else c.length),
                c.dtype,
                c.type,
            )
            for role, c in meta.components.items()
        ]
        zstd = [role for role, c in meta.components.items() if c.encoding == "zstd"]
        self._check_as_reader(target, meta.format, meta.shape, dict(meta.attributes), sizes, zstd)
        comps = {}
        for role, c in meta.components.items():
            stored = reader.stored_bytes(name, role)

            def copy_one(c=c, stored=stored, role=role):
                self._blobs.pad(spec.ALIGNMENT)
                offset = self._blobs.pos
                if len(stored):
                    self._blobs.write(stored)
                return ComponentSpec(
                    role,
                    c.dtype,
                    c.type,
                    offset,
                    c.length,
                    c.encoding,
                    c.uncompressed_length,
                    c.digest,
                )

            comps[role] = self._guard(copy_one)
        self._objects[target] = ObjectSpec(
            target, meta.shape, meta.format, dict(meta.attributes), comps
        )

    @classmethod
    def append(cls, path: Union[str, "os.PathLike[str]"], **kwargs: Any) -> "Writer":
        """A Writer that adds objects to an existing zTensor file.

        The new file is built beside the old one (every existing object copied as
        stored, nothing decoded) and renamed over it when the Writer closes: until
        then the old file is untouched, and a crash at any point leaves the old
        file or the complete new one, never a mix (docs/editing.md).  Costs one copy
        of the file's bytes, in exchange for that guarantee.  ``attributes=``
        updates the file's attributes (keys given replace those keys; the rest are
        kept)."""
        version = atomic.identity(path)  # before the read: see rewrite
        given = kwargs.pop("attributes", None)
        with Reader(path, storage_options=kwargs.get("storage_options")) as old:
            if old.format != "zt":
                raise FormatError(f"append needs a zTensor file, not {old.format}", path=path)
            require_writable_version(old)
            attributes = dict(old.attributes)
            if given is not None:
                if not isinstance(given, dict):
                    kind = builtins.type(given).__name__
                    raise TypeError(f"attributes must be a dict, not {kind}")
                attributes.update(given)
            writer = cls.rewrite(path, version, attributes=attributes, **kwargs)
            try:
                for name in old.keys():
                    writer.copy_from(old, name)
            except BaseException as exc:
                try:
                    writer.abort()
                except WriteError as leftover:  # a temporary file stayed: said on exc
                    atomic.note_leftover(exc, leftover.message)
                raise
        return writer

    @classmethod
    def rewrite(cls, path: Union[str, "os.PathLike[str]"], version: Any, **kwargs: Any) -> "Writer":
        """A Writer that replaces the file at ``path`` with a new version built from
        it (the edits: :meth:`append`, ``replace_tensor``, ``remove_tensors``; and a
        caller's own edit, docs/editing.md).

        Parameters
        ----------
        path : str or os.PathLike
            The file being edited (a local path: an object store keeps no version,
            and ``version`` is then ignored).
        version : tuple or None
            ``ztensor.io.atomic.identity(path)`` (device, inode, size, modification
            time; None when no file is there), taken BEFORE the old file was opened
            for reading.  :meth:`close` renames the new file over the old one only
            while that is still this version; a file another process replaced or
            rewrote meanwhile is a WriteError naming ``path``, nothing written, the
            other process's change kept (atomic.require_unchanged).  Taken after the
            open, a replacement landing between the open and this call was the
            version compared against, and the edit built from the older file dropped
            it without a word.
        **kwargs
            The :class:`Writer`'s own options (``attributes``, ``fsync``,
            ``storage_options``).

        Examples
        --------
        >>> version = ztensor.io.atomic.identity("model.zt")
        >>> with ztensor.Reader("model.zt") as old, ztensor.Writer.rewrite(
        ...     "model.zt", version, attributes=dict(old.attributes)
        ... ) as new:
        ...     for name in old.keys():
        ...         if not name.startswith("optimizer."):
        ...             new.copy_from(old, name)
        """
        return cls(path, _replaces=version, **kwargs)

    @keyword_aliases(data="obj")
    @_one_at_a_time
    def write(
        self,
        name: str,
        obj: Any,
        *,
        compress: Union[bool, int] = False,
        checksum: Optional[str] = None,
    ) -> None:
        """Write a composite object (any format) given as a :class:`ztensor.Tensor`,
        a scipy.sparse matrix/array (stored as sparse_coo when COO, else sparse_csr),
        or a numpy array (a dense object, as :meth:`write_numpy`).

        Components are written in the order of ``obj.components``; the same
        ``compress`` and ``checksum`` apply to each.  Sparse index components are
        stored as ``u64``."""
        if not isinstance(obj, Tensor) and hasattr(obj, "tocsr"):  # scipy.sparse
            obj = Tensor.from_scipy(obj)
        elif isinstance(obj, np.ndarray):  # a plain array: a dense object
            obj = Tensor({"data": obj})
        if not isinstance(obj, Tensor):
            raise TypeError(
                f"write() takes a ztensor.Tensor, a numpy array or a scipy.sparse "
                f"matrix, not {type(obj).__name__}"
            )
        self._write_object(
            name,
            obj.format,
            obj.shape,
            obj.components,
            obj.types,
            obj.attributes,
            compress,
            checksum,
        )

    def _write_object(
        self, name, fmt, shape, arrays, types, attributes, compress, checksum, per_role=None
    ):
        """Write one object; ``compress`` and ``checksum`` apply to every component,
        except those ``per_role`` (role -> (compress, checksum)) sets otherwise."""
        self._require_open()
        name = self._check_name(name)
        # a Tensor's shape is checked when it is made, but it is a plain attribute
        shape = self._shape_of(name, shape)
        default = _component_settings(compress, checksum, self.path)
        per_role = {
            role: _component_settings(*asked, self.path) for role, asked in (per_role or {}).items()
        }
        attributes = _check_attributes(attributes, self.path, name)
        if not isinstance(arrays, dict) or not arrays and fmt == "dense":
            raise FormatError("an object needs a dict of components", path=self.path, obj=name)
        if not isinstance(types, dict):  # a Tensor's plain attribute, set after it was made
            raise FormatError(
                "types must be a dict of role name -> type name, not "
                f"{builtins.type(types).__name__}",
                path=self.path,
                obj=name,
            )
        for role in arrays:
            attrs.check_name(role, "component names", path=self.path, obj=name)
        prepared = [
            (role,) + self._prepare(name, role, arr, types.get(role))
            for role, arr in arrays.items()
        ]
        self._check_as_reader(name, fmt, shape, attributes, prepared)
        # the format's own write-side rules (formats/<format>.py): sparse indices
        # become u64 and are validated, dense data must match the shape, ...
        prepared = formats.handler(fmt).prepare(fmt, shape, prepared, path=self.path, obj=name)
        # and what a read refuses in the attributes and components (quantized bits,
        # GGUF block geometry): the reader's own function, formats.check_object
        formats.check_object(
            fmt,
            tuple(shape),
            attributes,
            {role: arr for role, arr, _, _ in prepared},
            {role: "bf16" if storage == "bf16" else ltype for role, _, storage, ltype in prepared},
            path=self.path,
            obj=name,
        )
        settings = {role: per_role.get(role, default) for role, _, _, _ in prepared}
        if any(level for level, _ in settings.values()):
            # a compressed component's decoded size, which a reader holds to its
            # per-component and per-file limits, is that of the array written:
            # prepare may widen it (sparse indices become u64: checked before, a
            # component twice the limit was written, and no default Reader opened it)
            # (the stored length is not known before compressing: the decoded one stands
            # in, never 0, as zstd data never is: Checker.check_zstd_size)
            for role, arr, storage, ltype in prepared:
                if not settings[role][0]:
                    continue
                self._checker.check_zstd_size(
                    name,
                    role,
                    arr.nbytes,
                    arr.dtype.itemsize or 1,
                    ltype or storage,
                    max(arr.nbytes, 1),
                )
        comps = {}
        for role, arr, storage, ltype in prepared:
            comps[role] = self._guard(
                components.write_component,
                self._blobs,
                role,
                components.little_endian_chunks(arr),
                storage=storage,
                ltype=ltype,
                compress=settings[role][0],
                checksum=settings[role][1],
            )
        self._objects[name] = ObjectSpec(name, shape, fmt, attributes, comps)

    def _check_as_reader(self, name, fmt, shape, attributes, prepared, zstd=()):
        """Run the reader's manifest checks on the entry this object will have
        (components at aligned offsets; those whose roles are in ``zstd`` declaring
        their decoded size, ``nbytes``, which the reader holds to its per-component
        and per-file limits), so nothing is written that a reader refuses: one
        definition of a valid object, in manifest.Checker."""
        try:
            entry_shape = [int(d) for d in shape]
        except (TypeError, ValueError, OverflowError):
            raise FormatError(
                f"shape must be a sequence of integers, got {attrs.show(shape)}",
                path=self.path,
                obj=name,
            ) from None
        offset, comps = spec.ALIGNMENT, {}
        for role, arr, storage, ltype in prepared:
            comps[role] = {"dtype": storage, "offset": offset, "length": arr.nbytes}
            if ltype is not None:
                comps[role]["type"] = ltype
            if role in zstd:  # its stored length may not be known: the decoded size
                # stands in, never 0 (zstd data never is: Checker.check_zstd_size)
                comps[role].update(
                    encoding="zstd", uncompressed_length=arr.nbytes, length=max(arr.nbytes, 1)
                )
            offset += -(-max(arr.nbytes, 1) // spec.ALIGNMENT) * spec.ALIGNMENT
        entry = {"shape": entry_shape, "format": fmt, "attributes": attributes, "components": comps}
        self._checker.object_spec(name, entry)

    def _prepare(self, name, role, arr, explicit):
        """(C-contiguous array, storage dtype, logical type) of one component."""
        arr = array_of(arr, self.path, name, role)
        storage, ltype = self._storage_of(name, role, arr.dtype, explicit)
        if not arr.flags.c_contiguous:
            # a view may show far more elements than it holds (np.broadcast_to, a
            # stride-0 torch.save tensor: 1.5 KB of file, 64 GiB of elements); their
            # copy is a LimitError naming the object when memory runs out, as a read's
            try:
                arr = np.array(arr, order="C")
            except MemoryError:
                raise LimitError(
                    f"not enough memory for the {arr.nbytes}-byte contiguous copy of "
                    "this component",
                    path=self.path,
                    obj=name,
                    component=role,
                ) from None
        if (storage == "bool" or ltype == "bool") and logical.is_bool(storage, ltype):
            # the spec's bool bytes are 0 and 1; an array made through a view (numpy's
            # or torch's) may hold 0x02 and means true: written as 1, never as read
            # would refuse it (docs/format-decisions.md)
            arr = logical.clean_bools(arr)
        return arr, storage, ltype

    def _storage_of(self, name, role, dtype, explicit):
        """(storage dtype, logical type) for elements of numpy ``dtype`` with the
        caller's logical type ``explicit`` (or None), refusing contradictions."""
        found = dtypes.spec_types_for(dtype)
        if found is None:
            raise UnsupportedError(
                f"cannot store numpy dtype {dtype}", path=self.path, obj=name, component=role
            )
        storage, ltype = found
        if explicit == "bf16":  # bf16 bit patterns (uint16 when ml_dtypes is missing)
            if storage not in ("u16", "bf16"):
                raise FormatError(
                    f"bf16 components need uint16 bits or ml_dtypes bfloat16, not {dtype}",
                    path=self.path,
                    obj=name,
                    component=role,
                )
            storage, explicit = "bf16", None
        if explicit is not None:
            if ltype is not None and explicit != ltype:
                raise FormatError(
                    f"type {explicit!r} contradicts the array's {ltype!r}",
                    path=self.path,
                    obj=name,
                    component=role,
                )
            known = dtypes.LOGICAL.get(explicit)
            if known is not None and known.storage != storage:
                raise FormatError(
                    f"type {explicit!r} needs {known.storage!r} storage, the array is {storage!r}",
                    path=self.path,
                    obj=name,
                    component=role,
                )
            ltype = explicit
        return storage, ltype

    def _shape_of(self, name, shape):
        """``shape`` by the one rule for a caller's shape (arguments.caller_shape),
        its errors naming this file and object."""
        try:
            return caller_shape(shape)
        except FormatError as exc:
            exc.locate(self.path, name)
            raise
        except TypeError as exc:
            raise TypeError(f"{self.path}: object {name!r}: {exc}") from None

    def _check_name(self, name) -> str:
        """``name`` as the plain str it is stored under, unless it is refused
        (attrs.caller_name: no str is a TypeError; an empty or invalid one a
        FormatError), or was already written."""
        name = attrs.caller_name(name, "object names", self.path)
        if name in self._objects:
            raise FormatError(
                "an object of this name was already written", path=self.path, obj=name
            )
        return name

    # ------------------------------------------------------------ finishing
    @_one_at_a_time
    def close(self) -> None:
        """Write the manifest and footer and move the file to its final name."""
        if self._state == "closed":
            return
        self._require_open()
        with gc_paused():  # ~5 containers per object, none of them cyclic
            manifest = self._guard(encode_manifest, self._objects, self._attributes)
        self._guard(self._check_readable, manifest)
        self._guard(self._blobs.write, manifest)
        self._guard(self._blobs.write, encode_footer(len(manifest)))
        self._guard(self._blobs.flush)
        try:
            if self._fsync:
                os.fsync(self._temp.fd)
            self._temp.close()
            if self._upload is not None:  # WriteError naming the URL; no object left
                self._guard(self._upload.commit, self._temp.path)
            else:
                # by path: a folder renamed meanwhile is an error here, not a file
                # written under the new name (the temporary file is then removed
                # where it went: atomic.Temp.discard)
                if self._replaces is not None:  # an edit: the file is still its source
                    atomic.replace_if_unchanged(
                        self._temp.path, self._target, self._replaces, self.path
                    )
                else:
                    os.replace(self._temp.path, self._target)
            self._temp.done()
        except WriteError as exc:  # the file changed meanwhile, or the upload failed
            self._abandon(exc)  # (a failed upload's guard abandoned it already)
            raise
        except OSError as exc:
            error = WriteError(
                f"cannot finish the file: {exc.strerror}", path=self.path, errno=exc.errno
            )
            self._abandon(error)
            raise error from exc
        self._size = self._blobs.pos
        self._blobs.close()
        self._state = "closed"

    def _check_readable(self, manifest) -> None:
        """LimitError naming the file unless a reader with the default limits takes
        this many objects and a manifest this size: the reader's own rule
        (manifest_checks.check_file_totals), which the per-object checks
        (manifest.Checker) cannot see; a file written past it was one every default
        Reader refused.  Nothing is written then: the old file is kept."""
        try:
            check_file_totals(self.path, spec.DEFAULT_LIMITS, len(self._objects), len(manifest))
        except LimitError as exc:
            exc.rename(self.path, "a reader refuses such a file: nothing was written")
            raise

    def finish(self) -> int:
        """:meth:`close`, returning the file's size in bytes (the reference
        implementation's name and return value)."""
        self.close()
        return self._size

    @_one_at_a_time
    def abort(self) -> None:
        """Drop everything written so far; the final name is left untouched.  A
        temporary file that cannot be removed is a WriteError naming the path and,
        in its message, the temporary file."""
        problem = self._discard()
        if problem is not None:
            raise WriteError(f"the write was abandoned, but {problem}", path=self.path)

    @_one_at_a_time
    def _discard(self):
        """Close the writer and remove its temporary file (wherever its folder went:
        atomic.Temp.discard); None, or why the file could not be removed."""
        if self._state in ("closed", "failed"):  # already discarded
            return None
        self._state = "closed"
        self._blobs.close()
        return self._temp.discard()

    @_one_at_a_time
    def _guard(self, fn, *args, **kwargs):
        """Run a step that writes bytes; after a failure the file is abandoned."""
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            self._abandon(exc)
            raise

    @_one_at_a_time
    def _abandon(self, error=None):
        """Drop the file after a failure that leaves it torn (a stream closed short,
        or left by an error), and the writer reports itself failed; a temporary file
        that could not be removed is said in ``error``, the error being raised
        (atomic.note_leftover).  Handed to TensorStream (stream.py), as is
        :meth:`_guard`."""
        problem = self._discard()
        self._state = "failed"
        if error is not None:
            atomic.note_leftover(error, problem)

    def _require_open(self):
        if self._state != "open":
            raise ClosedError(f"writer is {self._state}", path=self.path)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is None:
            self.close()
        elif exc is not None:
            atomic.note_leftover(exc, self._discard())
        else:
            self._discard()
        return False

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise refuse_copy(self, self.path)  # a copy's __del__ would abort this file

    def __del__(self):
        # "streaming": a stream never closed holds the writer, and both went together;
        # in a forked child the temporary file is the parent's, still being written
        if getattr(self, "_pid", None) != os.getpid():
            return
        if getattr(self, "_state", "closed") in ("open", "streaming"):
            # nothing was promised to the final name: drop the temporary file, and
            # say so, as Python does for a file never closed
            try:
                shown = repr(self)
            except Exception:  # interpreter shutdown: the file is dropped all the same
                shown = "<ztensor.Writer>"
            problem = self._discard()
            try:
                warnings.warn(
                    f"{shown} was never closed: {len(self._objects)} objects "
                    "discarded, the file was not written" + (f"; {problem}" if problem else ""),
                    ResourceWarning,
                    stacklevel=2,
                    source=self,
                )
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self) -> str:
        state = "finished" if self._state == "closed" else self._state  # the reference's word
        # a URL's credentials never shown (its ResourceWarning quotes this too)
        return without_secrets(
            f"<ztensor.Writer {self.path!r} ({state}, {len(self._objects)} objects)>",
            self.path,
        )


class _Nbytes:
    """What Writer._check_as_reader needs of a component it is given no array of
    (one copied as stored): its size."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


class _BoolSink:
    """A bool stream's ComponentSink, each chunk's bytes made 0 or 1 on the way
    (io/values.clean_bools), as Writer._prepare does for whole arrays."""

    def __init__(self, sink):
        self.sink = sink

    def write(self, chunk) -> None:
        self.sink.write(logical.clean_bools(np.asarray(chunk)))

    def finish(self):
        return self.sink.finish()


# the largest finite value of each FP8 type (what saturate=True clips to)
FP8_MAX = {"f8_e4m3fn": 448.0, "f8_e5m2": 57344.0, "f8_e4m3fnuz": 240.0, "f8_e5m2fnuz": 57344.0}


def array_of(value: Any, path: Any, name: Any, role: str = "data") -> np.ndarray:
    """``value`` (an array, or what numpy makes one of) as a numpy array to write:
    the one conversion every writing call makes (write_numpy, write, the edits'
    replace_tensor).  A subclass (np.matrix, np.memmap) is written as the plain
    array of its memory; a masked array is refused (tensor.refuse_masked); a value
    numpy cannot make one array of (a ragged list, a list of arrays of other
    shapes) is a FormatError naming the file and the object, where it was numpy's
    bare ValueError."""
    refuse_masked(value, name)
    if builtins.type(value) is np.ndarray:
        return value
    try:
        # a subclass becomes the plain array of its memory: np.matrix stays 2-D
        # through reshape(-1), so its bytes were counted as rows (a compressed one
        # was written with a wrong decoded size: a file no Reader opens)
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise FormatError(
            f"cannot make one array of this {builtins.type(value).__name__}: {exc}",
            path=path,
            obj=name,
            component=role,
        ) from None


def _encode_as(arr, type_name, saturate=False, path=None, name=None):
    """(array to store, types) for write_numpy's ``type=``: it always means "encode
    these values".  uint8/uint16 input is refused: such arrays are as likely to be
    FP8/bf16 bit patterns as numbers, and guessing wrong changes every value.
    Errors name ``path`` and the object ``name``."""
    if type_name is None:
        if saturate:
            raise ValueError("saturate= applies to type='f8_...' encodings only")
        return arr, {}
    if arr.dtype.kind not in "fiu":
        raise UnsupportedError(
            f"type={type_name!r} needs real numbers, not {arr.dtype}", path=path, obj=name
        )
    if type_name in ("bf16", "bfloat16", *dtypes.FP8_TYPES) and arr.dtype in (
        np.dtype(np.uint8),
        np.dtype(np.uint16),
    ):
        raise FormatError(
            f"type={type_name!r} encodes values, and {arr.dtype} data may "
            "already be encoded bits: pass float values to encode, or store "
            "bits as they are with write(name, Tensor({'data': codes}, "
            f"types={{'data': {type_name!r}}}))",
            path=path,
            obj=name,
        )
    if type_name in ("bf16", "bfloat16"):
        return floatconv.float32_to_bf16(arr), {"data": "bf16"}
    if type_name in dtypes.FP8_TYPES:
        if saturate:  # overflow and infinities to the largest finite value; NaN stays
            limit = FP8_MAX[type_name]
            arr = np.clip(np.asarray(arr, np.float32), -limit, limit)
        return floatconv.float_to_fp8(arr, type_name), {"data": type_name}
    raise ValueError(
        f"type must be 'bf16' or one of {', '.join(dtypes.FP8_TYPES)}, not {type_name!r}"
    )


def _component_settings(compress, checksum, path):
    """(zstd level, checksum) for a component, as the caller's ``compress`` and
    ``checksum`` ask, or a ValueError saying what is wrong."""
    level = _zstd_level(compress, path)
    checksum = None if checksum == "none" else checksum  # the reference's spelling
    if checksum not in (None, "crc32c", "sha256"):
        raise ValueError(f"checksum must be None, 'crc32c' or 'sha256', got {checksum!r}")
    return level, checksum


def _kept_encoding(component) -> tuple:
    """(compress, checksum) re-encoding a v0.1, v1.1 or v2 ``component``
    (:meth:`Writer.copy_from`) with what it had: zstd stays compressed, and a
    digest stays a digest (its own algorithm where this writer has it, else
    crc32c: a checked component is never written unchecked)."""
    digest = component.digest
    if digest is None:
        checksum = None
    else:
        algorithm = str(digest).split(":", 1)[0].lower()
        checksum = algorithm if algorithm in ("crc32c", "sha256") else "crc32c"
    return component.encoding == "zstd", checksum


def _zstd_level(compress, path):
    if isinstance(compress, np.integer):  # a numpy int is a level too (np.bool_ is not one)
        compress = int(compress)
    if compress is None or compress is False or (type(compress) is int and compress == 0):
        return 0
    if compress is True:
        return spec.DEFAULT_ZSTD_LEVEL
    if isinstance(compress, int) and not isinstance(compress, bool) and compress != 0:
        if not spec.MIN_ZSTD_LEVEL <= compress <= spec.MAX_ZSTD_LEVEL:
            raise ValueError(
                f"zstd level must be in [{spec.MIN_ZSTD_LEVEL}, {spec.MAX_ZSTD_LEVEL}], "
                f"got {compress}"
            )
        return compress
    raise ValueError(f"compress must be a bool or a zstd level, got {compress!r}")


def _check_attributes(attributes, path, name=None):
    """A copy of ``attributes`` if the reader would accept them (attributes.py).

    The copy is made first and is what is checked and later encoded: a shallow
    copy kept the caller's nested lists and maps, so a value put in one after the
    call (or a dict subclass whose ``items`` showed the check other contents than
    it holds) reached the encoder at ``close`` unchecked, and the whole file was
    lost to a bare CBOREncodeError."""
    if attributes is None:
        return {}
    what = "attributes" if name is not None else "file attributes"
    return attrs.check_map(_plain_copy(attributes, 0), what, writing=True, path=path, obj=name)


def _plain_copy(value, depth):
    """``value`` with its maps and lists copied (maps as dicts, through ``items``;
    lists and tuples as lists), down to one level past what attributes.check_map
    allows: deeper (a list holding itself) is left for it to refuse."""
    if depth > attrs.MAX_DEPTH + 1:
        return value
    if isinstance(value, dict):
        return {k: _plain_copy(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_copy(v, depth + 1) for v in value]
    return value
