"""fastjax: the helper package of the book "Making JAX fast".

It holds what is not the lesson itself: the size switch (``sizes``) and input checks (``checks``)
here; the machine's setup in ``fastjax.setup``; the measuring tools in ``fastjax.tools``; each
example's data, model maths, rungs and bench in ``fastjax.pln`` and ``fastjax.resnet``; Part V's
helpers in ``fastjax.scale``; ``python -m fastjax.bench`` measures both ladders. Importing it
first applies a workaround for a jaxlib CPU miscompile before JAX starts (see ``fastjax.setup.workaround``), and
lets OpenBLAS's idle threads sleep instead of spinning (``OPENBLAS_THREAD_TIMEOUT``, below).
"""

import os

# On CPU, jaxlib runs its LAPACK calls (Cholesky, triangular solves, LU) in SciPy's OpenBLAS. After each
# call OpenBLAS keeps its idle threads spinning for 2^28 processor cycles (its THREAD_TIMEOUT, a tenth of
# a second), so they take cores from XLA's own threads; OPENBLAS_THREAD_TIMEOUT=20 makes them sleep after
# 2^20 cycles, about a third of a millisecond (OpenBLAS clamps it to 4..30:
# https://github.com/OpenMathLib/OpenBLAS/issues/5171). Measured on the 2-core CPU of CI, one process per
# setting, two rounds, Part VI's fit per iteration: at n = 11,600, 10.1-10.3 ms with 20, 10.1-21.3 with 4,
# 16.9-24.1 with 28; on the oaks data (n = 116), 0.23 ms with 20, 0.32-0.36 with 4, 0.23-0.25 with 28;
# chapters/floor/01-pln-gradient.md measures it on the reader's machine. OpenBLAS reads the variable
# when it is loaded, so it is set here, before JAX loads SciPy; a value set before Python started wins.
OPENBLAS_THREAD_TIMEOUT = os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

from fastjax.setup.workaround import apply_cpu_workaround, workaround_active  # noqa: E402

CPU_WORKAROUND = apply_cpu_workaround()

from fastjax import checks, sizes  # noqa: E402
from fastjax.sizes import current_size  # noqa: E402

__version__ = "0.1.0"

__all__ = ["CPU_WORKAROUND", "OPENBLAS_THREAD_TIMEOUT", "checks", "current_size", "sizes", "workaround_active", "__version__"]
