#!/usr/bin/env bash
# Build the book into _build/html, executing every chapter, with a progress line per chapter.
# Size: FASTJAX_SIZE=quick|full when set; otherwise chosen from the machine: full where JAX sees an
# accelerator, quick on a CPU (a full build on a 2-core CPU takes well over an hour).
source "$(dirname "$0")/setup-env.sh"
set -o pipefail
if [ -z "${FASTJAX_SIZE:-}" ]; then
  backend="$(python -c 'import jax; print(jax.default_backend())' 2>/dev/null || echo cpu)"
  if [ "$backend" = cpu ]; then FASTJAX_SIZE=quick; else FASTJAX_SIZE=full; fi
  echo "build: size $FASTJAX_SIZE, chosen because JAX runs on $backend here."
  echo "       Set it yourself with FASTJAX_SIZE=full or FASTJAX_SIZE=quick (full on a 2-core CPU: over an hour)."
else
  echo "build: size $FASTJAX_SIZE (from FASTJAX_SIZE)"
fi
export FASTJAX_SIZE
rm -rf _build/measurements  # each ladder is measured once by this build (fastjax.bench.save_part)
jupyter-book build . --warningiserror --keep-going 2>&1 | python scripts/build_progress.py
