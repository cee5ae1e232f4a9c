"""Hypothesis strategies: arrays over dtypes x byte orders x shapes x layouts."""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

BASE_DTYPES = ["f8", "f4", "f2", "i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1", "?", "c8", "c16"]


@st.composite
def dtypes(draw):
    code = draw(st.sampled_from(BASE_DTYPES))
    dtype = np.dtype(code)
    if dtype.itemsize > 1:
        dtype = dtype.newbyteorder(draw(st.sampled_from("<>=")))
    return dtype


shapes = st.one_of(
    st.just(()),                                        # 0-d
    hnp.array_shapes(min_dims=1, max_dims=5, min_side=0, max_side=4),  # incl. empty
    hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=300),
)


@st.composite
def arrays(draw):
    """Any array: contiguous, or a strided / transposed view of a larger one."""
    dtype = draw(dtypes())
    shape = draw(shapes)
    layout = draw(st.sampled_from(["c", "f", "strided"]))
    if layout == "strided" and shape:
        big = tuple(s * 2 for s in shape)
        base = draw(hnp.arrays(dtype, big, elements=_elements(dtype)))
        return base[tuple(slice(None, None, 2) for _ in shape)]
    arr = draw(hnp.arrays(dtype, shape, elements=_elements(dtype)))
    return np.asfortranarray(arr) if layout == "f" else arr


def _elements(dtype):
    if dtype.kind == "f":
        return st.floats(width=dtype.itemsize * 8, allow_nan=True, allow_infinity=True)
    if dtype.kind == "c":
        return st.complex_numbers(width=dtype.itemsize * 8, allow_nan=False)
    return None


encodings = st.sampled_from([False, True, 1, 9])
checksums = st.sampled_from([None, "crc32c", "sha256"])
