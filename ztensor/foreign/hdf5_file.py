"""HDF5 (``.h5``/``.hdf5``) through h5py (optional): every numeric dataset, named
by its path with ``/`` turned into ``.`` (``layer1/weight`` -> ``layer1.weight``,
the reference implementation's names, which are also state-dict names).  Datasets are read when
asked for; their shape and dtype come from the file's metadata.  Datasets of a type
zTensor has no dtype for (strings, compounds, references, long doubles) and empty
ones (a null dataspace, ``h5py.Empty``) are listed,
by HDF5 path, in the ``hdf5_skipped_datasets`` attribute.  The file's scalar
attributes that are plain values (text, bytes, an integer, a float, a bool) become
attributes (``hdf5.<name>``); the names of the others (arrays, compounds, references,
complex numbers, long doubles, ones h5py cannot read) are listed in the
``hdf5_skipped_attributes`` attribute.  Attributes of datasets and groups below the
root are not read; each is listed, as ``/path@name``, in the
``hdf5_unread_attributes`` attribute.

Containment: a model file's tensors come from its own bytes.  HDF5 can point
elsewhere, and by default every such dataset is refused (FormatError naming it):

* **external storage** (``H5Pset_external``): the raw data lives in other files,
  named by any path, ``/etc/passwd`` or ``../secret`` alike;
* **virtual datasets**: the data is mapped from datasets of other HDF5 files;
* **external links** are never followed (the walk, :func:`_datasets`, follows only
  hard links), and neither are soft links: both are listed, by HDF5 path, in the
  ``hdf5_skipped_links`` attribute, so no name goes unsaid.

Every name a dataset has through hard links is a tensor; a group reached through
two hard links (an alias, a cycle) is refused (:func:`_datasets`).

h5py is handed the file object opened by :func:`ztensor.io.source.open_local_input`,
not the path: the file checked (a regular file, not a FIFO or device) is the file read.

Size: a dataset's declared shape costs nothing to write (unallocated chunks read as
the fill value; a compressed chunk expands), and h5py allocates the whole shape
before reading.  So a dataset may declare at most ``MAX_EXPANSION`` times the bytes
its storage really holds (and always ``SMALL`` bytes), and at most the Limits'
``max_component_size``; its chunk likewise.  A chunk is decoded whole to read any
element of it, so a compressed chunk may hold at most the dataset's bytes or
``MAX_CHUNK`` (64 MiB), whichever is more; otherwise reading that dataset is a
LimitError before anything is allocated (the file's other datasets stay readable).
What the datasets say they store adds up to at most the file's size
(:class:`_Storage`): a chunk index may name one chunk many times.  A part of a
dataset (``safe_open.get_slice``, a ``ztensor.dask`` chunk) reads only the chunks
holding its rows (:func:`_entry`).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError, ZTensorError
from ztensor.foreign.base import Entry, ForeignFile, optional_import
from ztensor.foreign.names import NameTable
from ztensor.io.source import ShrinkCheckedFile, open_local_input
from ztensor.objects import ComponentSpec, ObjectSpec, shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals, check_visits
from ztensor.tensor import Tensor

MAX_DATASETS = 1_000_000
# a dataset may declare this many times the bytes its storage holds: deflate, HDF5's
# own compressor, expands at most about 1,032 times; zstd's ceiling (the one .zt
# files get, docs/safety.md) is 32,768
MAX_EXPANSION = 32_768
# below this a dataset may declare what it likes: a small fill-value dataset is cheap
SMALL = 1 << 20
# a chunk is decoded whole to read any element of it, so a 40-byte dataset with a
# 1 GiB chunk cost 1 GiB and seconds to read: a chunk may hold at most the dataset's
# bytes or this, whichever is more (h5py's own chunks are at most 1 MiB; a chunk
# larger than its dataset only has room for a dataset that grows later)
MAX_CHUNK = 64 << 20
# the file attribute listing the datasets (by HDF5 path) that hold no tensor zTensor
# has a dtype for: strings, compounds, references, long doubles (outside ``hdf5.``,
# where the file's own attributes are, so no attribute of the file can take its place)
SKIPPED = "hdf5_skipped_datasets"
SKIPPED_LINKS = "hdf5_skipped_links"  # soft and external links, not followed
SKIPPED_ATTRIBUTES = "hdf5_skipped_attributes"  # the file's attributes that are not plain
# the attributes of datasets and groups below the root, not read ("/path@name")
UNREAD_ATTRIBUTES = "hdf5_unread_attributes"


def open_file(
    path, limits: Limits = DEFAULT_LIMITS, *, unsafe_allow_external: bool = False
) -> ForeignFile:
    """Open the HDF5 file at ``path`` within ``limits``.

    ``unsafe_allow_external=True`` reads datasets whose data lives outside the file
    (external raw storage, virtual datasets), resolved by HDF5 from the file's
    path and the process's working directory.  UNSAFE for files you did not make:
    such a file reads any local file the process can, as a tensor.  With it the file
    is opened by path (HDF5 needs the name to resolve relative references), so the
    regular-file check is not bound to the descriptor h5py reads."""
    name = os.fspath(path)
    h5py = optional_import("h5py", "reading HDF5 files", name)
    # h5py pads a short read with zeros: a file that shrinks while open must be an
    # error, not wrong values
    raw = ShrinkCheckedFile(open_local_input(name), name)
    try:
        if unsafe_allow_external:
            raw.close()
            handle = h5py.File(name, "r")
        else:
            handle = h5py.File(raw, "r")
    except (OSError, ValueError, RuntimeError) as exc:
        raw.close()
        raise FormatError(f"not a readable HDF5 file: {exc}", path=name) from None
    except BaseException:
        raw.close()
        raise

    def close():
        try:
            handle.close()
        finally:
            raw.close()

    try:
        entries, skipped, links, unread = _entries(
            h5py, handle, name, limits, unsafe_allow_external, raw.size
        )
        kept, skipped_attributes = _plain_attrs(handle, name)
        attributes = {f"hdf5.{k}": v for k, v in kept}
        if skipped_attributes:  # said, not dropped without a word
            attributes[SKIPPED_ATTRIBUTES] = skipped_attributes
        if skipped:  # said, not dropped without a word (as ONNX's skipped initializers)
            attributes[SKIPPED] = skipped
        if links:
            attributes[SKIPPED_LINKS] = links
        if unread:  # said, not dropped without a word
            attributes[UNREAD_ATTRIBUTES] = unread
    except BaseException:
        close()
        raise
    return ForeignFile(name, "hdf5", attributes, entries, closer=close)


def _entries(h5py, handle, name, limits, allow_external, file_size):
    bound = min(MAX_DATASETS, limits.max_objects)
    try:
        found, links, unread = _datasets(h5py, handle, name, bound)
    except ZTensorError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        # TypeError: h5py's ObjectID.__hash__ says "cannot be hashed" when a damaged
        # file's object header cannot be read (its RuntimeError chained under it)
        raise FormatError(f"cannot walk the file's groups: {exc}", path=name) from None
    if len(found) + len(links) > MAX_DATASETS:
        raise LimitError(f"more than {MAX_DATASETS} datasets and links", path=name)
    # each link not followed is named too (the hdf5_skipped_links attribute): an object
    check_file_totals(name, limits, len(found) + len(links))
    names = NameTable(name, "dataset")
    entries = {}
    skipped = []
    storage = _Storage(name, file_size)
    # a dataset has a name per hard link, each a tensor read on its own: the bytes a
    # read of them all visits are held by the one rule for bytes read under many names
    # (spec.check_visits), each dataset's bytes counted once (2,000 links to one
    # 16 MiB dataset, a 17 MB file, made ``stats`` read 32 GiB)
    visited = decoded = present = 0
    counted: set = set()  # ObjectIDs compare equal for one object in the file
    for key, dataset in found:
        found_spec = _spec(name, key, dataset, limits, allow_external, storage)
        if found_spec is _NOT_A_TENSOR:
            skipped.append("/" + key)
            continue
        spec, chunks = found_spec
        nbytes = spec.components["data"].length
        visited += nbytes
        if dataset.id not in counted:
            counted.add(dataset.id)
            decoded += nbytes
            present += int(dataset.id.get_storage_size())
        dotted = names.claim(key.replace("/", "."), "/" + key)
        spec.name = dotted
        entries[dotted] = _entry(name, dotted, dataset, spec, chunks)
    check_visits(name, visited, decoded, present, limits)
    return entries, skipped, links, unread


def _datasets(h5py, handle, path, bound):
    """((HDF5 path, dataset) for every name a dataset has through hard links, in
    h5py's order (depth first, each group's links by name); the HDF5 paths of the
    soft and external links not followed; ``/path@name`` of each attribute of the
    datasets and groups, at most ``bound + 1``), and no more than ``bound + 1`` of
    the first two together (the walk stops there).

    A dataset may have several names (``f["b"] = f["a"]``): each is a tensor, as a
    ``torch.save`` of tied weights gives each name (h5py's ``visititems`` visits an
    object once, so every name but the first was dropped without a word).  A group
    reached by a second hard link (an alias, or a link to an ancestor: a cycle) is a
    FormatError naming both paths: following it would give every dataset below it
    again (2**depth names from a chain of aliases), and skipping it would drop them.
    Soft and external links are not followed (module doc).  Work follows the links
    the file holds: each group is entered once."""
    found = []
    not_followed = []
    unread = []  # the attributes of datasets and groups below the root: "/path@name"
    groups = {handle.id: "/"}  # ObjectIDs compare equal for one object in the file
    stack = [("", iter(handle), handle)]
    while stack:
        prefix, links, group = stack[-1]
        key = next(links, None)
        if key is None:
            stack.pop()
            continue
        if not isinstance(group.get(key, getlink=True), h5py.HardLink):
            not_followed.append("/" + prefix + key)
            if len(found) + len(not_followed) > bound:
                break
            continue
        item = group[key]
        full = prefix + key
        if len(unread) <= bound:
            try:
                unread.extend(f"/{full}@{a}" for a in item.attrs.keys())
            except (OSError, RuntimeError, ValueError, KeyError):
                unread.append(f"/{full}@(attributes h5py cannot read)")
        if isinstance(item, h5py.Dataset):
            found.append((full, item))
            if len(found) + len(not_followed) > bound:
                break  # no work beyond the bound: the caller refuses the file
        elif isinstance(item, h5py.Group):
            first = groups.setdefault(item.id, "/" + full)
            if first != "/" + full:
                raise FormatError(
                    f"group /{full[:200]} is group {first[:200]} again (a second hard "
                    "link: its datasets would each have two names); refused",
                    path=path,
                )
            stack.append((full + "/", iter(item), item))
    return found, not_followed, unread[: bound + 1]


# what _spec returns for a dataset whose element type zTensor has no dtype for
_NOT_A_TENSOR = object()


class _Storage:
    """The bytes the file's datasets say they store, against the file's size.

    A dataset's storage size is what its chunk index adds up, and HDF5 does not
    check that two index entries name distinct bytes: one compressed chunk named by
    64 entries counted 64 times, so a 7.5 KB file declared (and read as) 256 MB,
    past ``MAX_EXPANSION`` times its bytes, and with more entries up to
    ``max_component_size``.  Stored bytes are bytes of the file, each dataset's
    once (a second hard link to a dataset is the same storage), so together they
    are at most the file's size."""

    def __init__(self, path, file_size):
        self.path, self.left = path, file_size
        self.seen: set = set()

    def claim(self, key, dataset_id, stored) -> None:
        if dataset_id in self.seen:
            return
        self.seen.add(dataset_id)
        self.left -= stored
        if self.left < 0:
            raise FormatError(
                f"the datasets store more bytes than the file holds (at this one, "
                f"{stored} bytes): their chunk index names some bytes more than once",
                path=self.path,
                obj=key,
            )


def _spec(path, key, dataset, limits, allow_external, storage):
    try:
        dtype = dataset.dtype
        if dataset.shape is None:  # a null dataspace (h5py.Empty): holds no tensor,
            return _NOT_A_TENSOR  # listed in SKIPPED like the other types, not dropped
        shape = tuple(int(d) for d in dataset.shape)
        external = dataset.external
        virtual = dataset.is_virtual
        chunks = dataset.chunks
        stored = int(dataset.id.get_storage_size())
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        raise FormatError(f"cannot read the dataset's header: {exc}", path=path, obj=key) from None
    if not allow_external:
        if external:
            files = ", ".join(repr(os.fsdecode(f[0])) for f in external[:3])
            raise FormatError(
                f"the dataset's data is stored outside the file ({files}); "
                "refused: a tensor file is read from its own bytes",
                path=path,
                obj=key,
            )
        if virtual:
            sources = sorted({repr(m.file_name) for m in dataset.virtual_sources()[:3]})
            raise FormatError(
                f"a virtual dataset (data mapped from {', '.join(sources)}); "
                "refused: a tensor file is read from its own bytes",
                path=path,
                obj=key,
            )
    if not allow_external:  # external storage is not the file's: its size says nothing
        storage.claim(key, dataset.id, stored)
    found = dtypes.spec_types_for(dtype) if dtype.kind in "biufc" else None
    if found is None:  # strings, compounds, references, long doubles: listed in SKIPPED
        return _NOT_A_TENSOR
    if len(shape) > limits.max_rank:
        raise LimitError(
            f"rank {len(shape)} exceeds the limit {limits.max_rank}", path=path, obj=key
        )
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise FormatError(problem, path=path, obj=key)
    nbytes = math.prod(shape) * dtype.itemsize
    _check_size(path, key, "the dataset", nbytes, stored, limits, allow_external)
    if chunks is not None:
        chunk_bytes = math.prod(chunks) * dtype.itemsize
        _check_size(path, key, "one chunk", chunk_bytes, stored, limits, allow_external)
    storage, ltype = found
    spec = ObjectSpec(
        key, shape, "dense", {}, {"data": ComponentSpec("data", storage, ltype, 0, nbytes)}
    )
    return spec, chunks


def _check_size(path, key, what, nbytes, stored, limits, allow_external):
    """``nbytes`` declared for ``what`` against the limits and the bytes stored."""
    if nbytes > limits.max_component_size:
        raise LimitError(
            f"{what} declares {nbytes} bytes, above the limit "
            f"{limits.max_component_size} (max_component_size)",
            path=path,
            obj=key,
        )
    if allow_external:
        return  # its bytes are elsewhere: the file's own storage says nothing
    if nbytes > max(SMALL, stored * MAX_EXPANSION):
        raise LimitError(
            f"{what} declares {nbytes} bytes, the file stores {stored} for "
            f"it (at most {MAX_EXPANSION} times that is read: unwritten chunks "
            "and compressed ones expand to what is declared)",
            path=path,
            obj=key,
        )


def _entry(path, key, dataset, spec, chunks) -> Entry:
    """The dataset's entry: read whole when loaded, and by rows (a hyperslab: HDF5
    reads only the chunks holding them) for the readers of parts, in blocks of a
    chunk's first extent.  Only what :func:`_spec` let through is read, by the same
    dataset object, so every containment check holds for a part too; a chunk too
    large to decode (:func:`_chunk_problem`) is refused when the dataset is read,
    not when the file opens, so the file's other datasets stay readable."""
    problem = _chunk_problem(dataset, spec, chunks)

    def checked(selection):
        if problem is not None:
            raise LimitError(problem, path=path, obj=key)
        return _read(path, key, dataset, selection)

    def load():
        return Tensor({"data": checked(())})

    def read_rows(start: int, end: int) -> np.ndarray:
        return checked(slice(start, end))

    if not spec.shape:  # a scalar has no rows
        return Entry(spec, load, whole=True)
    block = int(chunks[0]) if chunks else 1
    return Entry(spec, load, whole=True, read_rows=read_rows, row_block=max(block, 1))


def _chunk_problem(dataset, spec, chunks):
    """Why reading the dataset would cost more than it holds, or None.  A filtered
    (compressed) chunk is decoded whole to read any element of it, so it may hold
    at most the dataset's bytes or ``MAX_CHUNK``, whichever is more (a 1 MB file's
    10-element dataset in one gzip chunk of 1 GiB cost 1.1 GB to read 40 bytes).  An
    unfiltered chunk is read in place, only the elements asked for."""
    if chunks is None:
        return None
    try:
        filtered = dataset.id.get_create_plist().get_nfilters() > 0
    except (OSError, ValueError, RuntimeError, AttributeError):
        filtered = True  # cannot tell: judged as the costly kind
    nbytes = spec.components["data"].length  # the dataset's bytes
    chunk_bytes = math.prod(chunks) * dataset.dtype.itemsize
    if not filtered or chunk_bytes <= max(nbytes, MAX_CHUNK):
        return None
    return (
        f"one compressed chunk {list(chunks)} holds {chunk_bytes} bytes, more than both "
        f"the dataset's {nbytes} and MAX_CHUNK ({MAX_CHUNK}): reading any element "
        "would decode all of it"
    )


def _read(path, key, dataset, selection):
    """``dataset[selection]`` as an array, h5py's errors as ours."""
    try:
        return np.asarray(dataset[selection])
    except (OSError, ValueError, RuntimeError, TypeError) as exc:
        raise FormatError(f"cannot read dataset: {exc}", path=path, obj=key) from None
    except MemoryError:
        raise LimitError("not enough memory for the dataset", path=path, obj=key) from None


def _plain_attrs(handle, path):
    """([(name, value)] of the file's scalar attributes that are plain values, [names
    of the others]).  Only scalars are read: an array attribute is not an attribute
    of ours, and its declared shape is not read into memory.  An attribute whose name
    is not UTF-8 is one of the others (listed with its bytes escaped)."""
    attrs = handle.attrs
    try:
        keys = list(attrs.keys())
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise FormatError(f"cannot read the file's attributes: {exc}", path=path) from None
    kept, skipped = [], []
    for key in keys:
        if type(key) is not str:
            # h5py gives a name that is not UTF-8 as bytes: no attribute is named so
            # (its repr, "hdf5.b'k\\xfe'", could be another attribute's name, and one
            # of the two was dropped without a word), so it is listed, as text
            skipped.append(bytes(key).decode("utf-8", "backslashreplace"))
            continue
        try:
            value = _plain(attrs[key]) if attrs.get_id(key).shape == () else None
        except (OSError, ValueError, RuntimeError, KeyError, TypeError):
            value = None  # an attribute h5py cannot read (an odd type) is not one of ours
        if value is None:
            skipped.append(key)
        else:
            kept.append((key, value))
    return kept, skipped


# the Python types of the values an attribute is kept as: what every writer holds
# (ztensor.attributes), never a type of h5py's or numpy's
_PLAIN_TYPES = (str, bytes, bool, int, float)


def _plain(value):
    """``value`` as a plain Python value, or None when it is not one.  A numpy scalar
    becomes its Python value; a compound's ``item()`` is a tuple (of h5py object
    references, say), a complex or long double stays what no attribute holds: None.
    A byte string that is text becomes text; other bytes stay bytes (replacing them
    with U+FFFD would change the value without a word), and so does a UTF-8 string
    holding bytes that are not UTF-8."""
    if isinstance(value, np.generic):
        value = value.item()  # np.bytes_ -> bytes, np.float64 -> float, np.void -> tuple
    if isinstance(value, str) and not value.isascii():
        # h5py decodes a UTF-8 string's invalid bytes as lone surrogates
        # (surrogateescape), which no attribute holds: its bytes, as for a byte string
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            try:
                return value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                return None
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)  # plain bytes, not numpy's bytes_ subclass
    for kind in _PLAIN_TYPES:
        if isinstance(value, kind):
            return kind(value)  # np.str_ -> str: the plain type, not a subclass
    return None
