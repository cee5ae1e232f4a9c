"""The checkpoint view of a file: the flat name -> tensor mapping that
safetensors-style loaders (``ztensor.numpy.load_file``, ``ztensor.torch.load_file``,
``safe_open``) hand out, for files that hold more than dense objects.

* dense objects: under their own names;
* quantized_group objects (GPTQ): by default under the names GPTQ checkpoints use,
  so existing GPTQ loaders (AutoGPTQ, GPTQModel, transformers) take them as they
  are: ``<prefix>.qweight``, ``.qzeros`` (v1 layout: zero - 1), ``.scales`` and
  ``.g_idx``, where ``<prefix>`` is the object's name without a trailing
  ``.weight``; with ``dequantize=True``, under their own name as the dense weight;
* other formats (sparse, unknown): a FormatError naming the object and saying what
  to use instead (``Reader.read``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ztensor.errors import UnsupportedError
from ztensor.foreign.names import NameTable
from ztensor.formats import quantized

GPTQ_ROLES = ("qweight", "qzeros", "scales", "g_idx")


def entries(reader: Any, dequantize: bool = False) -> Dict[str, Tuple[str, Optional[str]]]:
    """checkpoint name -> (object name, GPTQ role or None), in file order.  Two
    objects whose checkpoint names meet (a quantized ``a.weight`` and a dense
    ``a.scales``; quantized ``a`` and ``a.weight``) are a FormatError naming both:
    one would hide the other."""
    pairs: List[Tuple[str, Tuple[str, Optional[str]]]] = []
    format_of = reader.internals.format_of  # no spec built per object (reader.py)
    for name in reader.keys():
        fmt = format_of(name)
        if fmt == "dense" or (fmt == "quantized_group" and dequantize):
            pairs.append((name, (name, None)))
        elif fmt == "quantized_group":
            prefix = name[: -len(".weight")] if name.endswith(".weight") else name
            for role in GPTQ_ROLES:
                pairs.append((f"{prefix}.{role}", (name, role)))
        else:
            raise UnsupportedError(
                f"a {fmt} object has no flat tensor form: read it with Reader.read()",
                path=reader.path,
                obj=name,
            )
    out = dict(pairs)
    if len(out) != len(pairs):  # a name given twice: find the pair, and say so
        taken = NameTable(reader.path)
        for key, (obj, gptq) in pairs:
            taken.claim(key, obj if gptq is None else f"{obj} (its GPTQ {gptq})")
    return out


def array(
    reader: Any, name: str, role: Optional[str], *, copy: bool = False, dtype: Any = None
) -> np.ndarray:
    """The numpy array behind one checkpoint name."""
    meta = reader.metadata(name)
    if meta.format == "dense":
        return reader.read_numpy(name, copy=copy)
    obj = reader.read(name, copy=copy)  # copy: owned components, so owned GPTQ arrays
    if role is not None:
        return quantized.dequantize_read(obj, reader.path, name, role)
    return quantized.dequantize_read(obj, reader.path, name, dtype=dtype or _scale_dtype(obj))


def _scale_dtype(obj) -> Any:
    scales = obj.components.get("scales")
    if scales is None:  # an object in another convention: dequantize says why not
        return np.float16
    scales = np.asarray(scales)
    if scales.dtype == np.uint16 or scales.dtype.name == "bfloat16":
        return "bfloat16"
    return np.float32 if scales.dtype == np.float32 else np.float16
