"""Checks that the hand-written PLN gradient (``fastjax.pln.floor``) is ``jax.grad``'s, as
chapters/floor/01-pln-gradient.md claims: in float64 by each way of applying Σ⁻¹ (to a bound derived
from cond(Σ)), in float32 against ``jax.grad``'s own error (near the start and where a fit ends), and
along pyPLNmodels' float64 trajectory (floor/02-rprop-memory.md runs that one with the packed Rprop). Each check raises (``AssertionError``, naming the shape and the
way) where the claim fails, and returns the rows of the page's table.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastjax import pln
from fastjax.pln import floor as F, rungs as R

# The three ways of applying Σ⁻¹: (label, by_product, wide) for ``F.value_and_grad_by_hand``.
WAYS = [("two solves", False, False), ("one product", True, False), ("n×n matrix K", None, True)]

ELBO_RTOL = 1e-12  # the ELBO of each hand-gradient way against jax.value_and_grad's, float64 (notes/TOLERANCES.md)


def away_from_start(data: pln.PlnData, seed: int = 0) -> tuple[Any, Any]:
    """(M, S) moved away from pyPLNmodels' start at random (NumPy float64, from NumPy data): at the start
    S = ½ everywhere, which would hide a wrong S term."""
    m, s = pln.start(data)
    rng = np.random.default_rng(seed)
    return m + 0.3 * rng.standard_normal(m.shape), s * rng.uniform(0.5, 2.0, s.shape)


def rel_err(ours: Any, ref: Any) -> float:
    """Largest entry error of each gradient, relative to that gradient's largest entry (in NumPy float64)."""
    pairs = [(np.asarray(a, np.float64), np.asarray(b, np.float64)) for a, b in zip(ours, ref)]
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in pairs)


def on_device(tree: Any, dtype: Any) -> Any:
    """Arrays as JAX arrays of ``dtype``, converted on the host (float64 needs jax.enable_x64)."""
    return jax.tree.map(lambda a: jnp.asarray(np.asarray(a, dtype)), tree)


@jax.jit
def all_gradients(params, data):
    """jax.grad's (value, gradient) of pln.loss; the hand gradient by each way and by the rule
    (``value_and_grad_by_hand``'s default); jax.grad of ``loss_by_hand``; the extreme eigenvalues of Σ."""
    hand = {how: F.value_and_grad_by_hand(params, data, by_product, wide) for how, by_product, wide in WAYS}
    eig = jnp.linalg.eigvalsh(pln.closed_form_covariance(data.covariates, *params))
    return (jax.value_and_grad(pln.loss)(params, data), hand, F.value_and_grad_by_hand(params, data)[1],
            jax.grad(F.loss_by_hand)(params, data), eig[0], eig[-1])


@jax.jit
def float32_gradients(params, data):
    """jax.grad's gradient of pln.loss and the hand gradient by each way (in the data's dtype)."""
    return jax.grad(pln.loss)(params, data), {how: F.value_and_grad_by_hand(params, data, by_product, wide)[1]
                                              for how, by_product, wide in WAYS}


def check_float64(datasets: dict[str, pln.PlnData], data_np: dict[str, pln.PlnData]):
    """Each way's float64 gradient against jax.grad's, away from the start, on every shape; and jax.grad of
    the custom_vjp function against the hand gradient. Returns (table rows, {(shape, way): error},
    {shape: (float64 point, jax.grad's gradient there)})."""
    rows, errors, ref64 = [], {}, {}
    with jax.enable_x64(True):
        for name, d in datasets.items():
            d64, params = on_device(d, np.float64), on_device(away_from_start(data_np[name]), np.float64)
            (ref_value, ref_grads), hand, by_rule, via_grad, low, high = all_gradients(params, d64)
            cond = float(high / low)
            ref64[name] = (params, ref_grads)
            for how, (value, grads) in hand.items():  # every way on every shape (the n×n one is right for any shape)
                err = rel_err(grads, ref_grads)
                # float64 eps 1.1e-16: a solve with Σ loses up to cond(Σ) of it; 10 × cond(Σ) × eps allows for the
                # sums over n rows (measured 1e-16 to 1e-15 at every size: far below the bound)
                if not (err <= 10 * cond * np.finfo(np.float64).eps):
                    raise AssertionError((name, how, err, cond))
                if abs(float(value - ref_value)) > ELBO_RTOL * abs(float(ref_value)):  # the same float64 number
                    raise AssertionError(f"{name}, {how}: the ELBO differs from jax.value_and_grad's by more than {ELBO_RTOL:g}")
                errors[(name, how)] = err
                rows.append({"data": name, "R Σ⁻¹ by": how, "cond(Σ)": cond, "gradient error vs jax.grad": err})
            # jax.grad of the custom_vjp function returns the hand gradient (the rule's way), to the bit
            if not (rel_err(via_grad, by_rule) == 0.0):
                raise AssertionError(name)
    return rows, errors, ref64


def float32_errors(data: pln.PlnData, params64: Any, ref_grads: Any) -> dict[str, float]:
    """Errors of the float32 gradients at ``params64`` (rounded to float32) against the float64 ones."""
    auto, hand = float32_gradients(on_device(params64, np.float32), data)
    return {"jax.grad": rel_err(auto, ref_grads), **{how: rel_err(g, ref_grads) for how, g in hand.items()}}


def check_float32(datasets: dict[str, pln.PlnData], ref64: dict[str, Any], names: list[str]) -> list[dict]:
    """On ``names``, each way's float32 gradient is no less accurate than jax.grad's (both against float64)."""
    rows = []
    for name in names:
        e = float32_errors(datasets[name], *ref64[name])
        rows.append({"data": name, **{f"{k}, float32": v for k, v in e.items()}})
        # both are float32 roundings of one gradient; the diagonal identity subtracts two numbers of size n, so
        # allow the hand gradient 4× the automatic one's error (measured: within 1.1× of it at the quick size)
        if not (all(e[how] <= 4 * e["jax.grad"] + 1e-7 for how, _, _ in WAYS)):
            raise AssertionError((name, e))
    return rows


def check_trajectory(oaks_np: pln.PlnData, optimizer: Any = pln.optimizer) -> dict[str, Any]:
    """The float64 fit with the hand gradient (and ``optimizer``: a function returning the optax optimizer) against
    pyPLNmodels' float64 fit on ``oaks_np``, ELBO by ELBO, same start, iterations and tolerance. Returns the
    largest relative gap, the length and the fitted (M, S). Needs torch."""
    import torch

    from fastjax.pln import bench as bench_pln

    torch.set_num_threads(1)  # nothing here is timed: one thread keeps the check quick on a busy machine
    _, _, torch64_elbos, _ = bench_pln.fit_pyplnmodels(oaks_np, dtype="float64")
    with jax.enable_x64(True):
        oaks64 = pln.to_jax(oaks_np, jnp.float64)
        args64 = (pln.start(oaks64), oaks64, jnp.float64(0), jnp.float64(math.inf))
        fitted64, hand64_elbos, crit64 = R.fit_until_converged(*args64, maxiter=len(torch64_elbos), loss=F.loss_by_hand,
                                                               optimizer=optimizer)
    hand64_elbos = np.asarray(hand64_elbos)
    if not (int(crit64.count) == len(torch64_elbos)):
        raise AssertionError('failed: int(crit64.count) == len(torch64_elbos)')
    # Part I's tolerance (chapters/pln/00-model.md): float64 rounding over n·p terms is ~1e-12 per ELBO, and
    # an Rprop sign decision within rounding of 0 could amplify it; 1e-10 allows 100× that
    np.testing.assert_allclose(hand64_elbos, torch64_elbos, rtol=1e-10)
    return {"gap": float(np.max(np.abs(hand64_elbos / torch64_elbos - 1))), "length": len(torch64_elbos),
            "fitted": tuple(np.asarray(a) for a in fitted64)}


def diagonal_ratio(data: pln.PlnData, m: Any, s: Any) -> float:
    """max_j (RᵀR)_jj / D_jj (NumPy float64): how much the diagonal formulas cancel."""
    x, m, s = np.asarray(data.covariates, np.float64), np.asarray(m, np.float64), np.asarray(s, np.float64)
    r = m - x @ np.linalg.solve(x.T @ x, x.T @ m)
    return float(np.max(np.sum(r * r, axis=0) / np.sum(s * s, axis=0)))


def term_ratio(data: pln.PlnData, m: Any, s: Any, grad_m: Any) -> float:
    """Largest entry of Y − A over the largest of the M gradient (NumPy float64), whose terms are Y − A and
    R Σ⁻¹: how much smaller the gradient is than what it is the difference of."""
    y, o = np.asarray(data.counts, np.float64), np.asarray(data.offsets, np.float64)
    a = np.exp(o + np.asarray(m) + 0.5 * np.asarray(s) ** 2)
    return float(np.max(np.abs(y - a)) / np.max(np.abs(np.asarray(grad_m))))


def check_late(datasets: dict[str, pln.PlnData], data_np: dict[str, pln.PlnData], stacks: dict[str, int],
               fitted: tuple[Any, Any], ref64: dict[str, Any]) -> tuple[list[dict], dict[str, dict]]:
    """The float32 check again where a fit ends: on each oaks shape ``name`` (oaks stacked ``stacks[name]``
    times), at ``fitted`` (the end of the float64 fit on oaks) stacked alike. Returns the table rows and,
    per shape, the float32 errors, the Cholesky margin λ_min / (ε₃₂ λ_max) and the term ratios (at the
    points of ``check_float64``, and at the end)."""
    rows, late = [], {}
    for name, size in stacks.items():
        d = datasets[name]
        p_end = tuple(np.tile(np.asarray(a), (size, 1)) for a in fitted)  # every row repeated: same Σ, same gradients
        with jax.enable_x64(True):
            (_, ref_grads), _, _, _, low, high = all_gradients(on_device(p_end, np.float64), on_device(d, np.float64))
        e = float32_errors(d, p_end, ref_grads)
        margin = float(low) / (float(high) * float(np.finfo(np.float32).eps))  # λ_min(Σ) over float32 rounding of λ_max(Σ)
        start_ratio = term_ratio(d, *ref64[name][0], ref64[name][1][0])
        late[name] = {**e, "margin": margin, "terms": (start_ratio, term_ratio(d, *p_end, ref_grads[0]))}
        rows.append({"data": name, "max (RᵀR)_jj / D_jj: start": diagonal_ratio(d, *pln.start(data_np[name])),
                     "at the end": diagonal_ratio(d, *p_end), "max abs(Y − A) / max abs(∂J/∂M): above": start_ratio,
                     "where the fit ends": late[name]["terms"][1],
                     **{f"{k}, float32": v for k, v in e.items()}, "λ_min / (ε₃₂ λ_max)": margin})
        # near the optimum every float32 gradient loses digits; the hand gradient must not lose many more than
        # jax.grad's: 4× its error (measured at the quick size: at most 1.4×; up to 2.0× at the ends of float32
        # fits tried while writing the page, on oaks × 10 and 300 × 150 cells)
        if not (all(e[how] <= 4 * e["jax.grad"] + 1e-7 for how, _, _ in WAYS)):
            raise AssertionError((name, e))
    return rows, late
