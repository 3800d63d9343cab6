"""The Poisson log-normal (PLN) model of Part I: the oaks data, input checks, the ELBO, closed forms.

Notation: counts ``Y`` (n×p), log-offsets ``O`` (n×p), covariates ``X`` (n×d). Latent
``Z_i ~ N(X_i B, Σ)`` and ``Y_ij | Z_ij ~ Poisson(exp(O_ij + Z_ij))``. The variational law is
``Z_i ~ N(M_i, diag(S_i²))``.

Convention kept everywhere in the book: ``M`` holds the *full* latent mean (as pyPLNmodels does),
not the residual around ``XB``; ``S`` is the variational *standard deviation* (pyPLNmodels'
``latent_sqrt_variance``); ``log Y!`` uses pyPLNmodels' Stirling formula. The profiled ELBO drops
the constant ``np/2`` (as pyPLNmodels does); the full ELBO keeps it, so the two agree when B and
Σ take their closed forms.

The maths functions take an array namespace ``xp`` (``jax.numpy`` by default, ``numpy`` for a
float64 reference computed without JAX). Data checks run in NumPy, before any JAX code.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks

LR = 0.01  # pyPLNmodels' default learning rate
STEP_SIZES = (1e-10, 50.0)  # pyPLNmodels' Rprop step-size bounds (torch's default minimum is 1e-6)
MAXITER, TOL, BETA = 400, 1e-6, 0.03  # pyPLNmodels' defaults: iteration cap, criterion tolerance, smoothing
TARGET_GAP = 5e-4  # the book's "same fit" ("reached"): a final ELBO within 0.05 % of the reference fit's


class PlnData(NamedTuple):
    """Counts ``Y`` (n×p), log-offsets ``O`` (n×p), covariates ``X`` (n×d), and the constant
    ``Σ_ij log Y_ij!`` (Stirling, a float). A NamedTuple, so it crosses ``jax.jit`` as a pytree."""

    counts: Any
    offsets: Any
    covariates: Any
    log_factorial: Any

    @property
    def shape(self) -> tuple[int, int, int]:
        """(n, p, d): samples, species, covariates."""
        n, p = self.counts.shape
        return n, p, self.covariates.shape[1]


# ----------------------------------------------------------------------------- data and checks

def log_stirling(y: Any, xp: Any = np) -> Any:
    """Stirling's approximation of ``log(y!)`` elementwise, as in pyPLNmodels (0 is read as 1)."""
    y1 = y + (y == 0)
    return 0.5 * xp.log(2 * np.pi * y1) + y1 * xp.log(y1 / np.e)


def check_pln_data(counts: Any, offsets: Any = None, covariates: Any = None) -> PlnData:
    """Validate counts, log-offsets and covariates in NumPy and return float64 ``PlnData``.

    ``offsets=None`` means zeros; ``covariates=None`` means an intercept (a column of ones); a
    1-D covariate vector is read as one column. Raises TypeError/ValueError naming the problem.
    Count columns that hold only zeros are removed with a warning naming them, as pyPLNmodels does
    (their latent mean would run to −∞).
    """
    y = checks.check_counts(counts, "counts")
    n, p = y.shape
    if offsets is None:
        o = np.zeros((n, p))
    else:
        o = checks.check_matrix(offsets, "offsets")
        if o.shape != (n, p):
            raise ValueError(f"offsets must have the shape of counts {(n, p)}; got {o.shape}")
    zero = np.flatnonzero(y.sum(axis=0) == 0)
    if zero.size == p:
        raise ValueError("counts must have at least one column with a non-zero count; all are zero")
    if zero.size:
        warnings.warn(f"counts: removed {zero.size} column(s) holding only zeros: {zero.tolist()}", stacklevel=2)
        y, o = np.delete(y, zero, axis=1), np.delete(o, zero, axis=1)
    if covariates is None:
        x = np.ones((n, 1))
    else:
        x = checks.as_array(covariates, "covariates")
        if x.ndim == 1:
            x = x[:, None]
        x = checks.check_matrix(x, "covariates")
        if x.shape[0] != n:
            raise ValueError(f"covariates must have one row per sample of counts ({n}); got {x.shape[0]} rows")
        checks.check_full_column_rank(x, "covariates")
    return PlnData(y, o, x, float(np.sum(log_stirling(y))))


def data_folder(name: str) -> Path:
    """The folder of one data set shipped inside pyPLNmodels (``oaks``, ``scRT``), found without importing it."""
    spec = importlib.util.find_spec("pyPLNmodels")  # finds the package without importing torch
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the {name} data ships with pyPLNmodels: pip install pyPLNmodels")
    return Path(list(spec.submodule_search_locations)[0]) / "load_data" / "data" / name


def load_oaks_counts(repeat: int = 1) -> PlnData:
    """The oaks data of pyPLNmodels (116 leaves × 114 taxa), intercept only, stacked ``repeat`` times.

    Offsets are returned on the log scale, like ``pyPLNmodels.load_oaks()["offsets"]`` in 1.0.x
    (the CSV holds read totals; taking their log again would be a double log).
    """
    import pandas as pd

    repeat = checks.check_positive_int(repeat, "repeat")
    folder = data_folder("oaks")
    counts = pd.read_csv(folder / "counts.csv").to_numpy()
    offsets = np.log(pd.read_csv(folder / "offsets.csv").to_numpy().astype(np.float64))
    return check_pln_data(np.tile(counts, (repeat, 1)), np.tile(offsets, (repeat, 1)))


SCRNA_MAX = (2000, 3000)  # cells × genes that pyPLNmodels ships of the scMARK single-cell data


def load_scrna_counts(n_samples: int = 400, dim: int = 100) -> PlnData:
    """The first ``n_samples`` cells × ``dim`` genes of pyPLNmodels' scMARK subset (what
    ``pyPLNmodels.load_scrna(n_samples, dim)["endog"]`` returns), intercept only, zero offsets
    (pyPLNmodels' default). Genes with no count in these cells are removed with a warning."""
    import pandas as pd

    n_samples = checks.check_positive_int(n_samples, "n_samples")
    dim = checks.check_positive_int(dim, "dim")
    for value, limit, name, what in ((n_samples, SCRNA_MAX[0], "n_samples", "cells"),
                                     (dim, SCRNA_MAX[1], "dim", "genes")):
        if value > limit:
            raise ValueError(f"{name} must be at most {limit} (pyPLNmodels ships {limit} {what} of the "
                             f"single-cell data); got {value}")
    counts = pd.read_csv(data_folder("scRT") / "counts.csv", nrows=n_samples, usecols=range(dim)).to_numpy()
    return check_pln_data(counts)


def to_jax(data: PlnData, dtype: Any = None) -> PlnData:
    """The same data as JAX arrays of ``dtype`` (float32 by default); the constant stays a scalar."""
    import jax.numpy as jnp

    dtype = jnp.float32 if dtype is None else dtype
    return PlnData(*(jnp.asarray(a, dtype=dtype) for a in data))


# ----------------------------------------------------------------------------- maths

def _xp_default(xp: Any) -> Any:
    if xp is None:
        import jax.numpy as jnp

        return jnp
    return xp


def init_latent(counts: Any, xp: Any = None) -> tuple[Any, Any]:
    """pyPLNmodels' start: ``M = log(Y + 1[Y=0])`` and ``S = 1/2`` (same dtype as counts)."""
    xp = _xp_default(xp)
    m = xp.log(counts + (counts == 0))
    return m, 0.5 * xp.ones_like(counts)


def closed_form_coef(covariates: Any, m: Any, xp: Any = None) -> Any:
    """``B = (XᵀX)⁻¹ Xᵀ M`` (d×p), by a linear solve."""
    xp = _xp_default(xp)
    x = covariates
    return xp.linalg.solve(x.T @ x, x.T @ m)


def closed_form_covariance(covariates: Any, m: Any, s: Any, xp: Any = None) -> Any:
    """``Σ = [(M − XB)ᵀ(M − XB) + diag(Σ_i S_i²)] / n`` (p×p), with B in closed form."""
    xp = _xp_default(xp)
    r = m - covariates @ closed_form_coef(covariates, m, xp)
    return (r.T @ r + xp.diag(xp.sum(s * s, axis=0))) / m.shape[0]


def poisson_part(m: Any, s: Any, data: PlnData, xp: Any = None) -> Any:
    """The ELBO's elementwise terms, summed: ``Σ_ij[Y(O+M) − exp(O + M + S²/2) + ½ log S²] − Σ_ij log Y!``.

    The part of the ELBO that B and Σ do not enter: ``profiled_elbo`` adds ``−(n/2) log|Σ|`` to it, and
    ``elbo`` the terms in ``Σ⁻¹``. A loss written another way (a sharded covariance, Part V) adds the
    same terms by calling it. A sum over all samples: split them, and the parts add up.
    """
    xp = _xp_default(xp)
    s2 = s * s
    om = data.offsets + m
    return xp.sum(data.counts * om - xp.exp(om + 0.5 * s2) + 0.5 * xp.log(s2)) - data.log_factorial


def profiled_elbo(m: Any, s: Any, data: PlnData, xp: Any = None) -> Any:
    """ELBO with B and Σ profiled out: ``−(n/2) log|Σ| + Σ_ij[Y(O+M) − A + ½ log S² − log Y!]``.

    ``log|Σ|`` comes from ``slogdet`` (never ``log(det)``, which overflows). No ``np/2`` constant.
    """
    xp = _xp_default(xp)
    sigma = closed_form_covariance(data.covariates, m, s, xp)
    _, logdet = xp.linalg.slogdet(sigma)
    return -0.5 * m.shape[0] * logdet + poisson_part(m, s, data, xp)


def elbo_condition(m: Any, s: Any, data: PlnData) -> float:
    """How much the profiled ELBO's terms cancel: the sum of their magnitudes over the ELBO's, in float64
    (NumPy). Any order of adding N terms is off by at most (N − 1)·u times the sum of their magnitudes
    (Higham, *Accuracy and Stability of Numerical Algorithms*, §4.2), so two evaluations of the ELBO in a
    precision with unit roundoff u differ by at most about 2·N·u·``elbo_condition`` relative to it."""
    m, s = np.asarray(m, np.float64), np.asarray(s, np.float64)
    counts, offsets = np.asarray(data.counts, np.float64), np.asarray(data.offsets, np.float64)
    om = offsets + m
    sigma = closed_form_covariance(np.asarray(data.covariates, np.float64), m, s, np)
    magnitude = (np.sum(np.abs(counts * om)) + np.sum(np.exp(om + 0.5 * s * s)) + 0.5 * np.sum(np.abs(np.log(s * s)))
                 + abs(float(data.log_factorial)) + 0.5 * m.shape[0] * abs(np.linalg.slogdet(sigma)[1]))
    return float(magnitude / abs(profiled_elbo(m, s, data, np)))


def elbo(m: Any, s: Any, coef: Any, covariance: Any, data: PlnData, xp: Any = None) -> Any:
    """Full ELBO at any B (d×p) and Σ (p×p), with ``Ω = Σ⁻¹`` through a Cholesky factor and the
    ``np/2`` constant kept, so that it equals ``profiled_elbo`` when B and Σ are in closed form."""
    xp = _xp_default(xp)
    n, p = m.shape
    chol = xp.linalg.cholesky(covariance)
    eye = xp.eye(p, dtype=m.dtype)
    chol_inv = _tri_solve(chol, eye, xp)  # L⁻¹, so Ω = L⁻ᵀ L⁻¹
    omega = chol_inv.T @ chol_inv
    r = m - data.covariates @ coef
    quad = (r.T @ r) + xp.diag(xp.sum(s * s, axis=0))  # (M−XB)ᵀ(M−XB) + diag(Σ_i S_i²)
    log_det_omega = -2.0 * xp.sum(xp.log(xp.diag(chol)))
    return (poisson_part(m, s, data, xp) - 0.5 * xp.sum(omega * quad)
            + 0.5 * n * log_det_omega + 0.5 * n * p)


def _tri_solve(lower: Any, b: Any, xp: Any) -> Any:
    if xp is np:
        return np.linalg.solve(lower, b)
    import jax.scipy.linalg as jsl

    return jsl.solve_triangular(lower, b, lower=True)


def check_params(params: Any, data: PlnData) -> None:
    """Raise (ValueError, TypeError) naming the problem unless ``params = (M, S)`` fit ``data``: two
    float arrays of the counts' shape, finite, with no zero in S (a standard deviation of 0 has no log)."""
    if not isinstance(params, (tuple, list)) or len(params) != 2:
        raise TypeError(f"params must be a pair (M, S); got {type(params).__name__}")
    shape = tuple(data.counts.shape)
    for name, a in zip(("M", "S"), params):
        if tuple(np.shape(a)) != shape:
            raise ValueError(f"{name} must have the shape of the counts {shape}; got {tuple(np.shape(a))}")
        if not np.issubdtype(np.asarray(a).dtype, np.floating):
            raise TypeError(f"{name} must hold floats; got dtype {np.asarray(a).dtype}")
        bad = ~np.isfinite(np.asarray(a))
        if bad.any():
            raise ValueError(f"{name} has {int(bad.sum())} NaN or infinite entries (first at {tuple(np.argwhere(bad)[0])})")
    zero = np.asarray(params[1]) == 0
    if zero.any():
        raise ValueError(f"S has {int(zero.sum())} zero entries (first at {tuple(np.argwhere(zero)[0])}): "
                         "a standard deviation of 0 has no log")


def check_fit(elbos: Any, crit: Criterion) -> None:
    """After a jitted fit, raise FloatingPointError naming the first iteration whose ELBO is not finite
    (inside ``jit`` nothing can raise: a Σ that stopped being positive definite, or an ``exp`` that
    overflowed, shows up as a NaN or infinite ELBO)."""
    done = np.asarray(elbos)[: int(crit.count)]
    bad = np.flatnonzero(~np.isfinite(done))
    if bad.size:
        raise FloatingPointError(
            f"the fit's ELBO is {done[bad[0]]} at iteration {bad[0]} (of {done.size}): Σ stopped being positive "
            "definite or exp(O + M + S²/2) overflowed there; evaluate the gradient eagerly at that point "
            "(it names which) or fit in float64")


def start(data: PlnData) -> tuple[Any, Any]:
    """pyPLNmodels' starting point ``(M, S)`` for ``data``, in its array type."""
    return init_latent(data.counts, np if isinstance(data.counts, np.ndarray) else None)


def loss(params: tuple[Any, Any], data: PlnData) -> Any:
    """The negative profiled ELBO at ``params = (M, S)``: what the optimizer minimises (JAX)."""
    m, s = params
    return -profiled_elbo(m, s, data)


def optimizer(lr: float = LR) -> Any:
    """pyPLNmodels' optimizer: torch's Rprop (``fastjax.pln.rprop``), learning rate ``lr``, steps in [1e-10, 50]."""
    from fastjax.pln.rprop import rprop

    return rprop(lr, step_sizes=STEP_SIZES)


class Criterion(NamedTuple):
    """pyPLNmodels' stopping criterion (its ``_ElboCriterionMonitor``), as arrays: the number of ELBOs
    seen, their running sum, the last normalised ELBO, the smoothed derivative, the criterion."""

    count: Any
    cumulative: Any
    normalized: Any
    derivative: Any
    value: Any


def criterion_start(dtype: Any = np.float32, xp: Any = None) -> Criterion:
    """The monitor before any ELBO: criterion 1, everything else 0."""
    xp = _xp_default(xp)
    zero = xp.zeros((), dtype=dtype)
    return Criterion(xp.zeros((), dtype=np.int32), zero, zero, zero, zero + 1)


def criterion_update(c: Criterion, elbo: Any, xp: Any = None) -> Criterion:
    """Add one ELBO, as pyPLNmodels does: normalise by the running sum, smooth the change of the normalised
    ELBO and the change of that (factor ``BETA``) from the second ELBO on. Stop when ``|value| < TOL``."""
    xp = _xp_default(xp)
    cumulative = c.cumulative + elbo
    normalized = elbo / cumulative
    derivative = c.derivative * (1 - BETA) + xp.abs(c.normalized - normalized) * BETA
    value = c.value * (1 - BETA) + xp.abs(derivative - c.derivative) * BETA
    later = c.count >= 1  # pyPLNmodels updates the derivative and the criterion from the second ELBO on
    return Criterion(c.count + 1, cumulative, normalized, xp.where(later, derivative, c.derivative),
                     xp.where(later, value, c.value))


def relative_gap(value: float, reference: float) -> float:
    """How far ``value`` falls below ``reference``, relative to ``|reference|`` (negative: above)."""
    return float((reference - value) / abs(reference))
