# Sourced by build-book.sh and run-tests.sh: create .venv and install what is missing.
# Re-installs only when requirements.txt or pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ "$(cat .venv/.installed 2>/dev/null || true)" != "$want" ]; then
  echo "setup: installing requirements.txt and the fastjax package into .venv"
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements.txt -e .
  echo "$want" > .venv/.installed
fi
export PATH="$ROOT/.venv/bin:$PATH"
