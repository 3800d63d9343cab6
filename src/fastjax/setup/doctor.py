"""Check that this machine can run the book: ``python -m fastjax.setup.doctor``.

Each check prints one line, ``pass`` or ``FAIL``, and for a failure the one thing to do about it:
Python, every package a chapter needs, the size in force, the devices JAX sees, the jaxlib CPU
miscompile probe (``fastjax.setup.workaround``) and, in this process, a jitted float32 sum of the PLN
ELBO's Stirling term compared with float64 NumPy. Exits 1 when a check fails (a wrong number
included), 0 when all pass.
"""

from __future__ import annotations

import importlib
import platform
import sys
import warnings
from importlib import metadata

import fastjax  # first: applies the CPU workaround before JAX starts
from fastjax import sizes
from fastjax.setup import workaround

INSTALL = "pip install 'fastjax[examples]' (or run scripts/setup-env.sh in the book's checkout)"
# (module to import, distribution for the version, what needs it)
PACKAGES: tuple[tuple[str, str, str], ...] = (
    ("jax", "jax", "every chapter"),
    ("jaxlib", "jaxlib", "every chapter"),
    ("flax", "flax", "the Flax NNX chapters"),
    ("equinox", "equinox", "the Equinox variants"),
    ("optax", "optax", "every training loop"),
    ("numpy", "numpy", "every chapter"),
    ("matplotlib", "matplotlib", "every plot"),
    ("torch", "torch", "pyPLNmodels (Part I)"),
    ("pkg_resources", "setuptools", "pyPLNmodels (needs setuptools < 81)"),
    ("pyPLNmodels", "pyPLNmodels", "the reference fit of Part I"),
    ("sklearn", "scikit-learn", "the digits data of Part II"),
)


def versions_line() -> str:
    """Python and the JAX family's versions on one line."""
    def v(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "missing"
    libs = ", ".join(f"{d} {v(d)}" for d in ("jax", "jaxlib", "flax", "equinox", "optax"))
    return f"Python {platform.python_version()}, {libs}"


def checks() -> list[tuple[str, bool, str, str]]:
    """Every check as (name, passed, what was found, what to do when it failed)."""
    out = [("python", sys.version_info >= (3, 11), platform.python_version(), "use Python 3.11 or newer")]
    for module, dist, needed_by in PACKAGES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pkg_resources' deprecation notice
                importlib.import_module(module)
            found, ok = metadata.version(dist), True
        except Exception as err:  # ImportError, or a broken install raising something else
            found, ok = f"does not import ({type(err).__name__}: {err}); needed by {needed_by}", False
        out.append((dist, ok, found, INSTALL))
    try:
        out.append(("size", True, f"{sizes.current_size()} (FASTJAX_SIZE=quick|full)", ""))
    except ValueError as err:
        out.append(("size", False, str(err), "set FASTJAX_SIZE to quick or full"))
    import jax

    devices = ", ".join(f"{d.platform}: {getattr(d, 'device_kind', '')}" for d in jax.devices())
    out.append(("devices", True, devices, ""))
    probe = workaround.probe()
    active = workaround.workaround_active()
    if probe is None or probe.error_without is None:
        out.append(("CPU probe", False, "could not run" + (f" ({probe.note})" if probe else ""),
                    "check that `python -c 'import jax; jax.numpy.ones(1)'` works"))
    else:
        found = (f"jaxlib {probe.jaxlib}: jitted sum off by {probe.error_without:.1e} without the fix, "
                 f"{'XLA lacks the flag' if not probe.flag_known else f'{probe.error_with:.1e} with it'}; "
                 f"fix {'active' if active else 'not active'}")
        out.append(("CPU probe", True, found, ""))
    error = workaround.check_in_this_process()
    ok = error <= workaround.TOLERANCE
    hint = ("the CPU fix is off: unset FASTJAX_NO_CPU_WORKAROUND and XLA_FLAGS' own "
            f"{workaround.FLAG_NAME}, and import fastjax before jax"
            if probe is not None and probe.needs_flag and not active
            else "this jaxlib computes a wrong sum that the flag does not fix: try another jaxlib, and report it")
    out.append(("ELBO sum", ok, f"jitted float32 vs float64 NumPy: relative error {error:.1e} "
                f"(must be <= {workaround.TOLERANCE:.0e})", hint))
    return out


def main() -> int:
    """Print one line per check; return the exit status (0 all pass, 1 a check failed)."""
    print(f"fastjax doctor (fastjax {fastjax.__version__}, {sys.executable})")
    failed = 0
    for name, ok, found, todo in checks():
        print(f"  {'pass' if ok else 'FAIL'}  {name:<13}{found}")
        if not ok:
            failed += 1
            print(f"        -> {todo}")
    if failed:
        print(f"\n{failed} check(s) failed: the book will not run right here (see the -> lines).", file=sys.stderr)
        return 1
    print("\nAll checks pass: every chapter can run here.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
