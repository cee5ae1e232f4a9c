"""Fuzz target 12: the zstd frame walker (csrc/zstd_frames.c) and the decode it
guards.  Real frames (random data, every compressor setting, several frames,
skippable ones) are cut, extended and have header bytes changed; then both kernel
backends must give one verdict, and a decode must return exactly whole frames'
data or raise a ZTensorError (never the data of a stream cut inside a frame)."""
import zstandard

from common import LIMITS, only_ztensor_errors, run
from ztensor._native import fallback
from ztensor import kernels
from ztensor.io import zstd_stream

SKIPPABLE_MAGIC = b"\x50\x2a\x4d\x18"


def frames(fdp):
    out, data = [], b""
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        if fdp.ConsumeBool():
            payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
            out.append(SKIPPABLE_MAGIC + len(payload).to_bytes(4, "little") + payload)
            continue
        piece = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4096)) * fdp.ConsumeIntInRange(1, 8)
        c = zstandard.ZstdCompressor(level=fdp.ConsumeIntInRange(1, 9),
                                     write_checksum=fdp.ConsumeBool(),
                                     write_content_size=fdp.ConsumeBool())
        out.append(c.compress(piece))
        data += piece
    return out, data


def test_one_input(raw: bytes):
    import atheris
    fdp = atheris.FuzzedDataProvider(raw)
    parts, data = frames(fdp)
    stored = bytearray(b"".join(parts))
    edit = fdp.ConsumeIntInRange(0, 3)
    if edit == 1 and stored:  # cut
        del stored[fdp.ConsumeIntInRange(0, len(stored) - 1):]
    elif edit == 2:  # extend
        stored += fdp.ConsumeBytes(fdp.ConsumeIntInRange(1, 12))
    elif edit == 3 and stored:  # change header-sized runs of bytes
        for _ in range(fdp.ConsumeIntInRange(1, 4)):
            at = fdp.ConsumeIntInRange(0, len(stored) - 1)
            stored[at] = fdp.ConsumeIntInRange(0, 255)
    stored = bytes(stored)
    verdict = kernels.zstd_frames(stored)
    assert verdict == fallback.zstd_frames(stored), (verdict, fallback.zstd_frames(stored))
    with only_ztensor_errors():
        got = zstd_stream.zstd_decode(stored, None, LIMITS)
        assert verdict[0] == 0, "decoded bytes that are not whole frames"
        if edit == 0:
            assert bytes(got) == data


if __name__ == "__main__":
    run(test_one_input)
