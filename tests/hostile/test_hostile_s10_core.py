"""Session 10's closing round on the core paths: rules the red team left open.

Each test builds a file the writer refuses (by hand, or by editing a real file) and
checks every read path refuses it with a FormatError naming the file and object."""
import numpy as np
import pytest

import ztensor
from crafted import v1_file  # tests/ is on sys.path: conftest.py

Q8_0 = {"ggml_type": "Q8_0", "ggml_type_id": 8, "block_elements": 32, "block_bytes": 34}


def q8_0_blocks(nblocks):
    blocks = np.zeros((nblocks, 34), np.uint8)
    blocks[:, :2] = np.array([0.5], np.float16).view(np.uint8)
    blocks[:, 2:] = np.arange(32, dtype=np.int8).view(np.uint8)
    return blocks.reshape(-1)


def gguf_blocks_file(shape, nblocks):
    blob = q8_0_blocks(nblocks).tobytes()
    manifest = {"version": "1.2.0", "objects": {"q": {
        "shape": list(shape), "format": "gguf_blocks", "attributes": dict(Q8_0),
        "components": {"blocks": {"dtype": "u8", "offset": 64, "length": len(blob)}}}}}
    return v1_file(manifest, bytes(56) + blob)


@pytest.mark.parametrize("shape", [(2, 16), (4, 8), (16, 2, 2)])
def test_gguf_blocks_rows_that_split_a_block_are_refused(tmp_path, shape):
    """ggml rows are whole blocks: shape (2, 16) of Q8_0 holds one 32-element block
    across two rows, which no ggml tool writes or reads.  The total count divides, so
    only the row rule catches it."""
    path = tmp_path / "rows.zt"
    path.write_bytes(gguf_blocks_file(shape, 1))
    with ztensor.Reader(str(path)) as r:
        with pytest.raises(ztensor.FormatError, match="innermost dimension") as exc:
            r.read("q")
        assert exc.value.path == str(path) and exc.value.obj == "q"
        with pytest.raises(ztensor.FormatError, match="innermost dimension"):
            r.verify()
    with pytest.raises(ztensor.FormatError, match="innermost dimension"):
        with ztensor.Writer(str(tmp_path / "w.zt")) as w:
            w.write("q", ztensor.Tensor({"blocks": q8_0_blocks(1)}, shape=shape,
                                        format="gguf_blocks", attributes=dict(Q8_0)))
    assert not (tmp_path / "w.zt").exists()


def test_gguf_blocks_whole_rows_still_dequantize(tmp_path):
    """The rule's other side: (2, 32) is two whole rows, and dequantizes to the
    block's values (scale 0.5 times -> 0..31)."""
    path = tmp_path / "ok.zt"
    path.write_bytes(gguf_blocks_file((2, 32), 2))
    with ztensor.Reader(str(path)) as r:
        values = ztensor.dequantize(r.read("q"))
        r.verify()
    np.testing.assert_array_equal(values, np.tile(np.arange(32, dtype=np.float32) * 0.5, (2, 1)))
