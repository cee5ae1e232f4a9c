"""``quantized_group``: GPTQ-style group quantization (docs/quantized_group.md).

Our convention, which is the layout AutoGPTQ / GPTQModel checkpoints use, so their
tensors drop in unchanged:

* object ``shape`` = ``[N_out, K_in]`` (``nn.Linear.weight``)
* ``packed_weight``: int32 ``[K * bits / 32, N]``, codes packed along K as one LSB-first
  bit stream per column (3-bit codes straddle words: 32 codes in 3 words, AutoGPTQ's
  layout)
* ``scales``: f16/bf16/f32 ``[G, N]``, ``G = ceil(K / group_size)``
* ``zeros``: f16/bf16/f32 ``[G, N]``, the true zero point; absent when symmetric
  (zero point ``2**(bits-1)``)
* ``g_idx``: optional int32 ``[K]``, the group of each input column (act-order)
* attributes ``bits`` (2, 3, 4, 8), ``group_size`` (-1: one group per row),
  ``packing: "{32/bits}_per_i32"`` (``"32_per_3_i32"`` for 3 bits), ``pack_axis: 0``,
  ``pack_order: "lsb_first"``

``W[n, k] = scales[g, n] * (code(k, n) - zeros[g, n])`` with ``g = g_idx[k]``.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Optional

import numpy as np

from ztensor import kernels
from ztensor._native import contract as _contract
from ztensor.attributes import show
from ztensor.errors import FormatError, UnsupportedError, ZTensorError
from ztensor.formats import gguf_blocks
from ztensor.tensor import Tensor

BITS = _contract.BITS


def check_entry(checker, name, shape, comps):
    """Manifest check at open: nothing beyond the generic checks.  A quantized
    object in another convention is still a valid object (read() returns its
    components as stored); :func:`validate` is where a convention must be ours."""


def check_attributes(shape, attributes, **where):
    """THE rule for a quantized_group object's attributes, used by ``dequantize``,
    by every read (:func:`assemble`, hence ``verify``) and by the writer before it
    writes (:func:`prepare`, and ``Writer.copy_from`` through
    ``formats.check_attributes``).  Returns ``(bits, group_size)`` as stored.

    Raises
    ------
    FormatError
        Values no convention could mean: ``bits`` not an integer in [1, 32] (codes
        are packed into int32 words), ``group_size`` not an integer that is -1 or in
        [1, 2**63).  Such an object is refused by every read and never written.
    UnsupportedError
        Well-formed values naming a convention ztensor does not implement (bits 5,
        ``pack_order: "msb_first"``, ...).  The object is valid: read() returns its
        components as stored, the writer writes it; only ``dequantize`` refuses it.
    """
    bits, group_size = attributes.get("bits"), attributes.get("group_size")
    _check_widths(bits, group_size, where)
    want = {"packing": _packing(bits), "pack_axis": 0, "pack_order": "lsb_first"}
    for key, value in want.items():
        got = attributes.get(key, value)
        if type(got) is not type(value) or got != value:
            raise UnsupportedError(
                f"{key}={show(got)} is not a convention ztensor "
                f"implements ({key}={value!r}); see "
                "docs/quantized_group.md",
                **where,
            )
    return bits, group_size


def _check_widths(bits, group_size, where):
    """``bits`` and ``group_size`` as check_attributes states them (also for the
    values a GPTQ mapping's caller passes)."""
    if type(bits) is not int:
        raise FormatError(f"bits must be an integer, got {show(bits)}", **where)
    if not 1 <= bits <= 32:
        raise FormatError(
            f"bits must be an integer in [1, 32] (codes packed in int32 words), got {show(bits)}",
            **where,
        )
    if bits not in BITS:
        raise UnsupportedError(
            f"bits={show(bits)}: only 2, 3, 4 and 8-bit codes are supported", **where
        )
    if type(group_size) is not int:
        raise FormatError(f"group_size must be an integer, got {show(group_size)}", **where)
    if group_size != -1 and not 0 < group_size < 1 << 63:
        raise FormatError(
            f"group_size must be -1 or in [1, 2**63), got {show(group_size)}", **where
        )


def validate(shape, attributes, arrays, types=None, **where):
    """Everything a read refuses in a quantized_group object, before anything uses
    it: its attributes (:func:`check_attributes`), then, for an object in our
    convention, every component's size, dtype and ``g_idx`` range, exactly as
    ``dequantize`` checks them.  Returns the checked kernel inputs, or None for a
    well-formed object in another convention (kept as stored).  ``types``: role ->
    logical type, as a Tensor's (a bf16 component's bits may be uint16)."""
    try:
        check_attributes(shape, attributes, **where)
    except UnsupportedError:
        return None
    probe = Tensor(
        arrays, shape=shape, format="quantized_group", attributes=attributes, types=types
    )
    return _from_tensor(probe, where)


def prepare(fmt, shape, prepared, **where):
    """Write side: components are stored as given (read() gives them back).  The
    writer runs :func:`validate` on them first (``formats.check_object``), so it
    never writes what a read refuses."""
    return prepared


def assemble(spec, arrays, **where):
    """Read side: components in their 2-D layout when the object follows our
    convention (all of :func:`validate` holds, or the read is refused), else left
    1-D (a well-formed file from another convention still reads)."""
    where = {"obj": spec.name, **where}
    inputs = validate(spec.shape, spec.attributes, arrays, spec.tensor_types, **where)
    if inputs is None:
        return arrays
    return {role: inputs.layout.shaped(role, arr) for role, arr in arrays.items()}


class _Layout:
    """Sizes of one quantized weight, checked against each other before any kernel runs."""

    def __init__(self, N, K, bits, group_size, where):
        _check_widths(bits, group_size, where)
        if group_size == -1:  # GPTQ's "one group per row": the whole of K
            group_size = max(K, 1)
        self.N, self.K, self.bits, self.group_size = N, K, bits, group_size
        self.per = _contract.block_codes(bits)  # codes per block of whole words
        if K % self.per:
            raise FormatError(
                f"K={K} is not a multiple of {self.per} ({bits}-bit codes fill "
                f"{self.per * bits // 32} int32 words)",
                **where,
            )
        self.G = -(-K // group_size) if K else 0  # integer ceil: no float rounding
        self.where = where

    @classmethod
    def from_tensor(cls, t, where=None):
        where = where or {}
        # the attribute rule first: an object in another convention is that
        # convention's to shape (UnsupportedError, read as stored), so a FormatError
        # here is one every read (validate) gives too, and verify reports
        bits, group_size = check_attributes(t.shape, t.attributes, **where)
        if len(t.shape) != 2:
            raise FormatError(
                f"quantized_group needs a 2-D shape [N, K], got {list(t.shape)}", **where
            )
        return cls(t.shape[0], t.shape[1], bits, group_size, where)

    def shaped(self, role, arr):
        """THE rule for a component's (or a GPTQ tensor's) shape: the layout's shape,
        or flat (at most 1-D: a file stores components as a run of values) with the
        layout's number of values.  Another shape of the same size is refused, never
        reshaped: ``scales`` ``[N, G]`` (transposed) or ``qzeros``
        ``[N*bits/32, G]`` read as ``[G, N]`` gave other weights without a word."""
        shapes = {
            "packed_weight": (_contract.stream_words(self.K, self.bits), self.N),
            "scales": (self.G, self.N),
            "zeros": (self.G, self.N),
            "g_idx": (self.K,),
            "qzeros": (self.G, _contract.stream_words(self.N, self.bits)),
        }
        want = shapes.get(role)
        if want is None:
            return arr
        if arr.size != math.prod(want) or (arr.ndim > 1 and arr.shape != want):
            raise FormatError(
                f"{role} holds {arr.size} values of shape {list(arr.shape)}, "
                f"[N={self.N}, K={self.K}] with bits={self.bits}, "
                f"group_size={self.group_size} needs {list(want)}"
                + ("" if arr.ndim > 1 else f" ({math.prod(want)} values)"),
                component=role,
                **self.where,
            )
        return arr.reshape(want)

    def check_g_idx(self, g_idx):
        g = np.asarray(g_idx)
        if g.dtype.kind not in "iu":
            raise FormatError("g_idx must hold integers", component="g_idx", **self.where)
        g = self.shaped("g_idx", g)
        if g.size and (g.min() < 0 or g.max() >= self.G):
            raise FormatError(
                f"g_idx values must lie in [0, {self.G})", component="g_idx", **self.where
            )
        return np.ascontiguousarray(g, "<i4")


def _float_bytes(arr, role, where, bits_are_bf16=True):
    """(little-endian array, kernel type code) of a scale or zero array.  uint16
    arrays are bf16 bit patterns where ``bits_are_bf16`` (a GPTQ mapping, or a
    component whose type says bf16: how bf16 reads without ml_dtypes); a Tensor's
    plain uint16 component is integers, refused (read as bf16 bits it gave silently
    wrong weights)."""
    arr = np.asarray(arr)
    if arr.dtype.name == "bfloat16":
        arr = np.ascontiguousarray(arr).view(np.uint16)  # ml_dtypes: native order
    elif arr.dtype.kind == "u" and arr.dtype.itemsize == 2 and not bits_are_bf16:
        raise UnsupportedError(
            f"{role} must be float16, bfloat16 or float32, not uint16 integers (bf16 bit "
            "patterns are stored as bf16: give them type 'bf16')",
            component=role,
            **where,
        )
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 2:
        return np.ascontiguousarray(arr, "<u2"), kernels.BF16
    if arr.dtype.kind == "f" and arr.dtype.itemsize in (2, 4):
        le = np.ascontiguousarray(arr, arr.dtype.newbyteorder("<"))
        return le, kernels.F16 if arr.dtype.itemsize == 2 else kernels.F32
    raise UnsupportedError(
        f"{role} must be float16, bfloat16 or float32, not {arr.dtype}", component=role, **where
    )


def _int32_words(arr, role, where):
    """Little-endian 32-bit words of an int32/uint32 array (any byte order)."""
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize != 4:
        raise FormatError(f"{role} must be int32 words, got {arr.dtype}", component=role, **where)
    unsigned = arr.view(arr.dtype.str.replace("i", "u"))  # same byte order, unsigned
    return np.ascontiguousarray(unsigned, "<u4")  # values to little-endian words


class _Inputs:
    """Everything the kernel reads, as little-endian arrays, sizes checked."""

    def __init__(self, layout, qweight, scales, scale_type, zeros, zero_type, g_idx):
        self.layout, self.qweight, self.g_idx = layout, qweight, g_idx
        self.scales, self.scale_type = scales, scale_type
        self.zeros, self.zero_type = zeros, zero_type


def dequantize(
    obj: Any,
    *,
    dtype: Any = np.float16,
    threads: Optional[int] = None,
    bits: Optional[int] = None,
    group_size: Optional[int] = None,
    checkpoint_format: Optional[str] = None,
    out: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Dense weight ``[N_out, K_in]`` of a group-quantized (GPTQ) weight.

    Parameters
    ----------
    obj : ztensor.Tensor or mapping
        A ``quantized_group`` object (``reader.read(name)``), or a GPTQ checkpoint's
        tensors: ``qweight`` int32 ``[K*bits/32, N]``, ``qzeros`` int32
        ``[G, N*bits/32]``, ``scales`` ``[G, N]``, optional ``g_idx`` ``[K]``.
    dtype : numpy dtype or "bfloat16"
        float32, float16 or bfloat16 (ml_dtypes' type; without ml_dtypes, bfloat16
        output comes back as uint16 bit patterns).
    threads : int, optional
        Rows are split across this many threads (default: all cores); the GIL is
        released while the kernel runs.
    bits, group_size, checkpoint_format : for a GPTQ mapping
        ``checkpoint_format`` is ``"gptq"`` (qzeros hold ``zero - 1``, AutoGPTQ's
        default) or ``"gptq_v2"`` (they hold the zero itself).
    out : numpy.ndarray, optional
        A C-contiguous ``[N, K]`` array of the output dtype to write into (reusing a
        buffer saves the page faults of a fresh one).

    Returns
    -------
    numpy.ndarray
        ``W[n, k] = scales[g, n] * (code(k, n) - zeros[g, n])``, ``g = g_idx[k]``.

    Raises
    ------
    FormatError
        Sizes that do not fit each other (checked before any kernel runs).
    UnsupportedError
        An unsupported bit width or dtype.
    """
    if isinstance(obj, Tensor) and obj.format == "gguf_blocks":  # GGUF's own blocks
        return gguf_blocks.dequantize(obj, dtype=dtype, threads=threads)
    out_type, out_dtype = kernels.output_type(dtype)
    if isinstance(obj, Tensor):
        inputs = _from_tensor(obj)
    else:
        inputs = _from_gptq(obj, bits, group_size, checkpoint_format)
    layout = inputs.layout
    if out is None:
        out = np.empty((layout.N, layout.K), out_dtype)
    elif (
        not isinstance(out, np.ndarray)
        or out.shape != (layout.N, layout.K)
        or out.dtype != out_dtype
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(
            f"out must be a writable C-contiguous {out_dtype} array of shape {(layout.N, layout.K)}"
        )
    flat = out.view(np.uint8).reshape(-1)
    zeros = None if inputs.zeros is None else inputs.zeros.view(np.uint8).reshape(-1)
    g_idx = None if inputs.g_idx is None else inputs.g_idx.view(np.uint8).reshape(-1)
    args = (
        inputs.qweight.view(np.uint8).reshape(-1),
        inputs.scales.view(np.uint8).reshape(-1),
        zeros,
        g_idx,
        layout.K,
        layout.N,
        layout.G,
        layout.group_size,
        layout.bits,
        inputs.scale_type,
        inputs.zero_type,
        out_type,
        flat,
    )
    threads = max(1, min(threads or kernels.cpu_threads(), layout.N or 1))
    bounds = [layout.N * i // threads for i in range(threads + 1)]
    if threads == 1:
        kernels.dequant_rows(*args, 0, layout.N)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(
                pool.map(
                    lambda i: kernels.dequant_rows(*args, bounds[i], bounds[i + 1]), range(threads)
                )
            )
    return out


def dequantize_read(
    obj: Any, path: Any, name: str, role: Optional[str] = None, **kwargs: Any
) -> np.ndarray:
    """:func:`dequantize` for an object read from ``path`` under ``name`` (``stats``,
    ``ztensor dequantize``, the checkpoint view), or with ``role`` (``qweight``,
    ``qzeros``, ``scales``, ``g_idx``) that one of its GPTQ tensors (:func:`to_gptq`):
    a Tensor knows no file, so a refusal (a convention it does not implement, sizes
    that do not fit) is given the file and object here, the one place for both."""
    try:
        return dequantize(obj, **kwargs) if role is None else to_gptq(obj)[role]
    except ZTensorError as exc:
        exc.locate(path, name)
        raise


def _from_tensor(t, where=None) -> _Inputs:
    where = where or {}
    if t.format != "quantized_group":
        raise FormatError(f"dequantize needs a quantized_group object, got {t.format!r}", **where)
    layout = _Layout.from_tensor(t, where)  # the attributes first, as validate checks them
    for role in ("packed_weight", "scales"):
        if role not in t.components:
            raise FormatError(f"quantized_group object has no {role!r} component", **where)
    comps = t.components
    qweight = _int32_words(
        layout.shaped("packed_weight", np.asarray(comps["packed_weight"])), "packed_weight", where
    )
    scales, scale_type = _float_bytes(
        layout.shaped("scales", np.asarray(comps["scales"])),
        "scales",
        where,
        t.types.get("scales") == "bf16",
    )
    zeros, zero_type = None, kernels.ZERO_NONE
    if "zeros" in comps:
        zeros, zero_type = _float_bytes(
            layout.shaped("zeros", np.asarray(comps["zeros"])),
            "zeros",
            where,
            t.types.get("zeros") == "bf16",
        )
    g_idx = layout.check_g_idx(comps["g_idx"]) if "g_idx" in comps else None
    return _Inputs(layout, qweight, scales, scale_type, zeros, zero_type, g_idx)


def _from_gptq(tensors, bits, group_size, checkpoint_format) -> _Inputs:
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError("checkpoint_format must be 'gptq' or 'gptq_v2' for a GPTQ mapping")
    for role in ("qweight", "qzeros", "scales"):
        if role not in tensors:
            raise FormatError(f"GPTQ tensors need {role!r}")
    qweight = np.asarray(tensors["qweight"])
    if qweight.ndim != 2:
        raise FormatError(f"qweight must be 2-D [K*bits/32, N], got shape {qweight.shape}")
    if type(bits) is not int or bits not in BITS:
        raise UnsupportedError(f"bits={show(bits)}: only 2, 3, 4 and 8-bit codes are supported")
    if qweight.shape[0] % (3 if bits == 3 else 1):
        raise FormatError(f"qweight has {qweight.shape[0]} rows: 3-bit codes fill words in threes")
    layout = _Layout(qweight.shape[1], qweight.shape[0] * 32 // bits, bits, group_size, {})
    scales, scale_type = _float_bytes(
        layout.shaped("scales", np.asarray(tensors["scales"])), "scales", {}
    )
    if layout.N % layout.per:
        raise FormatError(
            f"N={layout.N} is not a multiple of {layout.per}: qzeros rows are whole int32 words",
            component="qzeros",
        )
    qzeros = _int32_words(layout.shaped("qzeros", np.asarray(tensors["qzeros"])), "qzeros", {})
    g_idx = tensors.get("g_idx")
    g_idx = None if g_idx is None else layout.check_g_idx(g_idx)
    zero_type = kernels.ZERO_PACKED_V1 if checkpoint_format == "gptq" else kernels.ZERO_PACKED_V2
    return _Inputs(
        layout,
        _int32_words(qweight, "qweight", {}),
        scales,
        scale_type,
        qzeros.reshape(-1),
        zero_type,
        g_idx,
    )


# ------------------------------------------------------------------ writing side
def from_gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: Optional[np.ndarray] = None,
    *,
    bits: int,
    group_size: int,
    checkpoint_format: str = "gptq",
    attributes: Optional[Dict[str, Any]] = None,
) -> Tensor:
    """A GPTQ checkpoint's tensors as a quantized_group object in our convention,
    without dequantizing: qweight and scales are kept as they are; packed qzeros
    become the true zero points (f16, or the scales' float type)."""
    inputs = _from_gptq(
        {
            "qweight": qweight,
            "qzeros": qzeros,
            "scales": scales,
            **({"g_idx": g_idx} if g_idx is not None else {}),
        },
        bits,
        group_size,
        checkpoint_format,
    )
    layout = inputs.layout
    codes = np.empty(layout.G * layout.N, np.uint8)
    # rows of qzeros are whole blocks, so the rows one after another are one stream
    kernels.unpack_codes(inputs.zeros.view(np.uint8), codes.size, bits, codes)
    zero = codes.reshape(layout.G, layout.N)
    if inputs.zero_type == kernels.ZERO_PACKED_V1:  # as AutoGPTQ: (stored + 1) & mask
        zero = (zero + 1) & ((1 << bits) - 1)
    scales = np.asarray(scales)
    zeros = zero.astype(scales.dtype if scales.dtype.kind == "f" else np.float16)  # exact
    comps = {"packed_weight": inputs.qweight.view("<i4"), "scales": scales, "zeros": zeros}
    if inputs.g_idx is not None:
        comps["g_idx"] = inputs.g_idx
    return Tensor(
        comps,
        shape=(layout.N, layout.K),
        format="quantized_group",
        attributes={**_attributes(bits, group_size), **(attributes or {})},
    )


def to_gptq(t: Tensor) -> Dict[str, np.ndarray]:
    """A quantized_group object in our convention as a GPTQ checkpoint's tensors
    (the inverse of :func:`from_gptq`): ``qweight`` int32 ``[K*bits/32, N]`` as
    stored, ``qzeros`` int32 ``[G, N*bits/32]`` holding ``zero - 1`` packed LSB-first
    (AutoGPTQ's v1 layout), ``scales`` ``[G, N]`` and ``g_idx`` int32 ``[K]``
    (``k // group_size`` when the object has none, as AutoGPTQ writes it)."""
    inputs = _from_tensor(t)
    layout = inputs.layout
    mask = (1 << layout.bits) - 1
    if inputs.zeros is None:
        zero = np.full((layout.G, layout.N), 1 << (layout.bits - 1), np.int64)
    else:
        z = np.asarray(t.components["zeros"])
        z = z.view(np.uint16) if z.dtype.name == "bfloat16" else z
        z = _float_values(z).reshape(layout.G, layout.N)
        if not np.array_equal(z, np.round(z)) or z.min(initial=0) < 0 or z.max(initial=0) > mask:
            raise UnsupportedError(
                "zero points that are not integer codes cannot be GPTQ "
                "qzeros: load with dequantize=True"
            )
        zero = z.astype(np.int64)
    if layout.N % layout.per:
        raise UnsupportedError(
            f"N={layout.N} is not a multiple of {layout.per}: GPTQ qzeros need whole int32 words"
        )
    qzeros = pack_codes(((zero - 1) & mask).T, layout.bits).T.copy()
    g_idx = (
        np.asarray(inputs.g_idx, np.int32)
        if inputs.g_idx is not None
        else (np.arange(layout.K) // layout.group_size).astype(np.int32)
    )
    scales = np.asarray(t.components["scales"]).reshape(layout.G, layout.N)
    words = _int32_words(t.components["packed_weight"], "packed_weight", {})
    # values, not bytes: native int32 on any host (the stored words are little-endian)
    qweight = words.reshape(-1, layout.N).astype(np.uint32).view(np.int32)
    return {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}


def _float_values(arr):
    """Float values of an f16/f32 array, or of bf16 bits (uint16)."""
    if arr.dtype == np.uint16:
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.float64)


def _packing(bits):
    return "32_per_3_i32" if bits == 3 else f"{32 // bits}_per_i32"


def _attributes(bits, group_size):
    return {
        "bits": bits,
        "group_size": group_size,
        "packing": _packing(bits),
        "pack_axis": 0,
        "pack_order": "lsb_first",
    }


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes ``[K, N]`` (K a whole number of blocks) packed down axis 0 into int32
    ``[K * bits / 32, N]``: per column one LSB-first bit stream, code k at bit
    ``k * bits`` (so 3-bit codes straddle words, as AutoGPTQ packs them)."""
    codes = np.asarray(codes).astype(np.uint64)
    per, width = _contract.block_codes(bits), 3 if bits == 3 else 1
    blocks = codes.reshape(codes.shape[0] // per, per, -1)
    words = np.zeros((blocks.shape[0], width, blocks.shape[2]), np.uint64)
    for j in range(per):
        w, shift = divmod(j * bits, 32)
        words[:, w] |= (blocks[:, j] << np.uint64(shift)) & np.uint64(0xFFFFFFFF)
        if shift + bits > 32:
            words[:, w + 1] |= blocks[:, j] >> np.uint64(32 - shift)
    return words.astype(np.uint32).reshape(-1, codes.shape[1]).view(np.int32)


def quantize(
    weight: np.ndarray, *, bits: int = 4, group_size: int = 128, sym: bool = False
) -> Tensor:
    """Round-to-nearest group quantization of a ``[N_out, K_in]`` weight, as a
    quantized_group object (for users without a GPTQ toolchain, and for tests).

    Asymmetric: per (group, output row) ``scale = (max - min) / (2**bits - 1)`` and
    ``zero = round(-min / scale)``; symmetric: zero ``2**(bits-1)`` and ``scale =
    2 * max|w| / (2**bits - 1)`` (GPTQ's choice).  Scales and zeros are float16."""
    w = np.asarray(weight, np.float32)
    weight_group_size = group_size  # stored as given: -1 stays -1, as GPTQ configs say
    if w.ndim != 2:
        raise ValueError(f"quantize needs a 2-D [N_out, K_in] weight, got shape {w.shape}")
    layout = _Layout(w.shape[0], w.shape[1], bits, group_size, {})
    N, K, G, qmax = layout.N, layout.K, layout.G, (1 << bits) - 1
    group_size = layout.group_size  # -1 resolved: one group per row
    pad = G * group_size - K
    wg = np.pad(w, ((0, 0), (0, pad)), constant_values=np.nan).reshape(N, G, group_size)
    if sym:
        amax = np.nanmax(np.abs(wg), axis=2)
        scale = np.where(amax > 0, 2 * amax / qmax, 1.0)
        zero = np.full_like(scale, 1 << (bits - 1))
    else:
        lo, hi = np.minimum(np.nanmin(wg, axis=2), 0), np.maximum(np.nanmax(wg, axis=2), 0)
        scale = np.where(hi > lo, (hi - lo) / qmax, 1.0)
        zero = np.clip(np.round(-lo / scale), 0, qmax)
    scale16 = scale.astype(np.float16)
    scale16[scale16 == 0] = np.float16(1)
    s = scale16.astype(np.float32)
    codes = np.clip(np.round(wg / s[:, :, None] + zero[:, :, None]), 0, qmax)
    codes = np.nan_to_num(codes).reshape(N, G * group_size)[:, :K].astype(np.uint32)
    comps = {"packed_weight": pack_codes(codes.T, bits), "scales": scale16.T.copy()}
    if not sym:
        comps["zeros"] = zero.T.astype(np.float16)
    return Tensor(
        comps,
        shape=(N, K),
        format="quantized_group",
        attributes=_attributes(bits, weight_group_size),
    )
