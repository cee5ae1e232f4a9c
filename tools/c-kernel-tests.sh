#!/bin/bash
# The plain C tests of csrc/ (tests/c/test_kernels.c): native build, a valgrind run
# when valgrind is installed, and a static s390x (big-endian) build run under
# qemu-user.  Installs gcc-s390x-linux-gnu and qemu-user-static with apt when
# missing (Debian).  Exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-O2 -std=gnu99 -ffp-contract=off -Wall -Wextra -Werror -Icsrc tests/c/test_kernels.c csrc/*.c -lm)

echo "== C kernel tests, native ($(uname -m))"
gcc "${flags[@]}" -o "$out/native"
"$out/native"
echo "== C kernel tests, native, with copy.c's own streaming loop (what other C libraries than glibc run)"
gcc "${flags[@]}" -DZT_COPY_TEST_OWN_STREAM -o "$out/own-stream"
"$out/own-stream"
if command -v valgrind >/dev/null; then
  echo "== C kernel tests under valgrind"
  valgrind -q --error-exitcode=1 --leak-check=full "$out/native" >/dev/null
  echo "valgrind: clean"
fi

if ! command -v s390x-linux-gnu-gcc >/dev/null || ! command -v qemu-s390x-static >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-s390x-linux-gnu qemu-user-static \
    >/dev/null
fi
echo "== C kernel tests, s390x (big-endian) under qemu-user"
s390x-linux-gnu-gcc "${flags[@]}" -static -o "$out/s390x"
qemu-s390x-static "$out/s390x"
