"""Work and memory follow the bytes present and what the caller asked for, never a
size a file merely declares (docs/safety.md).  Each case runs in a child process
under RLIMIT_AS: a declared size that is trusted shows as a MemoryError, a
LimitError about memory or a crash there, instead of only as a big number here."""
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux",
                                reason="RLIMIT_AS is Linux's")

# The child imports numpy, zstandard and ztensor (a few hundred MiB of address space:
# libraries, thread stacks), then lowers its limit to that much plus ALLOWANCE.
ALLOWANCE = 256 << 20

PRELUDE = textwrap.dedent("""
    import resource, sys, numpy as np, zstandard, cbor2, struct, zipfile, io
    import ztensor
    def limit(extra):
        used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + extra, used + extra))
        try:  # is the limit enforced?  (qemu-user, for one, does not pass it on)
            probe = bytearray(2 * extra + (64 << 20))
        except MemoryError:
            return
        del probe
        print("RLIMIT_AS NOT ENFORCED"); sys.exit(77)
    def v1_file(manifest, blobs=b""):
        body = b"ZTEN1000" + blobs
        body += bytes(-len(body) % 64)
        m = cbor2.dumps(manifest)
        return body + m + struct.pack("<Q", len(m)) + b"ZTEN1000"
    def expect_clean_error(fn):
        try:
            fn()
        except MemoryError:
            print("MEMORYERROR"); sys.exit(3)
        except ztensor.ZTensorError as exc:
            print("CLEAN", type(exc).__name__, exc); return
        print("NO ERROR")
""")


def run_child(body: str, timeout=120):
    code = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", code, str(ALLOWANCE)], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode == 77 and "RLIMIT_AS NOT ENFORCED" in proc.stdout:
        pytest.skip("RLIMIT_AS is not enforced on this host (an emulator): the bounds "
                    "are tested on native hosts")
    return proc.returncode, proc.stdout + proc.stderr


def zstd_manifest(payload_len, ulen, dtype="f32", shape=None, version="1.2.0", sized=True):
    comp = {"dtype": dtype, "offset": 64, "length": payload_len, "encoding": "zstd"}
    if sized:
        comp["uncompressed_length"] = ulen
    return {"version": version, "objects": {"z": {
        "shape": shape if shape is not None else [ulen // 4], "format": "dense",
        "components": {"data": comp}}}}


def test_declared_zstd_size_is_not_allocated():
    # 232 bytes declaring 3 GiB: refused at open, nothing allocated
    rc, out = run_child("""
        payload = zstandard.ZstdCompressor().compress(b"\\0" * 64)
        data = v1_file(%s, bytes(56) + payload)
        limit(int(sys.argv[1]))
        expect_clean_error(lambda: ztensor.Reader(data)["z"])
    """ % "{'version': '1.2.0', 'objects': {'z': {'shape': [3 << 28], 'format': 'dense', "
          "'components': {'data': {'dtype': 'f32', 'offset': 64, 'length': len(payload), "
          "'encoding': 'zstd', 'uncompressed_length': 3 << 30}}}}}")
    assert rc == 0 and "CLEAN FormatError" in out and "can produce" in out, out


def test_a_lying_stream_costs_what_it_decodes_to():
    # a declared size 64 KiB of zstd *could* produce (2 GiB), but the stream stops
    # after 64 KiB: the buffer grows only as bytes arrive
    rc, out = run_child("""
        import os
        payload = zstandard.ZstdCompressor().compress(os.urandom(1 << 16))
        declared = len(payload) * 32768 // 4 * 4          # the largest legal claim
        m = {"version": "1.2.0", "objects": {"z": {"shape": [declared // 4],
             "format": "dense", "components": {"data": {"dtype": "f32", "offset": 64,
             "length": len(payload), "encoding": "zstd", "uncompressed_length": declared}}}}}
        data = v1_file(m, bytes(56) + payload)
        assert declared > int(sys.argv[1]) * 4, declared  # far above the allowance
        limit(int(sys.argv[1]))
        expect_clean_error(lambda: ztensor.Reader(data)["z"])
    """)
    assert rc == 0 and "CLEAN FormatError" in out and "ends after" in out, out


def test_v11_unsized_zstd_stops_at_what_the_bytes_can_make():
    rc, out = run_child("""
        payload = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(1 << 16))
        m = {"version": "1.1.0", "objects": {"z": {"shape": [1 << 40], "format": "dense",
             "components": {"data": {"dtype": "u8", "offset": 64, "length": len(payload),
             "encoding": "zstd"}}}}}
        data = v1_file(m, bytes(56) + payload)
        limit(int(sys.argv[1]))
        expect_clean_error(lambda: ztensor.Reader(data)["z"])
    """)
    assert rc == 0 and "CLEAN" in out, out


def test_dequantize_with_group_size_one_fits_in_proportion():
    # a 12.7 KB file used to need 6.2 GiB of scratch: 16 x G x 2**bits floats per thread
    rc, out = run_child("""
        K = 1 << 20
        q = ztensor.quantize(np.ones((1, K), np.float32), bits=4, group_size=1)
        limit(int(sys.argv[1]))
        w = ztensor.dequantize(q, dtype=np.float16)
        print("OK", float(w.min()), float(w.max()))
    """)
    assert rc == 0 and "OK 1.0 1.0" in out, out


def test_npz_whose_zip_directory_lies_is_refused(tmp_path):
    path = tmp_path / "lie.npz"
    rc, out = run_child(f"""
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {{"descr": "<f8", "fortran_order": False,
                                                   "shape": (1 << 28,)}})  # 2 GiB
        member = buf.getvalue() + bytes(64)
        with zipfile.ZipFile({str(path)!r}, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("x.npy", member)
        raw = bytearray(open({str(path)!r}, "rb").read())
        # the central directory's uncompressed size: claim 4 GiB, above the 2 GiB declared
        cd = raw.rfind(b"PK\\x01\\x02")
        raw[cd + 24:cd + 28] = (0xFFFFFFFF).to_bytes(4, "little")
        open({str(path)!r}, "wb").write(raw)
        from ztensor.tools import convert_inputs
        limit(int(sys.argv[1]))
        def convert():
            for _ in convert_inputs.open_any({str(path)!r})[1]:
                pass
        expect_clean_error(convert)
    """)
    assert rc == 0 and "CLEAN" in out, out


def test_cli_turns_memory_exhaustion_into_one_line(tmp_path):
    # the CLI under a tight limit on a file that is legal but needs more than allowed
    big = tmp_path / "big.zt"
    rc, out = run_child(f"""
        payload = zstandard.ZstdCompressor().compress(bytes(1 << 29))
        m = {{"version": "1.2.0", "objects": {{"z": {{"shape": [1 << 27], "format": "dense",
             "components": {{"data": {{"dtype": "f32", "offset": 64, "length": len(payload),
             "encoding": "zstd", "uncompressed_length": 1 << 29}}}}}}}}}}
        open({str(big)!r}, "wb").write(v1_file(m, bytes(56) + payload))
        from ztensor.tools import cli
        limit(int(sys.argv[1]) // 4)
        sys.exit(cli.main(["verify", {str(big)!r}]))
    """)
    assert rc in (1, 2) and "Traceback" not in out, out
