"""``.npy`` and ``.npz``: numpy's own header readers, with no pickles.

A ``.npy`` is memory-mapped by numpy (``allow_pickle=False``).  An ``.npz`` is read
through :class:`~ztensor.foreign.zip_members.ZipArchive`, the one home of the
zip-member rules (encryption, duplicate and overlapping members, declared sizes,
bounded decoding, limits).  Each member's ``.npy`` header is parsed at open; its
array is made when asked for, from the bytes the member really holds: a view of the
mapped file when stored, else decoded (numpy's own reader would allocate the
header's declared shape first).  A deflated member cannot be read from its middle,
so its entry says ``whole`` (:class:`~ztensor.foreign.base.Entry`): a slice of it
costs the member, decoded once per ``safe_open`` handle, and dask reads it as one
chunk.  A file or member holds exactly the bytes its header declares after it: more
would be bytes no array shows (a second ``np.save`` to the same file), fewer an
array cut short.  Member names lose their ``.npy``
through one :class:`~ztensor.foreign.names.NameTable`, so ``a`` and ``a.npy`` are an
error naming both, never one array hiding the other."""

from __future__ import annotations

import ast
import io
import lzma
import math
import os
import re
import struct
import tokenize
import warnings
import zipfile
import zlib

import numpy as np

from ztensor import dtypes
from ztensor.errors import FormatError, LimitError
from ztensor.foreign.base import Entry, ForeignFile, check_held_size, eager
from ztensor.foreign.names import NameTable
from ztensor.foreign.zip_members import ZipArchive
from ztensor.io.source import Source
from ztensor.objects import ComponentSpec, ObjectSpec, shape_problem
from ztensor.spec import DEFAULT_LIMITS, Limits, check_file_totals
from ztensor.tensor import Tensor

# what numpy's readers raise on a malformed file: zipfile, zlib and lzma for .npz
# members (NotImplementedError: an unknown compression method; RuntimeError: an
# encrypted member); tokenize/SyntaxError from the header parser.  Found by
# tools/fuzz/fuzz_importers.py.
# numpy reads headers of at most 10,000 bytes (its max_header_size); the magic,
# version and length come first
MAX_NPY_HEADER = 1 << 16
READ_ERRORS = (
    ValueError,
    OSError,
    EOFError,
    KeyError,
    OverflowError,
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    lzma.LZMAError,
    struct.error,
    tokenize.TokenError,
    SyntaxError,
    NotImplementedError,
    RuntimeError,
)


def open_npy(path, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = True) -> ForeignFile:
    """A ``.npy`` file: its header parsed and checked, then its elements a view of the
    mapped file (through :class:`~ztensor.io.source.Source`, so the file opened is the
    regular file that was checked, and every byte viewed lies inside it)."""
    name = os.fspath(path)
    stem = os.path.splitext(os.path.basename(name))[0]
    check_file_totals(name, limits, 1)  # one array: the same object limit as every format
    source = Source(name, mmap=mmap)
    try:
        head = min(source.size, MAX_NPY_HEADER)
        fp = io.BytesIO(bytes(source.view(0, head, "header")))
        shape, fortran, dtype = _read_header(fp, name, stem)
        spec = _header_spec(name, stem, shape, dtype, limits)
        nbytes = spec.components["data"].length
        # exactly: bytes after the array would be a second np.save to the same file
        # (np.load reads one array a call), dropped here without a word
        check_held_size(
            source.size - fp.tell(),
            nbytes,
            "the file after its header",
            _declared(shape, dtype),
            path=name,
            obj=stem,
        )
        flat = np.frombuffer(
            source.view(fp.tell(), nbytes, "array", obj=stem), dtype, math.prod(shape)
        )
        arr = flat.reshape(shape, order="F" if fortran else "C")
    except BaseException:
        source.close()
        raise
    return ForeignFile(
        name, "npy", {}, {stem: eager(stem, Tensor({"data": arr}))}, closer=source.close
    )


def open_npz(path, limits: Limits = DEFAULT_LIMITS, *, mmap: bool = True) -> ForeignFile:
    name = os.fspath(path)
    archive = ZipArchive(name, limits, ".npz archive", mmap=mmap)
    try:
        return _open_npz(name, archive, limits)
    except MemoryError:
        archive.close()
        raise LimitError("not enough memory to read the archive", path=name) from None
    except BaseException:
        archive.close()
        raise


def _open_npz(name, archive, limits) -> ForeignFile:
    keys = NameTable(name, "array")
    entries = {}
    for member in archive.members:
        # numpy.savez names a member `<key>.npy`; np.load strips the suffix the same way
        key = keys.claim(member[:-4] if member.endswith(".npy") else member, member)
        check_file_totals(name, limits, len(keys))
        shape, fortran, dtype, offset = _member_header(archive, member, key)
        spec = _header_spec(name, key, shape, dtype, limits)
        check_held_size(
            archive.members[member].size - offset,
            spec.components["data"].length,
            f"member {member[:80]!r} after its header",
            _declared(shape, dtype),
            path=name,
            obj=key,
        )

        def load(
            member=member, key=key, shape=shape, fortran=fortran, dtype=dtype, offset=offset
        ):  # this member's values, bound now (a def: mypy types it)
            return _load_member(archive, member, key, shape, fortran, dtype, offset)

        # a deflated member has no middle to start from: every load decodes all of
        # it, so the readers of parts read it once (base.Entry)
        entries[key] = Entry(spec, load, whole=archive.members[member].compressed)
    archive.check_decoded(archive.members, lambda member: member)
    return ForeignFile(name, "npz", {}, entries, closer=archive.close)


# a .npy header: magic, version, length, then at most numpy's own header size limit
_HEAD = 12 + 10_000


def _member_header(archive, member, key):
    """(shape, fortran_order, dtype, data offset) from a member's ``.npy`` header,
    decoding no more of the member than the header can take."""
    head = io.BytesIO(bytes(archive.read(member, obj=key, limit=_HEAD)))
    shape, fortran, dtype = _read_header(head, archive.path, key)
    return shape, fortran, dtype, head.tell()


def _read_header(fp, path, key):
    """(shape, fortran_order, dtype) from the ``.npy`` header at ``fp`` (a BytesIO)'s
    position (numpy's parser; its errors are FormatErrors), in a format version numpy
    writes, with no key given twice.  :func:`_header_spec` checks the values."""
    try:
        version = np.lib.format.read_magic(fp)
    except READ_ERRORS as exc:
        raise FormatError(f"cannot read the array header: {exc}", path=path, obj=key) from None
    if version not in _VERSIONS:  # numpy's header-2.0 reader takes any version
        raise FormatError(
            f"npy format version {version[0]}.{version[1]} (1.0, 2.0 and 3.0 are read)",
            path=path,
            obj=key,
        )
    start = fp.tell() + _VERSIONS[version]  # past the header length
    try:
        reader = (
            np.lib.format.read_array_header_1_0
            if version == (1, 0)
            else np.lib.format.read_array_header_2_0
        )
        found = reader(fp)
    except READ_ERRORS + (TypeError, RecursionError) as exc:  # numpy's literal_eval:
        # keys of mixed types (sorted() of str and bytes), nesting past the stack
        raise FormatError(f"cannot read the array header: {exc}", path=path, obj=key) from None
    repeated = _repeated_key(bytes(fp.getbuffer()[start : fp.tell()]))
    if repeated is not None:  # numpy keeps the last; another reader may keep the first
        raise FormatError(f"the array header gives {repeated!r} twice", path=path, obj=key)
    return found


# npy format version -> bytes of its header length field
_VERSIONS = {(1, 0): 2, (2, 0): 4, (3, 0): 4}


def _repeated_key(header: bytes):
    """A key the header's dict literal gives twice, or None.  numpy has parsed the
    header already, so it is a dict literal of at most 10,000 characters (a file
    written by Python 2 may spell integers ``3L``, which numpy filters out too)."""
    text = header.decode("utf-8", "replace").strip()
    with warnings.catch_warnings():  # an odd escape in a string: numpy has said so once
        warnings.simplefilter("ignore")
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError:
            try:
                tree = ast.parse(re.sub(r"(\d)L\b", r"\1", text), mode="eval")
            except SyntaxError:
                return None
    if not isinstance(tree.body, ast.Dict):
        return None
    seen = set()
    for node in tree.body.keys:
        value = node.value if isinstance(node, ast.Constant) else None
        if value in seen:
            return value
        seen.add(value)
    return None


def _header_spec(path, key, shape, dtype, limits):
    """The ObjectSpec a ``.npy`` header describes, once its shape (integers, under the
    rank limit, a size numpy can make) and dtype (one zTensor stores) are checked."""
    if not all(type(d) is int for d in shape):  # numpy's header check takes True for 1
        raise FormatError(
            f"shape {shape!r:.80} holds something other than integers", path=path, obj=key
        )
    found = dtypes.spec_types_for(dtype)
    if found is None or dtype.hasobject:
        raise FormatError(f"numpy dtype {dtype} has no zTensor type", path=path, obj=key)
    if len(shape) > limits.max_rank:
        raise LimitError(
            f"rank {len(shape)} is above max_rank {limits.max_rank}", path=path, obj=key
        )
    problem = shape_problem(shape, dtype.itemsize)
    if problem:
        raise FormatError(problem, path=path, obj=key)
    storage, ltype = found
    nbytes = math.prod(shape) * dtype.itemsize
    return ObjectSpec(
        key, shape, "dense", {}, {"data": ComponentSpec("data", storage, ltype, 0, nbytes)}
    )


def _declared(shape, dtype) -> str:
    """What a ``.npy`` header declares, for :func:`check_held_size`'s message."""
    return f"the header's shape {list(shape)} of {dtype}"


def _load_member(archive, member, key, shape, fortran, dtype, offset):
    """The member's array, from the bytes it holds (a view when stored); the member
    holds exactly the bytes its header declares (checked at open, before anything
    of the declared size is made)."""
    data = archive.read(member, obj=key)
    try:
        arr = np.frombuffer(data, dtype, math.prod(shape), offset)
    except MemoryError:
        raise LimitError("not enough memory for the array", path=archive.path, obj=key) from None
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    if not arr.flags.aligned:  # a stored member lies where the zip put it: copy, as numpy would
        arr = arr.copy(order="K")
        arr.flags.writeable = False
    return Tensor({"data": arr})
