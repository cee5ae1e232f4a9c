"""Editing a zTensor file: :func:`remove_tensors`, :func:`replace_tensor`
(and ``Writer.append``).

Every edit builds the new file beside the old one, copying the objects it keeps
as they are stored (no decoding, digests kept), and renames it over the old one.
A crash at any moment leaves the old file or the complete new one, never a mix
(docs/editing.md); the file's permission bits are kept.  The price is one copy of
the file's bytes per edit, which is the reference's remove_tensors cost too; its
replace_tensor wrote in place, which a crash could tear."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Union

from ztensor import dtypes
from ztensor.arguments import keyword_aliases
from ztensor.container.reader import Reader
from ztensor.container.writer import Writer, array_of, require_writable_version
from ztensor.errors import FormatError, ObjectNotFoundError
from ztensor.frameworks.torch_bridge import to_numpy_for_writing
from ztensor.io import atomic
from ztensor.tensor import Tensor

PathLike = Union[str, "os.PathLike[str]"]


@keyword_aliases(input="path", output="output_or_names")  # the reference's keywords
def remove_tensors(
    path: PathLike, output_or_names: Any = None, names: Optional[Iterable[str]] = None
) -> None:
    """Remove objects from a zTensor file.

    ``remove_tensors(path, names)`` (or ``names=``) edits ``path``;
    ``remove_tensors(input, output, names)`` (the reference's form, its keywords
    ``input=``/``output=``/``names=`` too) writes the result to ``output``.  Every
    name must exist (ObjectNotFoundError, a KeyError, otherwise; nothing is written)."""
    if names is None and output_or_names is None:
        raise TypeError("remove_tensors() needs the names to remove")
    if names is None:
        output, names = path, output_or_names
    elif output_or_names is None:
        output = path
    else:
        output = output_or_names
    if isinstance(names, str):
        names = [names]
    drop = list(names)
    for name in drop:
        if not isinstance(name, str):
            raise TypeError(f"names to remove are strings, not {type(name).__name__}: {name!r}")
    version = atomic.identity(path)  # before the read: see Writer.rewrite
    with Reader(path) as old:
        _require_zt(old)
        missing = [n for n in drop if n not in old]
        if missing:
            raise ObjectNotFoundError(
                f"no such object to remove: {missing[0]!r}", path=old.path, obj=missing[0]
            )
        # the file edited in place: renamed over only if no one changed it meanwhile
        same = os.path.exists(output) and os.path.samefile(output, path)
        new = (
            Writer.rewrite(output, version, attributes=dict(old.attributes))
            if same
            else Writer(output, attributes=dict(old.attributes))
        )
        with new:
            for name in old.keys():
                if name not in drop:
                    new.copy_from(old, name)


def replace_tensor(
    path: PathLike, name: str, data: Any, *, compress: Any = None, checksum: Optional[str] = None
) -> None:
    """Replace the data of dense object ``name`` with ``data`` (a numpy array or a
    torch tensor of the same shape and element type), keeping every other object
    as stored and the object's attributes.  ``compress``/``checksum`` default to
    what the object had."""
    version = atomic.identity(path)  # before the read: see Writer.rewrite
    with Reader(path) as old:
        _require_zt(old)
        meta = old.metadata(name)
        if meta.format != "dense":
            raise FormatError(
                f"replace_tensor replaces dense objects; this one is {meta.format!r}",
                path=old.path,
                obj=name,
            )
        comp = meta.components["data"]
        arr, given_type = _as_array(data, name, old.path)
        # the elements must be the object's: its bits, and no other logical type
        # (a float8_e5m2 tensor into an f8_e4m3fn object changed its values; a torch
        # bf16 tensor was refused as uint16).  An unknown logical type's elements
        # are the stored ones (an f64 array replaced a u8 object's data)
        fits = dtypes.elements_fit(
            dtypes.spec_types_for(arr.dtype),
            given_type,
            comp.dtype,
            comp.type,
            codes_declared=False,  # np.full(4, 2, np.uint16) may mean the value 2
        )
        if tuple(arr.shape) != tuple(meta.shape) or not fits:
            # a FormatError (a ValueError, as it was) naming the file and object
            shown = given_type or arr.dtype
            held = meta.dtype if comp.type is None else comp.type
            if comp.type is not None and not dtypes.logical_known(comp.dtype, comp.type):
                held = f"{meta.dtype} holding {comp.type!r}"  # another writer's type
            raise FormatError(
                f"the new data is {shown}{list(arr.shape)}, the object is {held}{list(meta.shape)}",
                path=old.path,
                obj=name,
            )
        if compress is None:
            compress = comp.encoding == "zstd"
        if checksum is None and comp.digest is not None:
            checksum = comp.digest.split(":", 1)[0]
        with Writer.rewrite(path, version, attributes=dict(old.attributes)) as new:
            for other in old.keys():
                if other != name:
                    new.copy_from(old, other)
                    continue
                types = (
                    {"data": comp.type}
                    if comp.type
                    else ({"data": "bf16"} if comp.dtype == "bf16" else {})
                )
                new.write(
                    name,
                    Tensor(
                        {"data": arr},
                        shape=tuple(meta.shape),
                        types=types,
                        attributes=dict(meta.attributes),
                    ),
                    compress=compress,
                    checksum=checksum,
                )


def _require_zt(reader):
    if reader.format != "zt":
        raise FormatError(
            f"only zTensor files can be edited, this is {reader.format}", path=reader.path
        )
    require_writable_version(reader)


def _as_array(data, name, path):
    """(the new data's elements as a numpy array, the logical type of a torch
    tensor's bit patterns or None)."""
    if type(data).__module__.startswith("torch"):
        return to_numpy_for_writing(data, name, path)
    return array_of(data, path, name), None  # the Writer's own conversion
