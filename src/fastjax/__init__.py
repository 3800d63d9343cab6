"""fastjax: the helper package of the book "Making JAX fast".

It holds what is not the lesson itself: the size switch, the timing harness, plots, input
checks, and (in later modules) the data and model maths of the two examples. Importing it
first applies a workaround for a jaxlib CPU miscompile before JAX starts (see ``_workaround``).
"""

from fastjax._workaround import apply_cpu_workaround, workaround_active

CPU_WORKAROUND = apply_cpu_workaround()

from fastjax import checks, sizes  # noqa: E402
from fastjax.sizes import current_size  # noqa: E402

__version__ = "0.1.0"

__all__ = ["CPU_WORKAROUND", "checks", "current_size", "sizes", "workaround_active", "__version__"]
