# Sourced by build-book.sh and run-tests.sh: create a virtual environment and install what is missing.
# FASTJAX_LEG picks the environment:
#   pinned (default): .venv, Python 3.11, pyproject.toml's dependencies held at constraints-py311.txt
#                     (with torch and pyPLNmodels, the book and the site tests);
#   newest:           .venv312, Python 3.12, the newest jax/jaxlib/flax/equinox/optax pyproject.toml admits,
#                     no torch (pyPLNmodels is installed without its dependencies, for its data files).
# Re-installs only when pyproject.toml or the constraints changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LEG="${FASTJAX_LEG:-pinned}"

find_python312() {  # python3.12 on PATH, else pyenv's; only one that really runs (pyenv shims may not)
  local candidates=(python3.12)
  if command -v pyenv >/dev/null; then candidates+=("$(pyenv root)"/versions/3.12*/bin/python3.12); fi
  for p in "${candidates[@]}"; do
    if "$p" -c "import sys; assert sys.version_info[:2] == (3, 12)" >/dev/null 2>&1; then command -v "$p"; return; fi
  done
  return 1
}

# (This file is sourced: its variables live on in the caller, so none of them is read from outside.)
case "$LEG" in
  pinned) VENV=.venv; LEG_PYTHON=python3; LEG_VERSION="" ;;
  newest) VENV=.venv312; LEG_PYTHON="$(find_python312 || true)"; LEG_VERSION=3.12 ;;
  *) echo "setup: FASTJAX_LEG must be pinned or newest, not '$LEG'"; exit 2 ;;
esac
# `bash scripts/setup-env.sh --find-python`: print the interpreter of this leg, or fail when there is none
if [ "${1:-}" = --find-python ]; then [ -n "$LEG_PYTHON" ] && echo "$LEG_PYTHON"; exit $?; fi
if [ -z "$LEG_PYTHON" ]; then echo "setup: no Python 3.12 for the $LEG leg on this machine"; exit 3; fi

venv_version() { "$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
if [ -x "$VENV/bin/python" ] && [ -n "$LEG_VERSION" ] && [ "$(venv_version)" != "$LEG_VERSION" ]; then
  echo "setup: $VENV has Python $(venv_version), not $LEG_VERSION: making it again"
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($LEG_PYTHON --version)"
  "$LEG_PYTHON" -m venv "$VENV" || { echo "setup: could not create $VENV with $LEG_PYTHON"; exit 1; }
fi
want="$(cat pyproject.toml constraints-py311.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$VENV/.installed" 2>/dev/null || true)" != "$want" ]; then
  echo "setup: installing the $LEG set into $VENV (pyproject.toml)"
  pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  # uv installs the pinned set, bytecode compiled, in 54 s where pip took 140 s (this machine,
  # quiet, a new venv each, caches warm). It does not read pip's configuration, so
  # pip_settings_for_uv.py hands it pip's constraints, wheel folders and indexes, and makes it pick
  # across indexes as pip does. Where uv cannot be installed or fails, pip installs the set.
  # Bytecode is compiled at install time because this machine's environment sets
  # PYTHONDONTWRITEBYTECODE=1: without it every kernel compiled jax, flax and torch from source
  # (pinned leg 1030 s instead of 886 s with pip --no-compile).
  uv=()
  if "${pip[@]}" "uv==0.13.9" >/dev/null 2>&1; then
    mapfile -t pip_settings < <("$VENV/bin/python" scripts/pip_settings_for_uv.py)
    uv=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --compile-bytecode "${pip_settings[@]}")
  fi
  install() {  # install "$@" with uv, else (no uv, or uv failed) with pip
    if [ ${#uv[@]} -gt 0 ] && "${uv[@]}" "$@"; then return; fi
    [ ${#uv[@]} -eq 0 ] || echo "setup: uv could not install the set; pip does"
    "${pip[@]}" "$@"
  }
  if [ "$LEG" = pinned ]; then
    install -c constraints-py311.txt -e ".[examples,book,test,site]"
  else
    install --upgrade -e ".[data,test]" jax jaxlib flax equinox optax
    install --no-deps "pyPLNmodels>=1.0.10,<1.1"
  fi
  echo "$want" > "$VENV/.installed"
fi
export PATH="$ROOT/$VENV/bin:$PATH"
