"""Build the compiled kernels: ztensor/_native/_kernels.pyx + csrc/*.c as one extension.

ZTENSOR_PUREPYTHON=1 at build time skips the extension (the package then runs on
its numpy fallback).  No -march=native: wheels must run on any CPU of their
architecture; the crc32c kernel picks its instruction at run time instead.
"""
import os
import sys
from glob import glob

from setuptools import Extension, setup


def extensions():
    if os.environ.get("ZTENSOR_PUREPYTHON") == "1":
        return []
    from Cython.Build import cythonize

    if sys.platform == "win32":
        args = ["/O2"]
    else:
        opt = os.environ.get("ZTENSOR_OPT", "-O3")  # lower under emulation to build faster
        # no contraction into fused multiply-adds (hosts with FMA: s390x, aarch64,
        # ppc64le) and no excess precision (GCC on s390x evaluates float in double in
        # ISO mode): every host must give the same bits as x86-64 and the fallback
        args = [opt, "-std=c99", "-ffp-contract=off", "-fexcess-precision=fast", "-Wall",
                "-Wextra", "-Wno-unused-function"]
        args += os.environ.get("ZTENSOR_EXTRA_CFLAGS", "").split()
    ext = Extension(
        "ztensor._native._kernels",
        sources=["ztensor/_native/_kernels.pyx"] + sorted(glob("csrc/*.c")),
        include_dirs=["csrc"],
        extra_compile_args=args,
        extra_link_args=os.environ.get("ZTENSOR_EXTRA_LDFLAGS", "").split(),
    )
    return cythonize([ext], language_level=3, quiet=True)


setup(ext_modules=extensions())
