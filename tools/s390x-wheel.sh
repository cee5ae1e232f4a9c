#!/bin/bash
# The wheel recipe of [tool.cibuildwheel], by hand: build a ztensor wheel, repair it
# with auditwheel, install it into a fresh venv, and run the test suite against the
# INSTALLED package, on the C kernels and on the numpy fallback.
#
#   tools/s390x-wheel.sh SRC WORK
#
# tools/s390x-test.sh runs this inside its emulated s390x root (no container engine
# here, so cibuildwheel itself cannot run); nothing in it is s390x-specific.  It needs
# python3 with venv, patchelf, auditwheel importable by python3, and $WHEELHOUSE
# holding the wheels [build-system] requires: the build runs with build isolation
# and no index (the root cannot reach PyPI: no CA for this network's TLS proxy).
#
# The venv sees the system's site-packages, where the root's Debian packages are:
# numpy, cbor2, zstandard (the wheel's dependencies; pip checks them against the
# wheel's metadata) and pytest, scipy, hypothesis.  ztensor itself is only ever the
# wheel: the suite is copied to WORK/suite-compiled and WORK/suite-fallback and run
# from there, both at once, and a pytest plugin
# (tools/installed_wheel_check.py) stops the run unless ztensor is imported from the
# venv's site-packages, installed from this very wheel.
set -euo pipefail
SRC=$(cd "${1:?source folder}" && pwd)
WORK=${2:?work folder}
WHEELHOUSE=${WHEELHOUSE:-/opt/wheelhouse}
PROFILE=${HYPOTHESIS_PROFILE:-qemu}

step() { printf '[wheel %(%H:%M:%S)T] %s\n' -1 "$*"; }
rm -rf "$WORK"; mkdir -p "$WORK/raw" "$WORK/dist"

step "venv $WORK/venv (system site-packages: Debian's numpy, cbor2, zstandard, pytest)"
python3 -m venv --system-site-packages "$WORK/venv"
PY=$WORK/venv/bin/python

# pip wheel = cibuildwheel's pip frontend: an isolated build env whose setuptools and
# Cython come from the wheelhouse, checked against pyproject.toml's [build-system]
step "build: pip wheel (ZTENSOR_OPT=${ZTENSOR_OPT:--O3})"
t0=$SECONDS
PIP_NO_INDEX=1 PIP_FIND_LINKS=$WHEELHOUSE PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$PY" -m pip wheel --no-deps --no-cache-dir -w "$WORK/raw" "$SRC" >"$WORK/build.log" 2>&1 ||
  { tail -n 60 "$WORK/build.log"; echo "wheel: the build failed (log above)"; exit 1; }
raw=$(ls "$WORK"/raw/ztensor-*.whl)
step "built ${raw##*/} in $((SECONDS - t0)) s"

step "auditwheel show / repair"
python3 -m auditwheel show "$raw" | tee "$WORK/show.txt"
python3 -m auditwheel repair -w "$WORK/dist" "$raw" >"$WORK/repair.log" 2>&1 ||
  { cat "$WORK/repair.log"; echo "wheel: auditwheel could not repair ${raw##*/} (above)"; exit 1; }
wheel=$(ls "$WORK"/dist/ztensor-*.whl)
python3 -m auditwheel show "$wheel" >"$WORK/show-repaired.txt"
cat "$WORK/show-repaired.txt"
verdict=$(tr '\n' ' ' <"$WORK/show.txt" | grep -o 'consistent with the following platform tag: "[^"]*"' || true)
[ -n "$verdict" ] || { echo "wheel: auditwheel names no platform tag for ${raw##*/}"; exit 1; }

step "install ${wheel##*/} (no index: the dependencies must already be satisfied)"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install --no-index --no-cache-dir "$wheel" \
  >"$WORK/install.log" 2>&1 || { cat "$WORK/install.log"; exit 1; }

# the suite alone, away from the source: tests (tests/data included), the docs that
# tests check against the code, and pyproject.toml for pytest's settings and markers;
# one copy for each run, so that the two runs below share no folder
for label in compiled fallback; do
  mkdir -p "$WORK/suite-$label"
  cp -R "$SRC/tests" "$SRC/docs" "$SRC/pyproject.toml" "$SRC/tools/installed_wheel_check.py" \
    "$WORK/suite-$label/"
done
export PATH=$WORK/venv/bin:$PATH ZTENSOR_WHEEL=$wheel HYPOTHESIS_PROFILE=$PROFILE
suite() {   # suite LABEL [VAR=value...]: one run in its own copy, its output in WORK/LABEL.log
  local label=$1; shift
  # python -m pytest puts the working folder (the suite's copy, no ztensor in it) on
  # sys.path, which is how the plugin next to the tests is found
  (cd "$WORK/suite-$label" && env "$@" "$PY" -m pytest -q -p no:cacheprovider \
      -p installed_wheel_check --basetemp="$WORK/tmp-$label" \
      -m "not reference" ${PYTEST_ARGS:-tests}) >"$WORK/$label.log" 2>&1
}
# the two runs side by side: emulation runs each on one core, and one after the
# other they took about 40 minutes of CI's 90
step "suites against the installed wheel: compiled and fallback, side by side"
suite compiled & compiled=$!
suite fallback ZTENSOR_PUREPYTHON=1 & fallback=$!
rc=0
declare -A counts
for label in compiled fallback; do
  wait "${!label}" || rc=1
  step "suite against the installed wheel: $label"
  cat "$WORK/$label.log"
  counts[$label]=$(grep -E '(passed|failed|error|no tests ran)' "$WORK/$label.log" | tail -n1 || true)
done

echo "== wheel:      ${wheel##*/}"
echo "   auditwheel: ${raw##*/} is $verdict"
echo "   compiled:   ${counts[compiled]}"
echo "   fallback:   ${counts[fallback]}"
exit $rc
