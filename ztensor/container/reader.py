"""Reader: file -> footer -> manifest -> object -> components -> arrays.

That is the path of zTensor v1.x and v0.1 files (local, mapped or read, or a
remote URL through source.py).  Two others end in the same object specs: the v2
container (PyPI ztensor 2.x's, read-only: container_v2.py) and the other formats
a local path may hold, found by their magic (foreign.sniff) and read by
foreign/'s readers: safetensors, npy/npz, PyTorch zip checkpoints, GGUF, HDF5
and ONNX.  Opening validates the whole manifest (see manifest.py; container_v2
and foreign/ check theirs) before any data byte is touched; reading an object
touches only that object's bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Union, cast, overload

import numpy as np

from ztensor import dtypes, foreign, formats, kernels, spec
from ztensor._save import BYTES, named_as_bytes
from ztensor.arguments import caller_dtype, keyword_aliases
from ztensor.container import batch, into, legacy
from ztensor.container import v2 as container_v2
from ztensor.container.footer import read_footer
from ztensor.container.manifest import Manifest, decode_manifest
from ztensor.errors import (
    ClosedError,
    FormatError,
    LimitError,
    NotAFileError,
    ObjectNotFoundError,
    UnsupportedError,
    ZTensorError,
    memory_is_a_limit,
    refuse_copy,
    without_secrets,
)
from ztensor.formats import dense, sparse
from ztensor.frameworks.torch_bridge import object_to_torch
from ztensor.io import components, digests, floats
from ztensor.io import values as logical
from ztensor.io.source import Source, is_url
from ztensor.io.upload import check_storage_options
from ztensor.objects import ObjectSpec
from ztensor.tensor import Tensor


def _memory_is_a_limit(method):
    """A legitimate object larger than the memory left is a LimitError naming it,
    never a bare MemoryError (docs/safety.md)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        name = args[0] if args and isinstance(args[0], str) else None
        with memory_is_a_limit(self.path, name):
            return method(self, *args, **kwargs)

    return wrapper


def _no_view(name):
    """read_numpy's hot path when no object is a plain view (Reader._zero_copy_views)."""
    return None


@dataclasses.dataclass(frozen=True)
class ReaderInternals:
    """An open Reader's state, for the modules of this package that read through
    their own paths: ``Reader.internals`` gives it (house rule 2: no module reaches
    into another's private names; tests/test_architecture.py).  Not public API.

    Who uses what, and why: ``batch.py`` plans many objects over ``specs`` (the
    manifest's columns) and copies from ``source``; ``into.py`` decodes a component
    from ``source`` straight into the caller's memory; ``safe.py`` reads slices
    (rows of ``source``, frames of a seekable zstd stream, ``component``);
    ``dask.py`` and the others ask ``foreign`` whether the file is another format;
    ``checkpoint.py``, ``numpy.py`` and ``torch.py`` ask ``format_of`` without
    building a spec.  ``verify``, ``limits`` and ``require_open`` are the Reader's
    own, so these paths check digests, limits and a close as its reads do.
    """

    #: the file's bytes (ztensor.io.source.Source); None for other formats
    source: Optional[Source]
    #: name -> ObjectSpec in manifest order: a dict, or manifest_table.TableSpecs
    specs: Any
    #: check each component's digest whenever it is read
    verify: bool
    limits: spec.Limits
    #: the reader of another format (ztensor/foreign); None for zTensor files
    foreign: Any
    #: () -> None; ClosedError once the Reader is closed
    require_open: Callable[[], None]
    #: (spec, component spec, copy) -> the component's stored elements, read as
    #: Reader.read reads them (open check, limits, digest when ``verify``)
    component: Callable[..., np.ndarray]
    #: name -> the object's format, without building its spec where the manifest can;
    #: ObjectNotFoundError for an unknown name
    format_of: Callable[[str], str]
    #: name -> the object's array as read_numpy hands it out when it is plain (no
    #: conversion or check left to do), else None: a zero-copy view of a .zt file
    #: (formats/dense.py view_plan, from the view table: no spec built); another
    #: format's reader's array, a view where that format stores it plainly (a copy
    #: for a deflated zip member or HDF5).  torch.py's load asks it once per tensor
    plain_view: Callable[[str], Optional[np.ndarray]]


class Reader:
    """Read a zTensor file (v1.2, v1.1 or legacy v0.1).

    Parameters
    ----------
    source : str, os.PathLike, URL, file object, bytes, bytearray or memoryview
        A path (memory-mapped, read-only); an fsspec URL (``s3://``, ``https://``,
        ``memory://``..., needs fsspec); a seekable binary file object (an open file,
        ``io.BytesIO``, an fsspec file: only the footer, the manifest and the
        components read are fetched); or the file's bytes.  Other tensor formats
        (safetensors, PyTorch, ...) are read from local paths.
    verify : bool
        Check each component's digest whenever it is read.
    limits : ztensor.Limits, optional
        Safety limits; :data:`ztensor.DEFAULT_LIMITS` when omitted.
    copy_on_write : bool
        Map the file privately: zero-copy views become writable, and writes go to
        private copies of the pages, never to the file (used for torch tensors,
        which have no read-only flag).  zTensor and safetensors files; readers of
        other formats that hand out views keep them read-only.
    mmap : bool
        False: read with ``pread`` instead of mapping the file.  Arrays are then
        always copies, and a file truncated by another process while open gives a
        FormatError instead of a SIGBUS (see docs/safety.md).
    storage_options : dict, optional
        For a URL: fsspec's options for its filesystem (credentials, an endpoint:
        ``{"client_kwargs": {"endpoint_url": ...}}``), as pandas takes them.  With
        a local path, a file object or bytes they are a ValueError.

    Raises
    ------
    FormatError
        The file is not a valid zTensor file (bad magic, truncation, malformed or
        lying manifest).
    LimitError
        A declared size is above a limit.
    UnsupportedError
        A format version this reader does not know.
    OSError
        The path cannot be opened.

    Notes
    -----
    Arrays returned without ``copy`` are read-only views of the mapping and keep it
    alive: :meth:`close` is safe while they exist.  A Reader may be shared by
    threads: what a read changes (the count of decoded bytes, below) is locked.
    """

    @keyword_aliases(path="source")  # the reference's Reader(path=)
    def __init__(
        self,
        source: Union[str, "os.PathLike[str]", bytes, bytearray, memoryview, Any],
        *,
        verify: bool = False,
        limits: Optional[spec.Limits] = None,
        copy_on_write: bool = False,
        mmap: bool = True,
        storage_options: Optional[Dict[str, Any]] = None,
    ) -> None:
        self._closed = True  # until the manifest is checked (and for __del__)
        storage_options = check_storage_options(source, storage_options)
        self._limits = spec.limits_given(limits)
        self._verify = verify
        self._foreign = None
        self._view_of = None
        self._zero_copy = None  # name -> view, for read_numpy's hot path (first use)
        self._decoded_total = None  # decoded bytes, once a v1.1 size-less part is read
        self._undeclared_counted: set = set()  # (object, role) of those parts counted
        self._count_lock = threading.Lock()  # reads from many threads count each once
        # a local path is opened through source.open_local_input by sniff (and Source):
        # a directory, FIFO or device is refused there, before any reader sees it
        try:
            kind = (
                foreign.sniff(os.fspath(source))
                if isinstance(source, (str, os.PathLike)) and not is_url(source)
                else None
            )
        except NotAFileError as exc:
            # only a local path (str or PathLike) was sniffed, so only one gets here
            if not isinstance(source, (str, os.PathLike)) or not os.path.isdir(source):
                raise
            raise NotAFileError(
                "is a directory, not a tensor file: open a checkpoint "
                "directory with ztensor.open_sharded(path)",
                path=exc.path,
            ) from None
        if kind is not None:  # another tensor format: read-only, through ztensor/foreign
            self._source = None
            self.path = os.fspath(cast("Union[str, os.PathLike[str]]", source))  # sniffed: local
            self._foreign = foreign.open_foreign(
                self.path, kind, self._limits, copy_on_write=copy_on_write, mmap=mmap
            )
            self._manifest = Manifest(
                None,
                self._foreign.attributes,
                {n: e.spec for n, e in self._foreign.entries.items()},
            )
            self._closed = False
            return
        self._source = Source(
            source, copy_on_write=copy_on_write, mmap=mmap, storage_options=storage_options
        )
        self.path = self._source.name
        try:
            head = self._source.view(0, min(spec.MAGIC_SIZE, self._source.size), "header")
            if container_v2.is_v2(head):  # PyPI ztensor 2.x's container, read-only
                attributes, specs = container_v2.read(self._source, self._limits, self.path)
                self._manifest = Manifest(container_v2.VERSION, attributes, specs)
                self._closed = False
                return
            footer = read_footer(self._source, self._limits, head)
            raw = self._source.view(footer.manifest_offset, footer.manifest_size, "manifest")
            self._manifest = decode_manifest(raw, footer, path=self.path, limits=self._limits)
            # plain views straight from the manifest's tables (manifest_table.py), when
            # it came that way and nothing (verify) asks for more per read
            specs = self._manifest.specs
            self._view_of = getattr(specs, "view_of", None) if not self._verify else None
        except FormatError:
            # not a zTensor file: a sharded checkpoint's index says so by name
            is_index = _is_index(self._source, self.path)
            self._source.close()
            if is_index:
                raise FormatError(
                    "a sharded checkpoint's index, not a tensor file: open it "
                    "with ztensor.open_sharded(path) (ztensor.torch.load_file "
                    "and load_model take it too)",
                    path=self.path,
                ) from None
            raise
        except BaseException:
            self._source.close()
            raise
        self._closed = False

    # ------------------------------------------------------------ mapping API
    @property
    def version(self) -> Optional[str]:
        """The file's zTensor version string, e.g. ``"1.2.0"`` (``"0.1.0"`` for v0.1);
        None for other formats."""
        return self._manifest.version

    @property
    def format(self) -> str:
        """What kind of file this is, by the reference implementation's names:
        ``"zt"``, ``"safetensors"``, ``"pickle"`` (PyTorch), ``"npy"``, ``"npz"``,
        ``"gguf"``, ``"onnx"`` or ``"hdf5"``."""
        return "zt" if self._foreign is None else self._foreign.format

    @property
    def attributes(self) -> Dict[str, Any]:
        """File-level attributes."""
        self._require_open()
        return self._manifest.attributes

    def keys(self) -> List[str]:
        """Object names, in manifest order."""
        self._require_open()
        return self._manifest.names()

    # Once closed, every method but close raises ClosedError, names and specs
    # included, as ShardedReader and safetensors' safe_open do: one rule for every
    # handle, so code that works on one kind of checkpoint works on the other.
    def __iter__(self) -> Iterator[str]:
        self._require_open()
        return iter(self._manifest.names())

    def __len__(self) -> int:
        self._require_open()
        return len(self._manifest)

    def __bool__(self) -> bool:
        # a handle is true, open or closed (``if self.reader: self.reader.close()``
        # runs twice in cleanup code): not len(), which a closed Reader refuses
        return True

    def __contains__(self, name: object) -> bool:
        self._require_open()
        return name in self._manifest

    def __getitem__(self, name: str) -> np.ndarray:
        return self.read_numpy(name)

    @overload
    def metadata(self, name: str) -> ObjectSpec: ...

    @overload
    def metadata(self, name: List[str]) -> List[ObjectSpec]: ...

    def metadata(self, name: Union[str, List[str]]) -> Union[ObjectSpec, List[ObjectSpec]]:
        """The validated :class:`~ztensor.objects.ObjectSpec` of ``name``: shape, format,
        dtype, type, attributes and every component's fields.  A list of names gives a
        list of specs, in its order (the reference's ``metadata`` takes both)."""
        self._require_open()
        if isinstance(name, list):
            return [self._spec_named(one) for one in name]
        return self._spec_named(name)

    def _spec_named(self, name: Any) -> ObjectSpec:
        found = self._manifest.specs.get(name) if isinstance(name, str) else None
        if found is None:
            raise ObjectNotFoundError("no such object", path=self.path, obj=name)
        return found

    @property
    def internals(self) -> ReaderInternals:
        """This Reader's state for ztensor's own modules (:class:`ReaderInternals`);
        not public API.  Made anew on each access: it holds the Reader's methods, so
        a cached one would tie the Reader into a reference cycle, and an unclosed
        Reader must be released as soon as it is dropped."""
        return ReaderInternals(
            self._source,
            self._manifest.specs,
            self._verify,
            self._limits,
            self._foreign,
            self._require_open,
            self._component,
            self._format_of,
            self._plain_view,
        )

    def _plain_view(self, name: str) -> Optional[np.ndarray]:
        if self._foreign is not None:
            return self._foreign_plain_view(name)
        view_of = self._zero_copy
        if view_of is None:
            view_of = self._zero_copy_views()
        return view_of(name)

    def _format_of(self, name: str) -> str:
        """metadata(name).format, without building the spec where the manifest can."""
        found = self._manifest.format_of(name) if isinstance(name, str) else None
        if found is None:
            raise ObjectNotFoundError("no such object", path=self.path, obj=name)
        return found

    # ------------------------------------------------------------ reading
    @overload
    def read_numpy(
        self, name: str, *, copy: bool = ..., dtype: Any = ..., threads: Optional[int] = ...
    ) -> np.ndarray: ...

    @overload
    def read_numpy(
        self, name: List[str], *, copy: bool = ..., dtype: Any = ..., threads: Optional[int] = ...
    ) -> Dict[str, np.ndarray]: ...

    def read_numpy(
        self,
        name: Union[str, List[str]],
        *,
        copy: bool = False,
        dtype: Any = None,
        threads: Optional[int] = None,
    ) -> Union[np.ndarray, Dict[str, np.ndarray]]:
        """A dense object as a numpy array of its logical shape and dtype.

        Parameters
        ----------
        name : str or list of str
            One object, or several (a dict name -> array comes back).
        copy : bool
            False: raw components are a zero-copy, read-only view of the file
            (little-endian dtype; see docs/byte-order.md).  True: an owned, writable
            array in native byte order.  zstd components are always decoded into a
            new array.
        dtype : numpy dtype, torch dtype or a dtype's name, optional
            Convert to this dtype: numpy's names (``"float32"``) and the spec's
            (``"f32"``, ``"bf16"``) are taken, and the spellings the two read as
            different types (``"u8"``, ``"i8"``, ``"f16"``) are a ValueError
            (:func:`ztensor.arguments.caller_dtype`).  bf16 and FP8 objects are decoded
            by the C kernels straight to float32 or float16 (exact; no ml_dtypes
            needed); other objects go through ``astype``.
        threads : int, optional
            For a list with ``copy=True``: copy in this many threads (default: every
            core this process may use).  Small objects then share one allocation,
            each a separate writable view of it (ztensor/container/batch.py).

        Returns
        -------
        numpy.ndarray
            bf16/FP8 objects come back as ml_dtypes arrays, or decoded to float32
            when ml_dtypes is not installed; complex types as numpy complex.
        """
        if dtype is None and type(name) is str:
            # the hot calls (a zero-copy view per tensor, or an owned copy of one): a
            # slice of the mapping typed once per dtype (numpy slices in half the time
            # it takes to make an array over a buffer), found through the manifest's
            # own name -> row index; the slice keeps the mapping alive, so a racing
            # close never tears it
            view_of = self._zero_copy
            if view_of is None:
                view_of = self._zero_copy_views()
            view = view_of(name)
            if view is not None:
                if not copy:
                    return view
                with memory_is_a_limit(self.path, name):
                    return components.copy_array(view)
        return self._read_numpy(name, copy=copy, dtype=dtype, threads=threads)

    def _zero_copy_views(self):
        """For read_numpy's hot path: name -> the object's zero-copy array when it is
        a plain view of the file's bytes (manifest_table.py), else None.  Made once,
        over the manifest's columns (kernels.ViewTable); no views when the manifest
        did not come that way, when verify asks for more per read, or when the
        source is not mapped."""
        view_of = _no_view
        # ClosedError after a close
        base = self._map_base() if self._view_of is not None else None
        if base is not None:
            view_of = self._manifest.specs.view_table(base).view
            self._require_open()  # a close while the table was made: not published
        self._zero_copy = view_of
        return view_of

    def _map_base(self):
        """The whole mapping as a uint8 array (read-only, or copy-on-write), for the
        views of read_numpy's hot path; None for unmapped sources."""
        self._require_open()
        if not self._source.mapped:
            return None
        return self._source.all_bytes()  # ClosedError after a close

    @_memory_is_a_limit
    def _read_numpy(self, name, *, copy=False, dtype=None, threads=None):
        if dtype is not None:  # checked once, before any object is read
            dtype = caller_dtype(dtype)
        if isinstance(name, list):  # as the reference: several names -> dict
            if copy and dtype is None:
                return batch.read_owned(self, name, threads)
            return {n: self.read_numpy(n, copy=copy, dtype=dtype) for n in name}
        if dtype is not None:
            return self._read_converted(name, dtype)
        view_of = self._view_of
        if view_of is not None and isinstance(name, str):
            # the common case over the manifest's columns: no spec is built
            found = view_of(name)
            if found is not None:
                storage, count, offset, shape = found
                arr = self._source.array(storage, count, offset, obj=name, component="data")
                if copy and self._source.mapped:
                    arr = components.copy_array(arr)
                return arr.reshape(shape)
        obj = self.metadata(name)
        if obj.format != "dense":  # foreign files too: a GGUF tensor may be gguf_blocks
            raise UnsupportedError(
                f"read_numpy reads dense objects; this one is {obj.format!r}, use read()",
                path=self.path,
                obj=name,
            )
        if self._foreign is not None:
            return self._foreign_numpy(obj, copy)
        plan = obj.plan
        if plan is None:
            plan = obj.plan = dense.view_plan(obj)
        if plan and not self._verify:
            # the common case, kept short: one view at an offset checked at open
            self._require_open()
            storage, count, offset = plan
            arr = self._source.array(storage, count, offset, obj=name, component="data")
            if copy and self._source.mapped:
                arr = components.copy_array(arr)
            return arr.reshape(obj.shape)
        comp = obj.components["data"]
        arr = self._component(obj, comp, copy)
        return logical.as_values(
            arr, comp.dtype, comp.type, path=self.path, obj=name, component=comp.role
        ).reshape(obj.shape)

    def _read_converted(self, name, dtype):
        obj = self.metadata(name)
        # the C decoders read a zTensor component's stored bits; another format's
        # tensors (no Source) convert from read_numpy's values like every other dtype
        zt = obj.format == "dense" and self._foreign is None
        comp = obj.components.get("data") if zt else None
        if comp is not None and dtype in (np.float32, np.float16):
            raw = self._component(obj, comp, False)
            if comp.dtype == "u8" and comp.type in dtypes.FP8_TYPES:
                return floats.fp8_to_float(raw, comp.type, dtype).reshape(obj.shape)
            if comp.dtype == "bf16":
                values = floats.bf16_to_float32(raw).reshape(obj.shape)
                return values if dtype == np.float32 else values.astype(dtype)
        return self.read_numpy(name).astype(dtype)

    @overload
    def read(self, name: str, *, copy: bool = ...) -> Tensor: ...

    @overload
    def read(self, name: List[str], *, copy: bool = ...) -> Dict[str, Tensor]: ...

    @_memory_is_a_limit
    def read(
        self, name: Union[str, List[str]], *, copy: bool = False
    ) -> Union[Tensor, Dict[str, Tensor]]:
        """Any object as a :class:`ztensor.Tensor` with every component as an array.

        Dense ``data`` has the object's shape; quantized_group components have their
        convention's shapes; other components are 1-D, holding the stored elements
        exactly (see :class:`ztensor.Tensor`).  A list of names gives a dict."""
        if isinstance(name, list):
            return {n: self.read(n, copy=copy) for n in name}
        obj = self.metadata(name)
        if self._foreign is not None:
            self._require_open()
            t = _clean_foreign_bools(obj, self._foreign.entries[name].load())
            if t.format != "dense":
                # the format's own rules, as for zTensor objects below: a GGUF tensor
                # is gguf_blocks, and what dequantize refuses (blocks that cannot hold
                # its shape) every read refuses, so verify reports it too
                formats.handler(t.format).assemble(obj, t.components, path=self.path)
            if copy:
                t = Tensor(
                    {r: np.array(a) for r, a in t.components.items()},
                    shape=t.shape,
                    format=t.format,
                    attributes=t.attributes,
                    types=t.types,
                )
            return t
        if obj.legacy is not None:  # a v0.1 sparse blob: lifted to v1.2 sparse components
            blob = self._component(obj, obj.components["data"], copy)
            arrays = legacy.assemble(obj, blob, path=self.path, obj=name)
            # the element rules for the values the blob holds (bool bytes 0 or 1)
            arrays["values"] = logical.as_elements(
                arrays["values"], obj.legacy[1], None, path=self.path, obj=name, component="values"
            )
            # bf16 values come back as their bits without ml_dtypes: the type says so,
            # as ObjectSpec.tensor_types says it for a v1.x object's components
            types = {"values": "bf16"} if obj.legacy[1] == "bf16" else None
            return Tensor(
                arrays, shape=obj.shape, format=obj.format, attributes=obj.attributes, types=types
            )
        arrays = {
            role: logical.as_elements(
                self._component(obj, comp, copy),
                comp.dtype,
                comp.type,
                path=self.path,
                obj=name,
                component=role,
            )
            for role, comp in obj.components.items()
        }
        arrays = formats.handler(obj.format).assemble(obj, arrays, path=self.path)
        return Tensor(
            arrays,
            shape=obj.shape,
            format=obj.format,
            attributes=obj.attributes,
            types=obj.tensor_types,
        )

    def read_sparse(self, name: str) -> Any:
        """A sparse_csr/sparse_coo object as a scipy.sparse array when scipy is
        installed, else as the checked :class:`ztensor.Tensor`."""
        obj = self.read(name)
        if obj.format not in ("sparse_csr", "sparse_coo"):
            raise UnsupportedError(
                f"{obj.format!r} is not a sparse format", path=self.path, obj=name
            )
        try:
            import scipy.sparse  # noqa: F401 - optional
        except ImportError:
            return obj
        return sparse.to_scipy(obj, path=self.path, obj=name)

    def verify(
        self,
        progress: Optional[Callable[[int, int], None]] = None,
        *,
        errors: Optional[List[Exception]] = None,
    ) -> int:
        """Check every object as a read would, one object at a time: every digest
        (over the stored bytes, or the decoded ones for v2), then the read itself
        (zstd streams decoded to their declared size, the format's rules: sparse
        indices, quantized_group and gguf_blocks attributes and component sizes,
        foreign files' tensors).  Memory stays at one object's decoded size.
        Returns how many digests matched.

        ``progress(bytes done, bytes total)`` is called after each object (totals:
        the objects' stored bytes).  ``errors``: a list that collects every
        problem (a :class:`ZTensorError` each, naming the object), instead of
        raising the first.

        Raises
        ------
        ChecksumError, FormatError, LimitError, UnsupportedError
            The first problem, unless ``errors`` collects them.
        """

        self._require_open()
        names = self._manifest.names()
        total = sum(self.metadata(n).stored_size for n in names)
        done = checked = 0
        for name in names:
            obj = self.metadata(name)
            try:
                matched = self.check_digests(name)
                self.read(name)  # what a read refuses; the result is dropped at once
                checked += matched
            except ZTensorError as exc:
                if errors is None:
                    raise
                errors.append(exc)
            done += obj.stored_size
            if progress is not None:
                progress(done, total)
        return checked

    def check_digests(self, name: str) -> int:
        """Check each digest of object ``name`` against its bytes (as stored, or as
        decoded for v2, whose digests name the content): a ChecksumError naming the
        object and component at the first mismatch.  Returns how many it checked
        (0 for another format's file, which has none).  :meth:`verify` does this and
        a read; ``Writer.copy_from`` does it before re-encoding an object, so that a
        fresh digest never vouches for bytes the old one refused."""
        self._require_open()
        obj = self.metadata(name)
        if self._source is None:  # another format: no digests
            return 0
        matched = 0
        for role, comp in obj.components.items():
            if comp.digest is None:
                continue
            where = {"path": self.path, "obj": name, "component": role}
            if comp.digest_over == "decoded":
                data = components.read_component(self._source, comp, limits=self._limits, **where)
                digests.verify(data.view(np.uint8), comp.digest, **where)
                del data
            else:
                stored = self._source.view(
                    comp.offset, comp.length, "component", obj=name, component=role
                )
                digests.verify(stored, comp.digest, **where)
            matched += 1
        return matched

    def _foreign_plain_view(self, name):
        """Another format's dense object of a plain storage dtype (no logical type,
        not bool or bf16: nothing for read_numpy to convert or check) as its reader
        hands it out: a view of the file where the format stores it plainly.  None
        for any other object."""
        self._require_open()
        obj = self._manifest.specs.get(name) if isinstance(name, str) else None
        if obj is None or obj.format != "dense":
            return None
        comp = obj.components["data"]
        if comp.type is not None or comp.dtype in dtypes.NOT_PLAIN_VIEWS:
            return None
        arr = self._foreign.entries[name].load().components["data"]
        return arr.reshape(obj.shape) if isinstance(arr, np.ndarray) else None

    def _foreign_numpy(self, obj, copy):
        self._require_open()
        comp = obj.components["data"]
        arr = self._foreign.entries[obj.name].load().components["data"]
        arr = logical.foreign_values(
            arr,
            comp.dtype,
            comp.type,
            path=self.path,
            obj=obj.name,
            component=comp.role,
        )
        if copy:
            arr = np.array(
                arr,
                dtype=arr.dtype.newbyteorder("=")
                if arr.dtype.itemsize > 1 and arr.dtype.kind not in "V"
                else arr.dtype,
                order="C",
            )
        return arr.reshape(obj.shape)

    # ------------------------------------------------------------ the reference's calls
    def read_tensors(
        self, names: List[str], *, copy: bool = False, threads: Optional[int] = None
    ) -> Dict[str, np.ndarray]:
        """name -> array for several dense objects (the reference's name for
        ``read_numpy(list)``)."""
        return self.read_numpy(list(names), copy=copy, threads=threads)

    @_memory_is_a_limit
    def read_torch(self, name: Any, *, copy: bool = False, device: Any = "cpu") -> Any:
        """A dense object as a ``torch.Tensor`` (a list of names gives a dict).

        bf16 and the float8 types come back as torch's own dtypes.  On the CPU, raw
        objects are zero-copy views of a private copy-on-write mapping unless
        ``copy``; with another ``device`` each tensor is moved there once."""
        if isinstance(name, list):
            return {n: self.read_torch(n, copy=copy, device=device) for n in name}
        # torch has no read-only tensors: views of the file need Reader(...,
        # copy_on_write=True) (ztensor.torch.load_file uses it); otherwise each
        # tensor gets its own memory
        return object_to_torch(self, name, copy=copy, device=device)

    @_memory_is_a_limit
    def read_into(self, name: Any, dst: Any = None, *, threads: Optional[int] = None) -> None:
        """Decode (or copy) a dense object straight into ``dst``: a numpy array or a
        torch tensor of the object's shape and element type (bf16/float8 as torch's
        dtypes, ml_dtypes' or their uint16/uint8 bits).  zstd data is decoded into
        ``dst``'s own memory when it is contiguous: no intermediate array.  A dict
        ``{name: dst}`` fills several, in ``threads`` threads (default: every core;
        copies and zstd decoding release the GIL).

        Raises TypeError without ``dst``; ValueError when its shape or dtype does not
        match the object, or two of its elements (or two destinations of a dict)
        share memory.  A tensor that
        requires grad (a parameter) is filled through its memory, as
        ``load_state_dict`` fills it."""
        if isinstance(name, dict):
            into.require_separate(name)
            order = sorted(
                name,
                key=lambda n: min(
                    (c.offset for c in self.metadata(n).components.values()), default=0
                ),
            )
            kernels.each(lambda n: into.read_into(self, n, name[n]), order, threads)
            return
        if dst is None:
            raise TypeError("read_into(name, dst): dst is required when name is a str")
        into.read_into(self, name, dst)

    def stored_bytes(self, name: str, role: str) -> memoryview:
        """The stored (possibly compressed) bytes of one component, as in the file."""
        self._require_open()
        if self._foreign is not None or self._source is None:  # another format: no Source
            raise UnsupportedError("stored bytes are a zTensor notion", path=self.path, obj=name)
        comp = self.metadata(name).components[role]
        components.require_local(comp, path=self.path, obj=name, component=role)
        return self._source.view(comp.offset, comp.length, "component", obj=name, component=role)

    def _count_undeclared(self, obj, comp, decoded):
        """A v0.1/v1.1 zstd component that declares no size (a sparse or quantized
        part; dense ones take theirs from the shape) is counted against
        ``max_total_decompressed`` once its size is known, that is once decoded: the
        open could only have counted the worst case (32768 times the stored bytes),
        which would refuse ordinary files.  Each part is counted once, however many
        reads (and threads) decode it; the spec is left as the file declares it."""
        key = (obj.name, comp.role)
        with self._count_lock:
            if key in self._undeclared_counted:
                return
            if self._decoded_total is None:  # first time: what the manifest declares
                self._decoded_total = sum(
                    c.uncompressed_length or 0
                    for n in self._manifest.names()
                    for c in self.metadata(n).components.values()
                    if c.encoding == "zstd"
                )
            total = self._decoded_total + decoded
            if total > self._limits.max_total_decompressed:
                raise LimitError(
                    f"total uncompressed size {total} exceeds the per-file "
                    f"limit of {self._limits.max_total_decompressed}",
                    path=self.path,
                    obj=obj.name,
                    component=comp.role,
                )
            self._decoded_total = total
            self._undeclared_counted.add(key)

    def _component(self, obj, comp, copy):
        self._require_open()
        arr = components.read_component(
            self._source,
            comp,
            verify=self._verify,
            limits=self._limits,
            path=self.path,
            obj=obj.name,
            component=comp.role,
        )
        if comp.encoding == "zstd" and comp.uncompressed_length is None:
            self._count_undeclared(obj, comp, arr.nbytes)
        if copy and not arr.dtype.isnative:
            return components.to_native(arr)
        if copy and comp.encoding == "raw" and self._source.mapped:
            return components.copy_array(arr)  # pread gave a fresh buffer already
        return arr  # a view, or freshly decoded zstd data (already owned)

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Release the file.  Safe to call twice, and while arrays are alive."""
        if not self._closed:
            self._closed = True
            self._zero_copy = None  # the mapping goes with the last view
            if self._source is not None:
                self._source.close()
            if self._foreign is not None:
                self._foreign.close()

    def _require_open(self):
        if self._closed:
            raise ClosedError("reader is closed", path=self.path)

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise refuse_copy(self, self.path)  # a copy's __del__ would close this file

    def __del__(self):
        # as open files do: an unclosed Reader is released, with a ResourceWarning
        if not getattr(self, "_closed", True):
            try:
                warnings.warn(f"unclosed {self!r}", ResourceWarning, stacklevel=2, source=self)
            except Exception:  # interpreter shutdown: the modules the text needs are gone
                pass
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self)} tensor(s)"
        kind = f"zt v{self.version}" if self._foreign is None else self.format
        return without_secrets(
            f"<ztensor.Reader {os.fspath(self.path)!r} [{kind}, {state}]>", os.fspath(self.path)
        )


def _clean_foreign_bools(obj, t):
    """Another format's tensor with its bool components' bytes made 0 or 1
    (io/values.clean_bools: a copy only where a byte is neither).  Those formats
    (safetensors, npy, torch.save, ...) store a framework's memory and say nothing
    of its bool bytes, which numpy and torch read as true when not zero; a zTensor
    file's bool bytes other than 0 or 1 are refused instead (its spec says 0x00
    and 0x01), docs/format-decisions.md."""
    bools = [
        r
        for r, c in obj.components.items()
        if logical.is_bool(c.dtype, c.type) and r in t.components
    ]
    if not bools:
        return t
    comps = dict(t.components)
    for role in bools:
        comps[role] = logical.clean_bools(np.asarray(comps[role]))
    return Tensor(comps, shape=t.shape, format=t.format, attributes=t.attributes, types=t.types)


# an index's weight_map comes early: Hugging Face and save_sharded write metadata first
_INDEX_HEAD = 1 << 16


def _is_index(source: Source, path: str) -> bool:
    """Whether a file that is not a zTensor file is a sharded checkpoint's index: its
    name ends in ``.index.json``, or it is JSON text (``{`` first) naming a
    ``weight_map`` in its first 64 KiB.  Only asked once the file failed to open, so
    a valid file is never read for it; a failure to read is a no."""
    if os.fspath(path).lower().endswith(".index.json"):
        return True
    try:
        head = bytes(source.view(0, min(_INDEX_HEAD, source.size), "header"))
    except (ZTensorError, OSError):
        return False
    return head.lstrip(b" \t\r\n").startswith(b"{") and b'"weight_map"' in head


def require_file_name(filename: Any, function: str, contents_loader: str) -> None:
    """The one rule for the framework loaders that take a file (``load_file``,
    ``load_model``): bytes, a bytearray or a memoryview is a TypeError pointing to
    ``contents_loader``, the loader of a file's contents.  Passed on to Reader they
    were read as a file's contents, so ``load_file(b"a.zt")`` said "<bytes>: file is
    truncated"; safetensors' ``load_file`` and the reference ztensor's take a name."""
    if isinstance(filename, (bytes, bytearray, memoryview)):
        raise TypeError(
            f"{function} takes a file name (str or os.PathLike), not "
            f"{type(filename).__name__}: a file's contents load with {contents_loader}(data)"
        )


def open_bytes(data: Any, **kwargs: Any) -> Reader:
    """A Reader over a file's bytes: zTensor, or safetensors (as ``safetensors``'
    ``load`` takes them); other formats are read from files."""
    view = memoryview(data).cast("B")
    if bytes(view[:4]) != spec.MAGIC_PREFIX and len(view) >= 9 and view[8] == ord("{"):
        import tempfile

        fd, path = tempfile.mkstemp(suffix=".safetensors")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(view)
            with named_as_bytes(path):  # errors name the caller's bytes, not our file
                reader = Reader(path, **kwargs)
        finally:
            os.unlink(path)  # the mapping keeps the bytes; nothing is left on disk
        reader.path = BYTES
        return reader
    # the checked view, not ``data``: an object that is bytes-like and file-like too
    # (an mmap.mmap, whose seek returns None) is read as the bytes it holds
    return Reader(view, **kwargs)
