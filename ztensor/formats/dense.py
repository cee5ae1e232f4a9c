"""``dense``: one component ``data``, row-major, in the object's logical shape."""
from ztensor.tensor import Tensor


def assemble(spec, arrays):
    data = arrays["data"].reshape(spec.shape)
    from ztensor.formats import types_of

    return Tensor({**arrays, "data": data}, shape=spec.shape, format="dense",
                  attributes=spec.attributes, types=types_of(spec))
