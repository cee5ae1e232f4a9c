"""csrc/'s numbers, as the compiled extension exports them from the headers, against
the one Python home of each (_contract.py, spec.py, manifest_table.py), which the
numpy fallback uses too: a header changed without its Python copy fails here.
(The status codes are checked in test_kernels_contract.py.)"""
import struct

import pytest

from ztensor import kernels, spec
from ztensor._native import contract as _contract
from ztensor._native import fallback as _fallback

_kernels = pytest.importorskip("ztensor._native._kernels")
C = _kernels.HEADER_CONSTANTS


def test_float_type_codes():
    assert C["float_types"] == {"F32": _contract.F32, "F16": _contract.F16,
                                "BF16": _contract.BF16}
    assert (kernels.F32, kernels.F16, kernels.BF16) == (_contract.F32, _contract.F16,
                                                        _contract.BF16)
    assert (_fallback.F32, _fallback.F16, _fallback.BF16) == (kernels.F32, kernels.F16,
                                                              kernels.BF16)


def test_fp8_kind_codes_are_positions_in_the_one_name_list():
    assert C["fp8_kinds"] == {name: code for code, name in enumerate(_contract.FP8_KINDS)}
    assert kernels.FP8_KINDS is _contract.FP8_KINDS
    assert _fallback.FP8_KINDS is _contract.FP8_KINDS
    assert _contract.FP8_KIND_COUNT == len(C["fp8_kinds"])


def test_zero_types():
    assert C["zero_types"] == {"ZERO_NONE": _contract.ZERO_NONE,
                               "ZERO_PACKED_V1": _contract.ZERO_PACKED_V1,
                               "ZERO_PACKED_V2": _contract.ZERO_PACKED_V2}
    for name in C["zero_types"]:
        assert getattr(kernels, name) == getattr(_fallback, name) == C["zero_types"][name]


def test_footer_sizes_and_families():
    assert C["magic_len"] == spec.MAGIC_SIZE == len(spec.MAGIC_V1) == len(spec.MAGIC_V0)
    assert C["tail_len"] == spec.TAIL_SIZE == spec.VERSIONS["1.2"].tail_size
    assert C["families"] == {"FAMILY_V0": _contract.FAMILY_V0,
                             "FAMILY_V1": _contract.FAMILY_V1}


@pytest.mark.parametrize("backend", [_kernels, _fallback], ids=["c", "python"])
def test_footer_magics_are_the_spec_table(backend):
    """csrc/footer.c keeps its magics private: both parsers must accept spec.py's
    magics (as the right family) and refuse one byte off."""
    manifest = b"\xa0"
    v1 = spec.MAGIC_V1 + manifest + struct.pack("<Q", 1) + spec.MAGIC_V1
    v0 = spec.MAGIC_V0 + manifest + struct.pack("<Q", 1)
    for data, family, info in ((v1, _contract.FAMILY_V1, spec.VERSIONS["1.2"]),
                               (v0, _contract.FAMILY_V0, spec.VERSIONS["0.1"])):
        head, tail = data[:spec.MAGIC_SIZE], data[-info.tail_size:]
        assert backend.footer_parse(head, tail, len(data), 1 << 20) == (
            family, spec.MAGIC_SIZE, 1)
        bad = bytes([head[0] ^ 1]) + head[1:]
        with pytest.raises(Exception, match="unknown magic"):
            backend.footer_parse(bad, tail, len(data), 1 << 20)


def test_blob_extent():
    assert C["blob_extent"] == _contract.BLOB_EXTENT == _fallback.EXTENT


def test_copy_stream_threshold():
    assert C["copy_stream_bytes"] == _contract.COPY_STREAM_BYTES == kernels.COPY_STREAM_BYTES


def test_manifest_table_columns():
    from ztensor.container import manifest_table as mt
    assert C["object_fields"] == _kernels.OBJECT_FIELDS == len(C["object_columns"])
    assert C["component_fields"] == _kernels.COMPONENT_FIELDS == len(C["component_columns"])
    assert C["object_row_bytes"] == 8 * C["object_fields"]   # no padding: column = field
    assert C["component_row_bytes"] == 8 * C["component_fields"]
    assert {name: getattr(mt, name) for name in C["object_columns"]} == C["object_columns"]
    assert ({name: getattr(mt, name) for name in C["component_columns"]}
            == C["component_columns"])
    assert C["mf_none"] == mt.NONE


def test_ggml_blocks_are_the_kernels_and_the_one_table():
    from ztensor import dtypes
    assert C["ggml_blocks"] == _contract.GGML_BLOCKS
    for gtype, (per, nbytes) in C["ggml_blocks"].items():
        assert dtypes.GGML_TYPES[gtype][1:3] == (per, nbytes)
