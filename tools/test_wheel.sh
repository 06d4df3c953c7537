#!/usr/bin/env bash
# The suite against what users install: builds the wheel for Python X.Y
# (tools/build_wheels.sh), installs it with its [cpu,test] extras into a fresh
# venv with no compiler on PATH, checks it (tools/check_wheel.py), and runs the
# whole suite from a copy of the checkout's tracked files without
# pyfunc_bridge/, so that the tests and every process they start import the
# installed package (PFB_TEST_INSTALLED=1 makes tests/conftest.py check it).
#
# Usage: tools/test_wheel.sh X.Y NUMPY_MINOR     e.g. tools/test_wheel.sh 3.12 2.5
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/python_of.sh
py=$1 numpy=$2
here=$PWD

# PFB_WHEEL=path: test that wheel (built by tools/build_wheels.sh) instead.
if [ -n "${PFB_WHEEL:-}" ]; then
  wheel=$PFB_WHEEL
else
  tools/build_wheels.sh "$py"
  tag=cp${py/./}
  wheel=$(ls wheelhouse/pyfunc_bridge-*-"$tag"-"$tag"-manylinux_*_x86_64.whl | tail -1)
fi
venv="$here/.venv-wheel-$py"
rm -rf "$venv"
"$(python_of "$py")" -m venv "$venv"

# PATH for the install and the checks: the venv and the few tools they run
# (sh for the service check's network namespace), no compiler.
nocc=$(mktemp -d)
tree=$(mktemp -d)
trap 'rm -rf "$nocc" "$tree"' EXIT
for tool in sh env unshare ip uname ldconfig; do
  if command -v "$tool" >/dev/null; then ln -s "$(command -v "$tool")" "$nocc/$tool"; fi
done
bare_path="$venv/bin:$nocc"
for cc in cc gcc g++ c++ clang; do
  if PATH=$bare_path command -v "$cc" >/dev/null; then echo "a compiler on PATH: $cc" >&2; exit 2; fi
done
start=$(date +%s)
PATH=$bare_path CC=/bin/false CXX=/bin/false \
  "$venv/bin/pip" install -q "$wheel[cpu,test]" "numpy==$numpy.*"
echo "installed $(basename "$wheel") and its dependencies in $(( $(date +%s) - start )) s"
PATH=$bare_path CC=/bin/false CXX=/bin/false "$venv/bin/python" tools/check_wheel.py

git ls-files -z | grep -zv '^pyfunc_bridge/' | xargs -0 cp --parents -t "$tree"
cd "$tree"
PFB_TEST_INSTALLED=1 "$venv/bin/python" -m pytest "${@:3}"
