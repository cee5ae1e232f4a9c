#!/bin/bash
# Run the fuzz targets against the sanitized build for a given time each (thirteen).
#   tools/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]   (default 300 s, every target)
# Corpora live in build/fuzz-corpus/<target> (seeded from tests/data for the reader);
# crashes are written to build/fuzz-crashes/; copy each into tests/data/fuzz-regressions/
# and the test suite replays it.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-300}; shift || true
targets=${*:-reader kernels sparse importers manifest manifest_table quantized cli foreign_structured sharded remote zstd_frames exports}
# ZTENSOR_FUZZ_UNSANITIZED=1 runs the in-tree build without ASan, 4-6 times faster: for
# the targets that drive Python parsers (foreign_structured, sharded, remote, cli), whose
# C kernels the sanitized targets cover
if [ -n "${ZTENSOR_FUZZ_UNSANITIZED:-}" ]; then
  pypath=.; preload=
else
  [ -d build/fuzz ] || bash tools/fuzz/build.sh
  pypath=build/fuzz
  preload=$(python -c 'import atheris, os; print(os.path.join(atheris.path(), "asan_with_fuzzer.so"))')
fi
mkdir -p build/fuzz-crashes build/fuzz-logs
for t in $targets; do
  corpus=build/fuzz-corpus/$t
  mkdir -p "$corpus"
  case $t in reader|cli) cp -n tests/data/*/*.zt "$corpus"/ 2>/dev/null || true;; esac
  [ "$t" = importers ] && [ ! -e "$corpus/seed-npy" ] && python tools/fuzz/seed_importers.py "$corpus"
  [ "$t" = foreign_structured ] && [ ! -e "$corpus/raw-npy-0" ] && python tools/fuzz/seed_structured.py "$corpus"
  case $t in sharded|remote) [ -e "$corpus/gen-$t-0" ] || python tools/fuzz/seed_structured.py "$corpus" "$t";; esac
  echo "== fuzz_$t for ${secs}s"
  PYTHONPATH=$pypath:tools/fuzz LD_PRELOAD="$preload" \
    ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:handle_segv=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    python "tools/fuzz/fuzz_$t.py" "$corpus" -max_total_time="$secs" -rss_limit_mb=3072 \
      -timeout=20 -artifact_prefix=build/fuzz-crashes/"$t"- -print_final_stats=1 2>&1 |
    tee "build/fuzz-logs/$t-$(date +%Y%m%d-%H%M%S).log" |
    grep -E "^(#[0-9]+[[:space:]]+(INITED|DONE)|stat::|==[0-9]+==ERROR|SUMMARY|Traceback|.*Error)" | tail -n 20
done
