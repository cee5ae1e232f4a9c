"""``dense``: one component ``data``, row-major, in the object's logical shape.

The one home of the dense rules, used by the manifest check at open, by the
writer before it writes, and by the reader when it views or assembles:

* the shape's bytes must fit in memory (below 2**63): a dense object becomes one
  array (:func:`check_entry`);
* ``data`` holds exactly shape x element size bytes, decoded (:func:`check_entry`
  on the manifest, :func:`prepare` on arrays);
* a raw, native-order ``data`` without a logical type is a plain view of the file
  (:func:`view_plan`), except ``bool`` data, whose bytes must be checked
  (io/values.check_bools) on the way out.
"""

from __future__ import annotations

import math

from ztensor import dtypes
from ztensor.errors import FormatError
from ztensor.io import components
from ztensor.objects import shape_problem

ROLES = ("data",)


def check_entry(checker, name, shape, comps):
    """Manifest check at open (and in the writer): ``checker`` reports failures."""
    data = comps.get("data")
    # the bytes of one element as a read gives it: the rule is that one numpy array
    # of that type holds the shape, as the Writer's caller_shape and every foreign
    # reader apply it (with 16, any width, the Writer finished files of a (0, 2**62)
    # uint8 array, which numpy holds, that the Reader then refused whole)
    storage = dtypes.STORAGE.get(data.dtype) if data is not None else None
    unit = 16 if storage is None else storage.itemsize * dtypes.element_ratio(data.dtype, data.type)
    problem = shape_problem(shape, unit)
    if problem:
        checker.fail(f"shape: {problem}", name)
    if data is None:
        checker.fail("dense object has no 'data' component", name)
    # the spec gives a dense object one component: another is nothing a read of the
    # array shows (read_numpy, read_torch, every flat path), and replace_tensor
    # dropped it without a word; refused on read and write alike
    extra = sorted(role for role in comps if role not in ROLES)
    if extra:
        checker.fail(
            f"dense object has a component the format does not define ({extra[0]!r}; "
            "a dense object holds 'data' alone)",
            name,
            extra[0],
        )
    expected = (
        math.prod(shape)
        * dtypes.element_ratio(data.dtype, data.type)
        * dtypes.STORAGE[data.dtype].itemsize
    )
    if data.encoding == "raw":
        if data.length != expected:
            checker.fail(
                f"length {data.length} != {expected} bytes for its shape and dtype", name, "data"
            )
    elif data.uncompressed_length is None:  # v0.1/v1.1: the shape says the size
        checker.check_zstd_size(name, "data", expected, 1, data.dtype, data.length)
        data.uncompressed_length = expected
    elif data.uncompressed_length != expected:
        checker.fail(
            f"uncompressed_length {data.uncompressed_length} != {expected} bytes "
            "for its shape and dtype",
            name,
            "data",
        )


def prepare(fmt, shape, prepared, **where):
    """Write side: ``prepared`` is [(role, array, storage, logical type)]; ``data``
    must hold the shape's element count (checked again, in bytes, by check_entry)."""
    data = [p for p in prepared if p[0] == "data"]
    if not data:
        raise FormatError("a dense object needs a 'data' component", **where)
    _, arr, storage, ltype = data[0]
    storage_elems = arr.size * (2 if arr.dtype.kind == "c" else 1)
    if storage_elems != math.prod(shape) * dtypes.element_ratio(storage, ltype):
        raise FormatError(
            f"'data' holds {arr.size} elements, shape {list(shape)} needs a different count",
            **where,
        )
    return prepared


def view_plan(spec):
    """(numpy dtype, count, offset) when the object is a plain raw view of the file
    (no logical type, no bf16, no bool, no byte swap, not a v0.1 sparse blob, no v2
    blob another part shares: components.read_component decides whether that one
    may be a view), else False.  bool is declined because a plain view would hand
    out its bytes unchecked: the general path checks them (io/values.as_elements)
    and still returns a view of the file."""

    if spec.format != "dense" or spec.legacy is not None:
        return False
    comp = spec.components["data"]
    if (
        comp.encoding != "raw"
        or comp.type is not None
        or comp.dtype in dtypes.NOT_PLAIN_VIEWS
        or comp.shard is not None
        or comp.shared
    ):
        return False
    dtype = components.storage_dtype(comp)
    if not (dtype.isnative or dtype.itemsize == 1):
        return False
    return dtype, comp.length // dtype.itemsize, comp.offset


def assemble(spec, arrays, **where):
    """Read side: ``data`` in the object's shape."""
    return {**arrays, "data": arrays["data"].reshape(spec.shape)}
