# python_of X.Y: the newest installed Python of that minor version, pyenv's,
# else one on PATH (sourced by .ci/run and tools/build_wheels.sh).
python_of() {
  local version
  if command -v pyenv >/dev/null; then
    version=$(pyenv versions --bare | grep -E "^$1\.[0-9]+$" | tail -1 || true)
    if [ -n "$version" ]; then echo "$(pyenv root)/versions/$version/bin/python$1"; return; fi
  fi
  command -v "python$1" || { echo "needs a Python $1" >&2; return 2; }
}
