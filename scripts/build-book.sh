#!/usr/bin/env bash
# Build the book into _build/html, executing every chapter.
# Size: FASTJAX_SIZE=full (the default outside CI) or FASTJAX_SIZE=quick (minutes on a laptop CPU).
source "$(dirname "$0")/setup-env.sh"
echo "build: size ${FASTJAX_SIZE:-$(python -c 'from fastjax.sizes import current_size; print(current_size())')}"
jupyter-book build . --warningiserror --keep-going
