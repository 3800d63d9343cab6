"""The evidence of the CPU-bug page (chapters/cpu-bug.md) about the flag ``fastjax.setup.workaround`` sets:
how wrong the jitted float32 sum is in a fresh process (``jitted_sum_error``), whether the package's
tolerance sits between float32 rounding and the mildest wrong answer seen (``check_margins``), and what the
flag costs a PLN fit (``FIT`` run in fresh processes by ``fit_time``, in turns by ``flag_speed``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np

from fastjax.setup import workaround


def jitted_sum_error(flags: str) -> float:
    """Relative error of the jitted float32 Stirling sum (``workaround.CHECK``) in a fresh process started
    with ``XLA_FLAGS=flags``; a RuntimeError naming the flags where XLA refuses them."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    code = workaround.CHECK + "print(relative_error)"
    out = subprocess.run([sys.executable, "-c", code], env={**env, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"XLA refused XLA_FLAGS={flags!r}: {out.stderr.strip().splitlines()[-1]}")
    return float(out.stdout.strip().splitlines()[-1])


def check_margins(with_flag: float) -> dict[str, float]:
    """The margins of ``workaround.TOLERANCE``: the worst-case float32 rounding bound of the sum, the error of
    one legal order (the same float32 terms added one by one, smallest first), the tolerance and the mildest
    wrong answer seen. Raises AssertionError if the order breaks the bound, if the tolerance is not at least
    twice the bound and at most half the mildest wrong answer, or if ``with_flag`` (the error with the flag)
    is above the tolerance."""
    y = np.random.default_rng(0).integers(0, 3000, size=(116, 114)).astype(np.float32).ravel()  # as CHECK
    y1 = y + (y == 0)
    terms32 = np.float32(0.5) * np.log(np.float32(2 * np.pi) * y1) + y1 * np.log(y1 / np.float32(np.e))
    y64 = y1.astype(np.float64)
    exact = np.sum(0.5 * np.log(2 * np.pi * y64) + y64 * np.log(y64 / np.e))
    ascending = np.cumsum(np.sort(terms32), dtype=np.float32)[-1]  # one by one, smallest first
    out = {"rounding_bound": float(workaround.rounding_bound()),
           "ascending_error": float(abs(float(ascending) - exact) / abs(exact)),
           "smallest_wrong": float(workaround.SMALLEST_WRONG_SEEN), "tolerance": float(workaround.TOLERANCE)}
    if not out["ascending_error"] <= out["rounding_bound"]:
        raise AssertionError(f"one legal order breaks the worst-case bound: {out}")
    if not 2 * out["rounding_bound"] <= out["tolerance"] <= out["smallest_wrong"] / 2:
        raise AssertionError(f"the tolerance is not between twice the bound and half the mildest wrong answer: {out}")
    if not with_flag <= workaround.TOLERANCE:
        raise AssertionError(f"the flag no longer fixes the sum: {with_flag:.1e}")
    return out


FIT = """
import json, sys, time
import jax, jax.numpy as jnp, numpy as np, optax
from fastjax import pln, sizes
cfg = sizes.choose(quick=dict(repeat=1, n_iter=100, calls=5), full=dict(repeat=100, n_iter=100, calls=7))
data = pln.to_jax(pln.load_oaks_counts(cfg.repeat))
tx = optax.rprop(1e-2)

@jax.jit
def fit(params):
    def step(carry, _):
        params, state = carry
        loss, grads = jax.value_and_grad(lambda p: -pln.profiled_elbo(*p, data))(params)
        updates, state = tx.update(grads, state, params)
        return (optax.apply_updates(params, updates), state), loss
    return jax.lax.scan(step, (params, tx.init(params)), length=cfg.n_iter)

params = pln.init_latent(data.counts)
jax.block_until_ready(fit(params))  # compile and warm up
times = []
for _ in range(cfg.calls):
    t0 = time.perf_counter()
    jax.block_until_ready(fit(params))
    times.append((time.perf_counter() - t0) / cfg.n_iter)
print(json.dumps({"median": float(np.median(times)), "n": int(data.counts.shape[0])}))
"""


def fit_time(flags: str) -> dict[str, Any]:
    """``FIT`` (a PLN fit, one ``lax.scan`` of Rprop steps) in a fresh process with exactly ``XLA_FLAGS=flags``
    (the package's own flag switched off): its median seconds per iteration and n."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(XLA_FLAGS=flags, JAX_PLATFORMS="cpu", **{workaround.DISABLE_ENV: "1"})  # the flag as given
    out = subprocess.run([sys.executable, "-c", FIT], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"the fit failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def flag_speed(rounds: int) -> tuple[dict[str, list[float]], int]:
    """``rounds`` pairs of fresh processes, without then with the flag, in turns: the medians per iteration of
    each (``{"no flag": [...], "flag": [...]}``) and n."""
    runs: dict[str, list[float]] = {"no flag": [], "flag": []}
    for _ in range(rounds):
        run = fit_time("")
        runs["no flag"].append(run["median"])
        runs["flag"].append(fit_time(workaround.WORKAROUND_FLAG)["median"])
    return runs, run["n"]
