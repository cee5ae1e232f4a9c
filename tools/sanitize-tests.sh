#!/bin/bash
# The normal test suite against C kernels built with AddressSanitizer and
# UndefinedBehaviorSanitizer (clang-14; the same build the fuzzers use), then a short
# smoke run of each fuzz target.  Installs clang-14 and atheris when missing.
#   tools/sanitize-tests.sh [FUZZ_SECONDS_PER_TARGET]   (default 20; 0 skips fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-20}
if ! command -v clang-14 >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
fi
# building in place needs the build tools pip normally keeps in an isolated environment
python -c "import atheris, Cython, setuptools" 2>/dev/null ||
  python -m pip install --quiet atheris "cython>=3" setuptools
bash tools/fuzz/build.sh
asan=$(python -c 'import atheris, os; print(os.path.join(atheris.path(), "asan_with_fuzzer.so"))')
echo "== test suite on the sanitized kernels"
# run inside the build copy, so its instrumented extension is the one imported
(cd build/fuzz && LD_PRELOAD="$asan" ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
   UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 HYPOTHESIS_PROFILE=default \
   python -m pytest -q -p no:cacheprovider -m "not reference" -x tests)
if [ "$secs" != 0 ]; then
  bash tools/fuzz/run.sh "$secs"
  if ls build/fuzz-crashes/* >/dev/null 2>&1; then
    echo "fuzzing found crashes:"; ls build/fuzz-crashes; exit 1
  fi
fi
