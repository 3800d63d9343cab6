"""The machine and the book's plumbing: the jaxlib CPU fix applied before JAX starts (``workaround``),
the machine check (``python -m fastjax.setup.doctor``) and the Colab notebooks (``colab``).

Nothing here imports JAX at import time: ``import fastjax`` loads ``workaround`` before JAX starts.
"""
