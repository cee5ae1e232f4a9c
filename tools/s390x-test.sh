#!/bin/bash
# Build ztensor and run its test suite on an emulated big-endian host (IBM s390x).
#
#   tools/s390x-test.sh                 # build + full suite, compiled and fallback
#   tools/s390x-test.sh -- CMD...       # run CMD in the project copy inside the root
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
# is skipped instead of failing the run.  Cython 3 and a current hypothesis are
# pure-Python wheels the host downloads from PyPI and unpacks into the root (Debian
# 12 ships Cython 0.29), so the build in the root is the one pyproject.toml asks for.
# The project is copied in, the extension is built there at -O1 (emulated compiles
# are slow), and pytest runs twice: on the C kernels and with ZTENSOR_PUREPYTHON=1.
# Tests driving the x86-only reference implementation are deselected.
#
# Adapted from shared/recipes/s390x-chroot.sh, which documents the pitfalls solved
# here: the cffi backend package, debootstrap's /proc symlink under Docker-like
# hosts, proot's syscall gaps, and the mirror read from this machine's apt config.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${ZTENSOR_S390X_CACHE:-/var/tmp/ztensor-s390x}
SUITES=${SUITE:-bookworm trixie}       # tried in order; SUITE=x forces one
MODE=${MODE:-auto}
PKGS=python3,python3-dev,python3-numpy,python3-setuptools,python3-cbor2,python3-zstandard,python3-cffi-backend,python3-pytest,python3-scipy,python3-attr,python3-sortedcontainers,gcc,libc6-dev
WHEELS="Cython>=3.0,<3.2 hypothesis>=6.80,<7"  # pure-Python, unpacked into the root

if [ "${1:-}" = "--" ]; then shift; INNER="$*"; else
  INNER='ZTENSOR_OPT=-O1 python3 setup.py -q build_ext --inplace >/tmp/build.log 2>&1 ||
           { tail -n 60 /tmp/build.log; exit 1; }
         export HYPOTHESIS_PROFILE=qemu
         python3 -m pytest -q -p no:cacheprovider -m "not reference" &&
         ZTENSOR_PUREPYTHON=1 python3 -m pytest -q -p no:cacheprovider -m "not reference"'
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

# one cached root per suite, package list and wheel list: changing any builds a new one
root_for() { echo "$CACHE/root-$1-$(printf %s "$PKGS $WHEELS" | md5sum | cut -c1-8)"; }

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
  log "building the $SUITE s390x root in $ROOT (first run only, ~6 min) from $MIRROR"
  rm -rf "$ROOT"
  debootstrap --foreign --arch=s390x --variant=minbase --include="$PKGS" \
    "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/stage1.log" 2>&1 ||
    { tail -n 30 "$CACHE/stage1.log" >&2
      echo "s390x: debootstrap could not download the $SUITE root from $MIRROR (log above)" >&2; exit 1; }
  if [ -L "$ROOT/proc" ]; then rm -f "$ROOT/proc"; mkdir "$ROOT/proc"; fi
  in_root '/debootstrap/debootstrap --second-stage' >"$CACHE/stage2.log" 2>&1 ||
    { tail -n 30 "$CACHE/stage2.log" >&2; echo "s390x: the second debootstrap stage failed (log above)" >&2; exit 1; }
  rm -rf "$ROOT"/var/cache/apt/archives/*.deb
  # pure-Python wheels, unpacked straight into the root's dist-packages (no pip there)
  py=$(ls -d "$ROOT"/usr/lib/python3.* | head -n1); py=${py##*/}
  site=$ROOT/usr/local/lib/$py/dist-packages
  mkdir -p "$site" "$CACHE/wheels"
  rm -f "$CACHE"/wheels/*.whl
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation py \
    --python-version "${py#python}" -d "$CACHE/wheels" $WHEELS ||
    { echo "s390x: could not download $WHEELS from PyPI" >&2; exit 1; }
  for w in "$CACHE"/wheels/*.whl; do python3 -m zipfile -e "$w" "$site"; done
  touch "$ROOT/.complete"
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
log "rc=$rc after $((SECONDS - t0)) s"
exit $rc
