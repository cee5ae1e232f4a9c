"""How a local file is mapped for reading (io/source.Source)."""
import os

import numpy as np
import pytest

import ztensor
import ztensor.numpy as znp


def _vm_flags(path):
    """The VmFlags of this process's mappings of ``path`` (Linux /proc/self/smaps)."""
    flags, current = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                current = head[5] if len(head) > 5 else None
            elif line.startswith("VmFlags:") and current == path:
                flags.append(line.split()[1:])
    return flags


def _platform_applies_the_advice(path):
    """Whether a mapping of ``path`` advised by hand shows the flag at all."""
    import mmap

    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            m.close()
            return False
        applied = any("hg" in flags for flags in _vm_flags(path))
        m.close()
    return applied


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"),
                    reason="mapping flags are read from Linux's /proc/self/smaps")
def test_a_mapped_file_asks_for_large_folios(tmp_path):
    """A file mapped for reading carries MADV_HUGEPAGE ("hg"): faulted in cold, it is
    read and then cached in large folios, which later loads map a few faults per
    2 MiB instead of one per 16 pages (io/source.ask_for_large_folios); a file too
    small to hold one large folio is left alone."""
    big, small = str(tmp_path / "big.zt"), str(tmp_path / "small.zt")
    znp.save_file({"w": np.ones(1 << 20, np.float32)}, big)
    znp.save_file({"w": np.ones(16, np.float32)}, small)
    if not _platform_applies_the_advice(big):
        pytest.skip("this platform does not apply MADV_HUGEPAGE to a file mapping "
                    "(qemu-user passes it to no one)")
    with ztensor.Reader(big) as r, ztensor.Reader(small) as s:
        assert r.read_numpy("w").sum() == 1 << 20 and s.read_numpy("w").sum() == 16
        big_flags, small_flags = _vm_flags(big), _vm_flags(small)
    assert big_flags and all("hg" in f for f in big_flags)
    assert small_flags and not any("hg" in f for f in small_flags)
