"""READ 5 / WRITE 1: one module per object ``format``, the one home of its rules.

Each module (``dense``, ``sparse`` for sparse_csr and sparse_coo, ``quantized``
for quantized_group, ``gguf_blocks`` for GGUF's quantized tensors) provides the same
four steps, and is the home of its format's rules.  Fast paths repeat the dense
rule for speed: ``manifest_table``'s column checks and ``_plain_rows``, the
compiled ``ViewTable`` (read_numpy's zero-copy views) and ``Writer._write_plain``;
each may only decline (hand the object to the general path here), and
differential tests hold them to the verdicts of the modules here:

* ``check_entry(checker, name, shape, components)``: manifest checks, run at open
  by ``manifest_checks.Checker`` and by the writer before it writes (so the writer cannot
  write what the reader refuses);
* ``prepare(format, shape, prepared, **where)`` (write side): turn the caller's
  arrays into what is stored (sparse indices become u64) and validate them;
* ``assemble(spec, arrays, **where)`` (read side): the checked components, shaped;
* ``ROLES``: the components the format defines; the primary one (whose dtype an
  object reports) is in ``spec.PRIMARY_ROLES``.

Formats this version does not know pass through :data:`GENERIC`: components kept
exactly as stored, as the spec asks.  v0.1's one-blob sparse layout is lifted to
these formats by ``ztensor/container/legacy.py``.
"""

from ztensor.errors import UnsupportedError
from ztensor.formats import dense, gguf_blocks, quantized, sparse


class _Generic:
    """An object of a format this version does not know: no rules beyond the
    generic ones, components as stored."""

    ROLES = ()

    @staticmethod
    def check_entry(checker, name, shape, comps):
        pass

    @staticmethod
    def prepare(fmt, shape, prepared, **where):
        return prepared

    @staticmethod
    def assemble(spec, arrays, **where):
        return arrays


GENERIC = _Generic()
HANDLERS = {
    "dense": dense,
    "sparse_csr": sparse,
    "sparse_coo": sparse,
    "quantized_group": quantized,
    "gguf_blocks": gguf_blocks,
}

# formats whose attributes carry rules (bits, block geometry): their modules define
# check_attributes(shape, attributes, **where) and validate(shape, attributes, arrays, **where)
_RULED_BY_ATTRIBUTES = {"quantized_group": quantized, "gguf_blocks": gguf_blocks}


def handler(fmt):
    """The module owning ``fmt``'s rules (GENERIC for unknown formats)."""
    return HANDLERS.get(fmt, GENERIC)


def check_attributes(fmt, shape, attributes, **where):
    """A format's attribute rules as every read applies them, for a writer copying an
    object's stored bytes (``Writer.copy_from``): the format module's
    ``check_attributes`` (quantized_group, gguf_blocks), whose FormatError refuses
    the object.  Its UnsupportedError (a well-formed object in a convention this
    version cannot decode) is no refusal: reads return such objects as stored."""
    module = _RULED_BY_ATTRIBUTES.get(fmt)
    if module is None:
        return
    try:
        module.check_attributes(shape, attributes, **where)
    except UnsupportedError:
        pass


def check_object(fmt, shape, attributes, arrays, types, **where):
    """Everything a read of this object refuses, run by the writer on the arrays it
    is about to write: the format module's ``validate`` (quantized_group,
    gguf_blocks; sparse and dense check theirs in ``prepare`` and ``check_entry``).
    ``types``: role -> logical type, as ObjectSpec.tensor_types gives them."""
    module = _RULED_BY_ATTRIBUTES.get(fmt)
    if module is not None:
        module.validate(shape, attributes, arrays, types, **where)
