"""``safe_open``: safetensors' lazy-loading API over a zTensor file.

>>> with ztensor.safe_open("model.zt", framework="np") as f:
...     f.keys(), f.metadata()
...     w = f.get_tensor("embed.weight")
...     rows = f.get_slice("embed.weight")[10:20]   # reads only those rows' bytes
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Tuple, Union

import numpy as np

from ztensor import _save, dtypes
from ztensor.attributes import show
from ztensor.container import checkpoint_keys as checkpoint
from ztensor.container.reader import Reader
from ztensor.errors import (
    ClosedError,
    LimitError,
    ObjectNotFoundError,
    SliceError,
    SliceRuntimeError,
    SliceTypeError,
    SliceValueError,
    UnsupportedError,
    memory_is_a_limit,
    refuse_copy,
)
from ztensor.foreign.safetensors_file import SafetensorsFile
from ztensor.formats import dense
from ztensor.frameworks import LazyModule
from ztensor.frameworks.staging import torch_device
from ztensor.frameworks.torch_bridge import (
    is_cpu,
    numpy_to_torch,
    numpy_to_torch_plain,
    object_to_torch,
)
from ztensor.io import components, seekable, values
from ztensor.io.source import is_url, pinned_file

if TYPE_CHECKING:
    import torch
else:
    torch = LazyModule("torch")

# safetensors' spellings of the frameworks it reads into -> ours ("np" or "pt"), and
# those it knows that ztensor does not read into (an UnsupportedError, not a typo's
# ValueError)
FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt", "pytorch": "pt"}
OTHER_FRAMEWORKS = ("tf", "tensorflow", "jax", "flax", "mlx", "paddle", "paddlepaddle")
# safetensors 0.8's backend= (safe_open, load_file, load_model): how tensor bytes
# are read -> Reader's mmap= (False: pread, arrays are copies)
BACKENDS = {"mmap": True, "pread": False}


def mapped_for_backend(backend: Any) -> bool:
    """Reader's ``mmap=`` for safetensors' ``backend=`` (``"mmap"`` or ``"pread"``):
    the one rule for that keyword in safe_open and ztensor.numpy/ztensor.torch's
    load functions.  Anything else is a TypeError or ValueError in safetensors'
    words."""
    if not isinstance(backend, str):
        raise TypeError(f"argument 'backend': '{type(backend).__name__}' is not a str")
    if backend not in BACKENDS:
        raise ValueError(f'backend "{backend}" is invalid (expected one of: "mmap", "pread")')
    return BACKENDS[backend]


class safe_open:  # noqa: N801 - the name safetensors users know
    """Open a zTensor file lazily, with safetensors' ``safe_open`` interface.

    Parameters
    ----------
    filename : str or os.PathLike
    framework : "np" or "pt"
        What ``get_tensor`` returns: numpy arrays, or torch tensors (torch needed);
        safetensors' other spellings ("numpy", "torch", "pytorch") too.  Its other
        frameworks (tf, jax, flax, mlx, paddle) are an UnsupportedError.
    device : str, int, torch.device or None
        torch device for ``framework="pt"`` (None: the CPU); one torch cannot use here
        is an UnsupportedError when the file is opened.  numpy arrays live on the
        CPU: ``framework="np"`` with another device is refused, as safetensors
        refuses it.
    storage_options : dict, optional
        fsspec's options for a URL's filesystem (credentials, endpoint), as
        :class:`ztensor.Reader` takes them.
    backend : "mmap" or "pread"
        safetensors 0.8's keyword: ``"pread"`` reads tensors with ``pread`` instead
        of mapping the file (``Reader(mmap=False)``: tensors are copies).
    """

    def __init__(
        self,
        filename: Union[str, "os.PathLike[str]"],
        framework: str = "np",
        device: str = "cpu",
        *,
        dequantize: bool = False,
        storage_options: Optional[Dict[str, Any]] = None,
        backend: str = "mmap",
    ) -> None:
        if isinstance(filename, (bytes, bytearray, memoryview)):
            # a Reader takes bytes as a file's contents: a bytes path read as one
            # was "not a zTensor file" (safetensors: a TypeError)
            raise TypeError(
                "safe_open takes a path (str or os.PathLike), not "
                f"{type(filename).__name__}: a file's bytes load with "
                "ztensor.numpy.load(data) or ztensor.torch.load(data)"
            )
        mapped = mapped_for_backend(backend)
        if framework in OTHER_FRAMEWORKS:
            raise UnsupportedError(
                f"framework {framework!r} is not one ztensor reads into: 'np' "
                "(numpy) or 'pt' (torch); convert from numpy arrays"
            )
        if framework not in FRAMEWORKS:
            raise ValueError(f"framework must be 'np' or 'pt', got {framework!r}")
        self._framework = FRAMEWORKS[framework]
        where = filename if isinstance(filename, (str, os.PathLike)) else None
        if self._framework == "pt":
            self._device: Any = torch_device(device, where)
        elif device is None or str(device).partition(":")[0] == "cpu":
            self._device = "cpu"
        else:  # numpy has no other device: silently giving CPU arrays hid the mistake
            raise UnsupportedError(
                f"device {device!r} is not supported for framework numpy (the CPU only)",
                path=where,
            )
        self._dequantize = dequantize
        self._checkpoint = None
        self._decoded: Dict[str, Any] = {}  # zstd components decoded for slices, by name
        self._tables: Dict[str, Any] = {}  # their seek tables (None: written without)
        try:
            self._reader = Reader(
                filename,
                copy_on_write=self._framework == "pt",
                mmap=mapped,
                storage_options=storage_options,
            )
        except FileNotFoundError:
            # safetensors' words, which name the path
            raise FileNotFoundError(f"No such file or directory: {os.fspath(filename)}") from None
        # what the slices read through: the Reader's source, verify, limits (reader.py)
        self._internals = self._reader.internals

    @property
    def reader(self) -> Reader:
        """The :class:`ztensor.Reader` under this handle (ztensor's own addition, not
        safetensors': ztensor.dask reads objects' specs through it)."""
        return self._reader

    def _open_reader(self) -> Reader:
        try:
            self._internals.require_open()
        except ClosedError:  # safetensors: the handle is unusable after `with`
            raise ClosedError(
                "the file was closed (safe_open is used after its with block)",
                path=self._reader.path,
            ) from None
        return self._reader

    def _entries(self):
        if self._checkpoint is None:
            self._checkpoint = checkpoint.entries(self._open_reader(), self._dequantize)
        return self._checkpoint

    def keys(self) -> List[str]:
        """Tensor names, sorted (by code point: the canonical order, which is also
        how safetensors' ``keys()`` sorts, whatever order a file's header lists
        them in); :meth:`offset_keys` gives the order of their bytes.  Quantized
        objects come under their GPTQ checkpoint names, or their own with
        ``dequantize=True`` (see ztensor/container/checkpoint_keys.py)."""
        self._open_reader()
        return _save.canonical_names(self._entries())

    def offset_keys(self) -> List[str]:
        """Object names in the order of their bytes in the file."""
        r = self._open_reader()
        return sorted(
            r.keys(),
            key=lambda n: min((c.offset for c in r.metadata(n).components.values()), default=0),
        )

    def metadata(self) -> Optional[Dict[str, Any]]:
        """safetensors' ``__metadata__``.  Of a ``.safetensors`` file, as safetensors
        gives it: None when the header has none (absent or null), else its dict, an
        empty one too.  Of any other file (zTensor's included), its attributes, or
        None when it has none: a zTensor file does not tell an empty map from none."""
        reader = self._open_reader()
        foreign = self._internals.foreign
        if isinstance(foreign, SafetensorsFile):
            declared = foreign.header_metadata
            return None if declared is None else dict(declared)
        return dict(reader.attributes) or None

    def get_tensor(self, name: str) -> Any:
        """The whole tensor ``name``: a dense object, a quantized object by its own
        name (dequantized), or one of its GPTQ checkpoint names (``.qweight``...)."""
        reader = self._open_reader()
        if name in reader and reader.metadata(name).format == "dense":
            if self._framework == "pt":
                return object_to_torch(reader, name, copy=False, device=self._device)
            return reader.read_numpy(name)
        arr = self._flat_array(name)
        if self._framework == "pt":
            return numpy_to_torch_plain(arr, self._device)
        return arr

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor :meth:`keys` lists, name -> :meth:`get_tensor` (safetensors
        0.8's call), in the order of their bytes in the file (:meth:`offset_keys`);
        a quantized object's checkpoint names follow, sorted."""
        names = self.keys()
        listed = set(names)
        order = [n for n in self.offset_keys() if n in listed]
        placed = set(order)
        order += [n for n in names if n not in placed]
        return {name: self.get_tensor(name) for name in order}

    def _flat_array(self, name: str) -> np.ndarray:
        """The numpy array of a name :meth:`keys` lists that is no dense object (a
        quantized object by its own name, dequantized; one of its GPTQ names), as
        ``get_tensor`` and ``get_slice`` hand it out."""
        reader = self._open_reader()
        if name in reader:
            if reader.metadata(name).format != "quantized_group":
                checkpoint.entries(reader)  # raises, naming the object and what to use
            return checkpoint.array(reader, name, None)
        target = self._entries().get(name)
        if target is None:
            raise ObjectNotFoundError("no such tensor", path=reader.path, obj=name)
        return checkpoint.array(reader, *target)

    def get_slice(self, name: str) -> Any:
        """A lazy handle: ``[...]`` reads only what the index selects (for raw objects
        the bytes of other rows are never touched).  Every name :meth:`keys` lists
        has one: a GPTQ name (``.qweight``...) or a dequantized weight is made
        whole, once, on first use, and sliced from memory."""
        reader = self._open_reader()
        if name in reader and reader.metadata(name).format != "quantized_group":
            return _Slice(  # a dense object; any other format refuses, naming itself
                name,
                reader,
                self._internals,
                framework=self._framework,
                device=self._device,
                decoded=self._decoded,
                tables=self._tables,
            )
        if name not in reader and name not in self._entries():
            raise ObjectNotFoundError("no such tensor", path=reader.path, obj=name)
        return _ArraySlice(
            name, lambda: self._flat_array(name), self._framework, self._device, reader.path
        )

    def close(self) -> None:
        self._decoded.clear()
        self._tables.clear()
        self._reader.close()

    def __enter__(self) -> "safe_open":
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise refuse_copy(self, self._reader.path)  # a copy would share, and close, the file

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False


class safe_open_handle(safe_open):  # noqa: N801 - named after safe_open
    """:class:`safe_open` for an open file handle, as safetensors'
    ``_safe_open_handle(f, framework, device)`` (the package exports it under that
    name too, for code written against safetensors): ``f`` is a file object with a
    descriptor and a name, as ``open(path, "rb")`` or ``open(path, "r")`` (text mode
    too) returns.  Everything after opening is :class:`safe_open`'s, for zTensor and
    every other format it reads (``.safetensors`` included).

    Like safetensors, the file is opened again by ``f.name``: ``f``'s mode and
    position are neither used nor changed, and closing ``f`` later does not affect
    this object.  Unlike safetensors, the name is first proven to still be ``f``'s
    file (same device and inode as ``f.fileno()``), so a file renamed, replaced
    or deleted since ``f`` was opened, or a relative name after a ``chdir``, is
    refused (UnsupportedError) rather than silently reading another file.

    Errors: a handle without a descriptor or a name (``io.BytesIO``, a socket
    wrapper, a file made from a bare descriptor) is an UnsupportedError (where
    safetensors raises AttributeError: every ztensor error is a ZTensorError); a
    closed handle is a ClosedError.  A zTensor file in a file-like object opens
    with ``ztensor.Reader(f)``; zTensor or safetensors bytes with ``ztensor.numpy.load(data)``.
    """

    def __init__(
        self, f: Any, framework: str = "np", device: str = "cpu", *, dequantize: bool = False
    ) -> None:
        name, device_id, inode = handle_file(f)
        # every descriptor opened by this name while the file is read is checked to
        # be f's file again: one swapped in after handle_file's check is refused
        with pinned_file(name, device_id, inode):
            super().__init__(name, framework, device, dequantize=dequantize)


def handle_file(f: Any) -> Tuple[str, int, int]:
    """The path of the file open in handle ``f``, proven to be that file (see
    :class:`safe_open_handle`), with the file's device and inode.  Whatever ``f``'s
    attributes raise becomes the UnsupportedError saying what is missing."""
    what = type(f).__name__
    hint = "a zTensor file in a file-like object opens with ztensor.Reader(f)"
    fileno = _attribute(f, "fileno")
    if not callable(fileno):
        raise UnsupportedError(
            f"safe_open_handle takes an open file (with fileno() and a "
            f"name, as open() returns), not a {what}: {hint}"
        )
    if _attribute(f, "closed") is True:
        raise ClosedError(f"the {what} handle is closed")
    try:
        fd = fileno()
    except Exception as exc:  # io.UnsupportedOperation (BytesIO), or whatever f raises
        raise UnsupportedError(
            f"the {what} handle has no file descriptor ({type(exc).__name__}): {hint}"
        ) from None
    try:
        name = _attribute(f, "name")
        name = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else None
    except Exception:  # a PathLike whose __fspath__ fails, or returns no path
        name = None
    if type(fd) is not int or fd < 0 or not name:
        raise UnsupportedError(
            f"the {what} handle has no file name (descriptor {show(fd)}, "
            f"name {show(_attribute(f, 'name'))}): safe_open_handle "
            "opens the file by its name, as safetensors does"
        )
    try:
        held, named = os.fstat(fd), os.stat(name)
        same = (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)
    except (OSError, ValueError):  # ValueError: a NUL in the name
        same = False
    if not same:
        raise UnsupportedError(
            "this name no longer leads to the handle's file (renamed, "
            "replaced or deleted since it was opened, or a relative name "
            "after a change of directory)",
            path=name,
        )
    if is_url(name):  # a local file under a folder named "http:": never read as a URL
        name = os.path.abspath(name)
    return name, held.st_dev, held.st_ino


# safetensors' own spelling, which code written against it imports from here and from
# the package (docs/migrating.md)
_safe_open_handle = safe_open_handle


def _attribute(f: Any, attr: str) -> Any:
    try:
        return getattr(f, attr, None)
    except Exception:  # a property that raises: the handle has no usable one
        return None


class _Slice:
    """safe_open.get_slice's handle.  It is given what it reads with explicitly: the
    Reader and its internals, the framework and device to return, and the handle's
    caches (``decoded``: zstd components decoded once per handle, and another
    format's tensors that it makes whole on every read; ``tables``: the zstd
    components' seek tables), shared by every slice of one safe_open."""

    def __init__(self, name, reader, internals, *, framework, device, decoded, tables):
        self._name = name
        self._reader = reader
        self._internals = internals
        self._framework = framework
        self._device = device
        self._decoded = decoded
        self._tables = tables
        self._meta = reader.metadata(name)
        if self._meta.format != "dense":
            raise UnsupportedError(
                f"get_slice reads dense objects, this one is {self._meta.format!r}",
                path=reader.path,
                obj=name,
            )

    def get_shape(self) -> List[int]:
        return list(self._meta.shape)

    def get_dtype(self) -> str:
        key = self._meta.type or self._meta.storage_dtype
        return dtypes.SAFETENSORS_NAMES.get(key, key.upper())

    def __getitem__(self, index: Any) -> Any:
        with memory_is_a_limit(self._reader.path, self._name):
            return self._get(index)

    def _get(self, index: Any) -> Any:
        if self._framework == "pt":
            return self._torch_get(index)
        return self._read(_selection(index, self._meta.shape, self._name, self._reader.path))

    def _read(self, selection):
        """The numpy values ``selection`` (a checked numpy index) picks, reading only
        the rows its first index spans where the source allows."""
        part = self._rows_only(selection)
        if part is None:
            part = self._frames_only(selection)
        if part is None:
            part = self._selected(selection)
        return part

    def _torch_get(self, index: Any) -> Any:
        """``index`` applied as torch applies it (safetensors' pt slices are torch
        indexing): led by an integer or a slice, only the rows it spans are read and
        the rest of the index applied to them; any other index is applied to the
        whole tensor (a view of a mapped file: only what it selects is touched)."""
        path = self._reader.path
        span = _torch_row_span(index, tuple(self._meta.shape), self._name, path)
        if span is None:
            block = object_to_torch(self._reader, self._name, copy=False, device="cpu")
            local = index
        else:
            start, end, local = span
            block = numpy_to_torch(self._read((slice(start, end),)), self._meta, "cpu", path)
        return _torch_placed(_torch_indexed(block, local, self._name, path), self._device)

    def _selected(self, selection):
        """The selection of the stored elements (a view of a raw component; a zstd
        component decoded and kept until another tensor is sliced), converted afterwards: bf16/FP8
        without ml_dtypes decode only the selected elements."""

        reader = self._reader
        if self._internals.foreign is not None:  # other formats: their own reading
            return self._foreign_selected(selection)
        comp = self._meta.components["data"]
        stored = self._decoded.get(self._name)
        if stored is None:
            stored = self._internals.component(self._meta, comp, False)
            if comp.encoding != "raw":
                # decoded once for the slices of one tensor (docs/remote.md), and one
                # kept: slicing every tensor of a file in turn (tensor parallel) held
                # them all decoded, 6 x 256 MiB for 192 KiB asked of a 50 KB file
                self._decoded.clear()
                self._decoded[self._name] = stored
        where = {"path": reader.path, "obj": self._name, "component": "data"}
        if values.is_bool(comp.dtype, comp.type):
            # the bool rule (bytes 0 and 1) is checked on the elements returned, so a
            # slice of a large bool tensor costs the slice, not a scan of the whole
            chosen = np.array(stored.reshape(self._meta.shape)[selection])
            return values.as_values(chosen, comp.dtype, comp.type, **where)
        elements = values.as_elements(stored, comp.dtype, comp.type, **where).reshape(
            self._meta.shape
        )
        return values.as_values(np.array(elements[selection]), comp.dtype, comp.type, **where)

    def _foreign_selected(self, selection):
        """Another format's selection, at the cost its entry states
        (ztensor/foreign/base.py ``Entry``): where the format reads rows (an HDF5
        hyperslab), the rows the first index spans; where every load makes the
        whole tensor anew (a deflated ``.npz`` member), the tensor made once and kept
        until the handle slices another (memory: one tensor, what ``get_tensor``
        hands out); else its reader's view, selected."""
        entry = self._internals.foreign.entries[self._name]
        shape = self._meta.shape
        first = selection[0] if selection else slice(None)
        if entry.read_rows is not None and shape:
            if isinstance(first, (int, slice)):
                start, end, local = _row_span(first, shape[0])
            else:  # an empty index array: no rows
                start, end, local = 0, 0, first
            self._internals.require_open()
            comp = self._meta.components["data"]
            where = {"path": self._reader.path, "obj": self._name, "component": "data"}
            block = values.foreign_values(
                entry.read_rows(start, end), comp.dtype, comp.type, **where
            )
            return np.array(block[(local,) + tuple(selection[1:])])
        whole = self._decoded.get(self._name)
        if whole is None:
            whole = self._reader.read_numpy(self._name)
            if entry.whole:
                # one kept: a loader slicing every tensor in turn (tensor parallel)
                # holds one decoded member, not the whole file decoded
                self._decoded.clear()
                self._decoded[self._name] = whole
        return np.array(whole[selection])

    def _frames_only(self, selection):
        """For a zstd component written with a seek table (ztensor/io/seekable.py): the
        rows the selection's first index spans, decoding only the frames that hold
        them.  None where that does not apply (no table, digests checked on every
        read, another format, a selection not led by an integer or a slice)."""

        reader, internals = self._reader, self._internals
        shape, comp = self._meta.shape, self._meta.components.get("data")
        if (
            internals.foreign is not None
            or internals.verify
            or not shape
            or not shape[0]
            or not selection
            or comp is None
            or comp.encoding != "zstd"
            or self._name in self._decoded
            or not isinstance(selection[0], (int, slice))
        ):
            return None
        where = {"path": reader.path, "obj": self._name, "component": "data"}
        components.require_readable(comp, **where)  # as every read: shards, v2 types
        tables = self._tables
        if self._name not in tables:
            tables[self._name] = seekable.read_seek_table(
                internals.source, comp, path=reader.path, obj=self._name, component="data"
            )
        table = tables[self._name]
        if table is None:
            return None
        start, end, local = _row_span(selection[0], shape[0])
        if end == start:
            return None
        row_bytes = comp.uncompressed_length // shape[0]
        data, at = seekable.decode_range(
            internals.source,
            comp,
            table,
            start * row_bytes,
            end * row_bytes,
            internals.limits,
            path=reader.path,
            obj=self._name,
            component="data",
        )
        stored = np.frombuffer(
            data,
            components.storage_dtype(comp),
            (end - start) * row_bytes // components.storage_dtype(comp).itemsize,
            at,
        )
        elements = values.as_elements(stored, comp.dtype, comp.type, **where)
        block = elements.reshape((end - start,) + tuple(shape[1:]))
        return values.as_values(
            np.array(block[(local,) + tuple(selection[1:])]), comp.dtype, comp.type, **where
        )

    def _rows_only(self, selection):
        """On a source that is not mapped (a URL, a file object, mmap=False), the rows
        the selection's first index spans, read as one range; None where the whole
        component is read instead (mapped sources, where views already touch only
        the rows; compressed or converted data)."""

        source = self._internals.source
        shape = self._meta.shape
        if source is None or source.mapped or not shape or not selection:
            return None
        plan = dense.view_plan(self._meta)
        first = selection[0]
        if not plan or not isinstance(first, (int, slice)):
            return None
        start, end, local = _row_span(first, shape[0])
        storage, _, offset = plan
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * storage.itemsize
        stored = source.view(
            offset + start * row_bytes,
            (end - start) * row_bytes,
            "component",
            obj=self._name,
            component="data",
        )
        block = np.frombuffer(stored, storage).reshape((end - start,) + tuple(shape[1:]))
        return np.array(block[(local,) + tuple(selection[1:])])


class _ArraySlice:
    """get_slice's handle on a name whose tensor is made, not stored (GPTQ names, a
    dequantized weight): the array is made once, on first use, and every index is
    checked by the same rules as a stored tensor's (:func:`_selection`)."""

    def __init__(self, name, make, framework, device, path):
        self._name, self._make, self._array, self._tensor = name, make, None, None
        self._framework, self._device, self._path = framework, device, path

    def _whole(self) -> np.ndarray:
        if self._array is None:
            self._array = self._make()
        return self._array

    def get_shape(self) -> List[int]:
        return list(self._whole().shape)

    def get_dtype(self) -> str:
        storage, ltype = dtypes.spec_types_for(self._whole().dtype) or ("?", None)
        key = ltype or storage
        return dtypes.SAFETENSORS_NAMES.get(key, key.upper())

    def __getitem__(self, index: Any) -> Any:
        whole = self._whole()
        if self._framework == "pt":  # torch's indexing, as for a stored tensor
            if self._tensor is None:
                self._tensor = numpy_to_torch_plain(whole, "cpu")
            part = _torch_indexed(self._tensor, index, self._name, self._path)
            return _torch_placed(part, self._device)
        return np.array(whole[_selection(index, whole.shape, self._name, self._path)])


def _row_span(first, rows):
    """(start, end, index within the block) of the rows a leading int or slice
    spans: [start, end) is the block to read, the index selects from it."""
    if isinstance(first, int):
        start = first + rows if first < 0 else first
        return start, start + 1, 0
    start, stop, step = first.indices(rows)
    count = len(range(start, stop, step))
    end = start + (count - 1) * step + 1 if count else start
    return start, end, slice(0, end - start, step)


# what an index torch applies without allocating may hold besides its leading
# integer or slice (a bool is no integer here: torch reads True as a new axis)
def _is_int(item) -> bool:
    return isinstance(item, (int, np.integer)) and not isinstance(item, bool)


def _torch_row_span(index, shape, name, path):
    """``(start, end, index into those rows)`` for a pt get_slice index led by an
    integer or a slice, the rest integers, slices, ``None`` and ``...`` (what torch
    applies as a view): the rows to read, and the index that picks from them what
    ``index`` picks from the whole.  None for any other index (lists, masks,
    tensors, a list given without a tuple, which torch reads by its own older
    rules): it is applied to the whole tensor.

    The index is first applied by torch itself to a tensor of ``shape`` holding
    one element (every stride 0: nothing is allocated), so what torch refuses is
    refused, with torch's own words and builtin (:func:`_torch_indexed`), before
    a byte is read."""
    items = index if isinstance(index, tuple) else (index,)
    if (
        not shape
        or not items
        or not (_is_int(items[0]) or isinstance(items[0], slice))
        or not all(
            _is_int(i) or isinstance(i, slice) or i is None or i is Ellipsis for i in items[1:]
        )
    ):
        return None
    _torch_applied(torch.zeros((), dtype=torch.uint8).expand(shape), items, name, path)
    # checked by torch: an integer in range, a slice of positive step, whose bounds
    # torch clamps as Python's slice.indices does
    first = items[0] if isinstance(items[0], slice) else int(items[0])
    start, end, local = _row_span(first, shape[0])
    return start, end, (local,) + items[1:]


def _torch_indexed(block, index, name, path):
    """``block[index]`` by torch's rules (:func:`_torch_applied`), a tensor of its
    own: a view (of a mapped file, or of the rows read for it) is copied, only what
    it shows."""
    part = _torch_applied(block, index, name, path)
    if part.untyped_storage().data_ptr() == block.untyped_storage().data_ptr():
        with memory_is_a_limit(path, name):
            part = part.clone(memory_format=torch.contiguous_format)
    return part


def _torch_applied(block, index, name, path):
    """``block[index]`` as torch gives it.  What torch refuses is the SliceError
    that is also the builtin torch raised, in torch's words (safetensors' pt
    get_slice raises torch's own); memory torch cannot allocate is a LimitError."""
    index = _bounded_steps(index, max(block.shape, default=1))
    try:
        with memory_is_a_limit(path, name):
            part = block[index]
    except IndexError as exc:
        raise SliceError(str(exc), path=path, obj=name) from None
    except TypeError as exc:
        raise SliceTypeError(str(exc), path=path, obj=name) from None
    except ValueError as exc:
        raise SliceValueError(str(exc), path=path, obj=name) from None
    except RuntimeError as exc:
        if "allocate" in str(exc):  # torch's CPU allocator: not a MemoryError
            raise LimitError("not enough memory for this read", path=path, obj=name) from None
        raise SliceRuntimeError(str(exc), path=path, obj=name) from None
    return part


def _bounded_steps(index, most):
    """``index`` with each slice's step past ``most`` (the largest dimension) made
    ``most``: the same selection (a step at least a dimension's size picks its first
    element only, whatever it is), which torch computes without overflow.  A
    step near 2**63 overflowed torch's stride arithmetic: a wrong shape, an error
    naming negative strides, or a tensor whose ``tolist()`` raised SystemError."""

    def bounded(item):
        if isinstance(item, slice) and _is_int(item.step) and item.step > most:
            return slice(item.start, item.stop, max(int(most), 1))
        return item

    if isinstance(index, tuple):
        return tuple(bounded(item) for item in index)
    return bounded(index)


def _torch_placed(part, device):
    """A slice made on the CPU, on the caller's device."""
    return part if is_cpu(device) else part.to(device)


def _render(index) -> str:
    def one(i):
        if isinstance(i, slice):
            text = (
                ("" if i.start is None else str(i.start))
                + ":"
                + ("" if i.stop is None else str(i.stop))
            )
            return text + (f":{i.step}" if i.step is not None else "")
        return repr(i)

    return "[" + ", ".join(one(i) for i in index) + "]"


def _selection(index: Any, shape, name, path):
    """A numpy index for a safetensors-style slice, checked first: integers and
    slices (step 1 or more) per dimension, ``...``, an empty list; every bound
    inside the shape.  Errors are SafetensorError with safetensors' words."""
    items = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in items):
        at = items.index(Ellipsis)
        fill = len(shape) - (len(items) - 1)
        items = items[:at] + (slice(None),) * max(fill, 0) + items[at + 1 :]
    if len(items) > len(shape):
        raise _slice_error(
            f"Error during slicing {_render(items)} with shape "
            f"{list(shape)}: too many indices ({len(items)} for {len(shape)} "
            "dimensions)",
            name,
            path,
        )
    out: List[Any] = []  # per dimension: an int, a slice or an empty index array
    for dim, item in enumerate(items):
        size = shape[dim]
        if isinstance(item, list):
            if item:
                raise _slice_error("Non empty lists are not implemented", name, path)
            out.append(np.array([], dtype=np.intp))
            continue
        # True and False are the integers 1 and 0 here, as safetensors' numpy slices
        # take them (a Python bool is an int; numpy's bool_ is refused there too)
        if isinstance(item, (int, np.integer)):
            i = int(item)
            if i < -size:
                raise _slice_error(
                    f"Invalid index {i} for dimension {dim} of size {size}", name, path
                )
            if i >= size:
                raise _slice_error(
                    f"Error during slicing {_render(items)} with shape "
                    f"{list(shape)}: index {i} out of bounds for tensor "
                    f"dimension #{dim} of size {size}",
                    name,
                    path,
                )
            out.append(i)
            continue
        if isinstance(item, slice):
            step = item.step
            # a numpy integer is an integer here as in a bound (and as safetensors
            # takes it), and so is a bool: True is step 1, False step 0 (refused)
            if step is not None and (not isinstance(step, (int, np.integer)) or step < 1):
                raise _slice_error(
                    f"Error during slicing {_render(items)} with shape "
                    f"{list(shape)}: step {item.step!r} is not a positive "
                    "integer",
                    name,
                    path,
                )
            for bound in (item.start, item.stop):
                if bound is not None and not isinstance(bound, (int, np.integer)):
                    raise _slice_error(
                        f"Error during slicing {_render(items)}: slice bounds must be integers",
                        name,
                        path,
                    )
                if bound is not None and bound < -size:
                    raise _slice_error(
                        f"Invalid index {bound} for dimension {dim} of size {size}", name, path
                    )
            if item.stop is not None and item.stop > size:
                raise _slice_error(
                    f"Error during slicing {_render(items)} with shape "
                    f"{list(shape)}: index {item.stop - 1} out of bounds for "
                    f"tensor dimension #{dim} of size {size}",
                    name,
                    path,
                )
            out.append(item)
            continue
        raise _slice_error(
            f"Error during slicing {_render(items)}: unsupported index {type(item).__name__}",
            name,
            path,
        )
    return tuple(out)


def _slice_error(message, name, path):
    return SliceError(message, path=path, obj=name)
