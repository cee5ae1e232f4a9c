"""READ 5: components -> the object a caller gets, one entry per ``format``.

Every format reads into a :class:`ztensor.Tensor` holding its components;
format-specific views (scipy sparse matrices, dequantized weights) build on it.
Formats this version does not know are returned the same way, as the spec asks.
"""
from ztensor.formats import dense, quantized, sparse

ASSEMBLERS = {"dense": dense.assemble, "quantized_group": quantized.assemble,
              "sparse_csr": sparse.assemble, "sparse_coo": sparse.assemble}


def assemble(spec, arrays):
    """A Tensor from ``spec`` and its decoded component arrays (role -> array)."""
    return ASSEMBLERS.get(spec.format, generic)(spec, arrays)


def generic(spec, arrays):
    from ztensor.tensor import Tensor

    return Tensor(arrays, shape=spec.shape, format=spec.format,
                  attributes=spec.attributes, types=types_of(spec))


def types_of(spec) -> dict:
    """Role -> logical type, plus "bf16" for bf16 storage (whose bits come back as
    uint16 without ml_dtypes): writing the Tensor back then gives the same bytes."""
    return {role: c.type or "bf16" for role, c in spec.components.items()
            if c.type or c.dtype == "bf16"}
