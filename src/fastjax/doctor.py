"""Check that this machine can run the book: ``python -m fastjax.doctor``.

Prints Python and library versions, the devices JAX sees, the size in force and whether the
CPU workaround is active, then runs the miscompile probe: a jitted float32 sum of
``y*log(y) - y + 0.5*log(2*pi*y)`` compared with float64 NumPy. Exits 1 with one line per
problem (a package a chapter needs that does not import, a wrong probe result), 0 when all is well.
"""

from __future__ import annotations

import importlib
import platform
import sys
import warnings
from dataclasses import dataclass
from importlib import metadata

import fastjax  # first: applies the CPU workaround before JAX starts
from fastjax import _workaround, sizes

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

PROBE_SHAPE = (116, 114)  # the oaks counts matrix
PROBE_RANGE = (0.1, 20.0)
PROBE_TOLERANCE = 1e-5  # relative error; jaxlib 0.10.2 without the workaround gives about 5e-3


@dataclass
class ProbeResult:
    """The jitted float32 sum, the float64 NumPy sum and their relative error."""

    jitted: float
    reference: float

    @property
    def relative_error(self) -> float:
        """|jitted - reference| / |reference| (dimensionless)."""
        return abs(self.jitted - self.reference) / abs(self.reference)

    @property
    def ok(self) -> bool:
        """True when the relative error is below ``PROBE_TOLERANCE``."""
        return self.relative_error < PROBE_TOLERANCE


def miscompile_probe(seed: int = 0) -> ProbeResult:
    """Sum ``y*log(y) - y + 0.5*log(2*pi*y)`` (a Stirling term) jitted in float32 and in float64 NumPy."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    y = np.random.default_rng(seed).uniform(*PROBE_RANGE, size=PROBE_SHAPE).astype(np.float32)

    @jax.jit
    def stirling_sum(y):
        return jnp.sum(y * jnp.log(y) - y + 0.5 * jnp.log(2 * jnp.pi * y))

    y64 = y.astype(np.float64)
    reference = float(np.sum(y64 * np.log(y64) - y64 + 0.5 * np.log(2 * np.pi * y64)))
    return ProbeResult(jitted=float(stirling_sum(jnp.asarray(y))), reference=reference)


def check_packages() -> tuple[list[tuple[str, str]], list[str]]:
    """Import every package a chapter needs: (name, version) rows and one problem line per failure."""
    rows, problems = [], []
    for module, dist, needed_by in PACKAGES:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # pkg_resources' deprecation notice
                importlib.import_module(module)
        except Exception as err:  # ImportError, or a broken install raising something else
            rows.append((dist, "MISSING"))
            problems.append(f"{dist} does not import ({type(err).__name__}: {err}); needed by {needed_by}. "
                            f"Install it with: pip install -r requirements.txt")
            continue
        try:
            rows.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            rows.append((dist, "(version unknown)"))
    return rows, problems


def main() -> int:
    """Print the report; return the exit status (0 all well, 1 a problem)."""
    print(f"fastjax doctor (fastjax {fastjax.__version__})")
    print(f"  {'python':<14}{platform.python_version()} ({sys.executable})")
    rows, problems = check_packages()
    for name, version in rows:
        print(f"  {name:<14}{version}")
    try:
        size = sizes.current_size()
    except ValueError as err:
        size = "INVALID"
        problems.append(str(err))
    print(f"  {'size':<14}{size} (set FASTJAX_SIZE=quick for a run of minutes on a laptop CPU)")
    active = _workaround.workaround_active()
    needed = _workaround.needs_workaround()
    print(f"  {'CPU fix':<14}{'active' if active else 'not active'}"
          f" ({'needed' if needed else 'not needed'} on jaxlib {_workaround.jaxlib_version()})")
    if "jax" in sys.modules:
        import jax

        devices = ", ".join(f"{d.platform}: {getattr(d, 'device_kind', '')}" for d in jax.devices())
        print(f"  {'devices':<14}{devices}")
        probe = miscompile_probe()
        verdict = "ok" if probe.ok else "WRONG"
        print(f"  {'probe':<14}{verdict}: jitted float32 sum {probe.jitted:.6g} vs float64 {probe.reference:.6g}, "
              f"relative error {probe.relative_error:.1e} (must be < {PROBE_TOLERANCE:.0e})")
        if not probe.ok:
            hint = ("the CPU fix is off: unset FASTJAX_NO_CPU_WORKAROUND and import fastjax before jax"
                    if needed and not active else "this jaxlib computes a wrong sum; report it with this output")
            problems.append(f"the miscompile probe is wrong by {probe.relative_error:.1e}: {hint}")
    if problems:
        print(f"\n{len(problems)} problem(s); the book will not run as it is:", file=sys.stderr)
        for line in problems:
            print(f"  - {line}", file=sys.stderr)
        return 1
    print("\nAll good: every chapter can run here.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
