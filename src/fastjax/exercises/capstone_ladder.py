"""The capstone's rungs between its starting program and its reference solution (chapters/capstone.md).

Each rung changes one thing of the one before and computes the same fit: rung 1 defines the one-sample
function once (no retrace), rung 2 writes the E step for every sample at once, rung 3 jits one whole EM
iteration; rung 4 is the page's reference, ``fit_fast``, which moves the iterations into ``lax.scan``.
``RUNGS`` names rungs 1 to 3, in order, for the page's race between the starting program and the reference.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fastjax.exercises.capstone_code import REG, e_step, em_step, log_gaussian, m_step


@jax.jit
def responsibilities_once(x_i, weights, means, precisions, logdets):
    """Rung 1: fit_slow's one-sample function, defined once, at the top level (k read from the shapes)."""
    log_p = jnp.array([jnp.log(weights[j]) + log_gaussian(x_i, means[j], precisions[j], logdets[j])
                       for j in range(weights.shape[0])])
    log_total = jax.scipy.special.logsumexp(log_p)
    return jnp.exp(log_p - log_total), log_total


def fit_compiled_once(x, weights, means, covs, iterations):
    """Rung 1: fit_slow with its one-sample function compiled once for every call; the rest unchanged."""
    n, d = x.shape
    trajectory = jnp.array([])
    for _ in range(iterations):
        precisions, logdets = jnp.linalg.inv(covs), jnp.linalg.slogdet(covs)[1]
        resp, log_lik = [], 0.0
        for i in range(n):
            r, log_total = responsibilities_once(x[i], weights, means, precisions, logdets)
            resp.append(r)
            log_lik += float(log_total)
        if math.isnan(log_lik):
            raise FloatingPointError("the log-likelihood is NaN")
        trajectory = jnp.append(trajectory, log_lik / n)
        # M step: fit_slow's own, line for line
        resp = jnp.stack(resp)
        nk = resp.sum(axis=0)
        weights = nk / n
        means = resp.T @ x / nk[:, None]
        covs = []
        for j in range(weights.shape[0]):
            diff = x - means[j]
            covs.append((resp[:, j, None] * diff).T @ diff / nk[j] + REG * jnp.eye(d))
        covs = jnp.stack(covs)
    return weights, means, covs, trajectory


e_step_jit = jax.jit(e_step)


def fit_vectorised(x, weights, means, covs, iterations):
    """Rung 2: the E step for every sample in one jitted call; the M step eager; one read per iteration."""
    trajectory = []
    for _ in range(iterations):
        resp, log_total = e_step_jit(x, weights, means, covs)
        trajectory.append(float(jnp.mean(log_total)))
        weights, means, covs = m_step(x, resp)
    return weights, means, covs, jnp.array(trajectory)


em_step_jit = jax.jit(em_step)


def fit_step_jitted(x, weights, means, covs, iterations):
    """Rung 3: one jitted call per EM iteration, nothing read back until the end."""
    params, trajectory = (weights, means, covs), []
    for _ in range(iterations):
        params, log_lik = em_step_jit(x, params)
        trajectory.append(log_lik)
    return (*params, jnp.stack(trajectory))


RUNGS = {"1. compiled once": fit_compiled_once, "2. E step vectorised": fit_vectorised,
         "3. one jitted EM step": fit_step_jitted}
