"""The first code cell of every chapter: in Colab, install what Colab lacks.

Colab opens the generated ``.ipynb`` of a chapter. Its base image has JAX, Flax, optax, NumPy
and Matplotlib but not this book's helper package, Equinox or pyPLNmodels. The cell installs
those, pinning Colab's own jax/jaxlib so that nothing downgrades them. Outside Colab it does
nothing, unless ``FASTJAX_FORCE_INSTALL=1`` (the tests use that, with ``FASTJAX_SOURCE`` set to
a local checkout, to prove the cell works). Every chapter's first code cell is exactly
``INSTALL_CELL``; a test checks it.
"""

REPOSITORY = "https://github.com/fastjax-book/fastjax"

INSTALL_CELL = '''\
# Colab only: install this book's helper package and the libraries Colab lacks.
# Elsewhere this does nothing: install locally with the two commands in README.md.
import os, subprocess, sys
if "google.colab" in sys.modules or os.environ.get("FASTJAX_FORCE_INSTALL") == "1":
    from importlib.metadata import version
    source = os.environ.get("FASTJAX_SOURCE", "git+https://github.com/fastjax-book/fastjax")
    keep = [f"{p}=={version(p)}" for p in ("jax", "jaxlib")]  # never downgrade Colab's JAX
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"fastjax[examples] @ {source}", *keep], check=True)'''
