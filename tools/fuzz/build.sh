#!/bin/bash
# Build a copy of ztensor whose C kernels are compiled with clang's AddressSanitizer,
# UndefinedBehaviorSanitizer and libFuzzer coverage instrumentation, for the atheris
# fuzz targets beside this script.  Output: build/fuzz (git-ignored), importable with
# PYTHONPATH=build/fuzz.  Needs clang-14 (apt-get install clang-14) and atheris.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${1:-build/fuzz}
rm -rf "$dest" && mkdir -p "$dest"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -C "$dest" -xf -
cd "$dest"
export CC=clang-14 LDSHARED="clang-14 -shared"
export ZTENSOR_OPT=-O1
export ZTENSOR_EXTRA_CFLAGS="-g -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
export ZTENSOR_EXTRA_LDFLAGS="-fsanitize=address,undefined,fuzzer-no-link"
python setup.py -q build_ext --inplace >build.log 2>&1 || { tail -n 40 build.log; exit 1; }
echo "sanitized build ready in $PWD"
