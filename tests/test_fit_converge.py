"""``--converge``: each PLN-PCA member of ``--ranks``, the PLN fit, and each refit of ``--bootstrap`` fitted on,
in float64, to a point where an independent optimiser (SciPy's L-BFGS-B on the float64 ELBO) finds nothing more
to gain; the output says how each stopped."""

from __future__ import annotations

import contextlib
import io
import json

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import fit as fitcmd
from fastjax.pln.fit import fits

RNG = np.random.default_rng(3)
# 30 samples × 6 counts with two latent directions: a table a rank-2 PLN-PCA describes
LATENT = RNG.normal(size=(30, 2)) @ RNG.normal(scale=0.8, size=(2, 6))
COUNTS = RNG.poisson(np.exp(1.0 + LATENT))
STATIONARY_RTOL = 1e-6  # what SciPy may still gain from the converged member, relative to its ELBO (float64;
# the rule stops at gains under 1e-7 per 200 iterations, so a member short of a stationary point would give more)


def run(*args):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = fitcmd.main([str(a) for a in args])
    return code, printed.getvalue()


def scipy_gain(loss, start):
    """How much SciPy's L-BFGS-B, from the arrays ``start`` (a tuple), gains on ``loss`` (the negative ELBO of
    such a tuple, JAX, float64), relative to the ELBO at ``start``."""
    import jax
    import jax.numpy as jnp
    from scipy.optimize import minimize

    shapes = [np.shape(a) for a in start]
    cuts = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
    with jax.enable_x64(True):
        def unflat(v):
            return tuple(part.reshape(s) for part, s in zip(jnp.split(v, cuts), shapes))

        value_and_grad = jax.jit(jax.value_and_grad(lambda v: loss(unflat(v))))

        def fun(v):
            value, grad = value_and_grad(jnp.asarray(v))
            return float(value), np.asarray(grad, np.float64)

        v0 = np.concatenate([np.ravel(a) for a in start])
        r = minimize(fun, v0, jac=True, method="L-BFGS-B", options=dict(maxiter=20_000, gtol=1e-10, ftol=1e-15))
        at_start = fun(v0)[0]
    return (at_start - r.fun) / abs(at_start)


def data64():
    import jax.numpy as jnp

    data = pln.check_pln_data(COUNTS)
    return pln.PlnData(*(jnp.asarray(a, jnp.float64) for a in data[:3]), jnp.float64(data.log_factorial))


def test_the_plain_fit_converges_to_where_scipy_finds_nothing_more(tmp_path):
    import jax

    counts, out = tmp_path / "c.csv", tmp_path / "fit.npz"
    np.savetxt(counts, COUNTS, fmt="%d", delimiter=",")
    code, capped = run(counts, "--json", "--no-cache")
    assert code == 0, capped
    code, text = run(counts, "--converge", "--json", "--no-cache", "--out", out)
    assert code == 0, text
    capped, got = json.loads(capped), json.loads(text)
    assert got["converged"] == [True] and 0 < got["converge_iterations"] < fits.CONVERGE_MAXITER
    assert got["iterations"] == capped["iterations"]  # the same Rprop fit first
    assert got["elbo"] >= capped["elbo"] - STATIONARY_RTOL * abs(capped["elbo"])
    saved = np.load(out)
    assert int(saved["converge_iterations"]) == got["converge_iterations"]
    assert saved["elbos"].size == got["iterations"] + got["converge_iterations"]
    with jax.enable_x64(True):
        d = data64()
        gained = scipy_gain(lambda ms: pln.loss(ms, d), (saved["M"], saved["S"]))
    assert gained < STATIONARY_RTOL, gained


def test_the_bootstrap_converges_every_refit(tmp_path):
    counts = tmp_path / "c.csv"
    np.savetxt(counts, COUNTS, fmt="%d", delimiter=",")
    code, text = run(counts, "--bootstrap", "3", "--seed", "5", "--converge", "--json", "--no-cache")
    assert code == 0, text
    got = json.loads(text)
    assert got["converged"] == [True] * 4 and len(got["converge_iterations"]) == 4
    assert all(0 < k < fits.CONVERGE_MAXITER for k in got["converge_iterations"])
    code, table = run(counts, "--bootstrap", "3", "--seed", "5", "--converge", "--no-cache", "--quiet")
    assert code == 0 and "--converge: then L-BFGS, in float64, took every fit on" in table, table
    assert "stopped at --maxiter" not in table  # the members stopped by L-BFGS's rule


@pytest.fixture(scope="module")
def converged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("converge")
    counts = folder / "c.csv"
    np.savetxt(counts, COUNTS, fmt="%d", delimiter=",")
    code, capped = run(counts, "--ranks", "1-2", "--json", "--no-cache")
    assert code == 0, capped
    out = folder / "out.npz"
    cache = folder / "cache"  # the second run loads both programs
    code, text = run(counts, "--ranks", "1-2", "--converge", "--json", "--cache", cache, "--out", out)
    assert code == 0, text
    code, table = run(counts, "--ranks", "1-2", "--converge", "--cache", cache, "--quiet")
    assert code == 0, table
    return json.loads(capped), json.loads(text), np.load(out), table


def test_converged_members_stop_by_the_rule_and_gain_on_the_capped_ones(converged):
    capped, got, _, _ = converged
    assert got["converged"] == [True, True] and len(got["converge_iterations"]) == 2
    assert all(0 < k < fits.CONVERGE_MAXITER for k in got["converge_iterations"])
    assert got["iterations"] == capped["iterations"]  # the same Rprop fit first
    gains = [(after - before) / abs(before) for after, before in zip(got["ELBO"], capped["ELBO"])]
    assert min(gains) >= 0 and max(gains) > 10 * STATIONARY_RTOL, gains  # the capped fit was short of the optimum
    assert [stage[0] for stage in got["stages"]][-2:] == ["--converge: trace, lower, compile its program",
                                                          "--converge: the fits"]


def test_the_table_says_how_each_member_stopped(converged):
    *_, table = converged
    lines = table.splitlines()
    assert lines[1].startswith("--converge: then L-BFGS, in float64, took each rank on")
    rows = [line.split() for line in lines[3:5]]
    assert [row[0] for row in rows] == ["1", "2"] and all(row[-1] == "converged" for row in rows)
    assert all("+" in row[4] for row in rows)  # Rprop's iterations + L-BFGS'


def test_a_converged_member_is_where_scipy_finds_nothing_more(converged):
    """The member BIC chooses, as written to --out: SciPy's L-BFGS-B from there, on the float64 ELBO, gains less
    than STATIONARY_RTOL; and the ELBO printed is NumPy's float64 one at those parameters."""
    import jax
    import jax.numpy as jnp

    from fastjax.pln import collection as col

    _, got, out, _ = converged
    data = pln.check_pln_data(COUNTS)
    start = col.PcaParams(out["M"], out["S"], out["C"], out["B"])
    rank = int(out["best_BIC"])
    elbo = float(col.pca_elbo(start, data, np.ones(rank), np))
    assert elbo == pytest.approx(got["ELBO"][got["ranks"].index(rank)], rel=1e-12, abs=0)
    with jax.enable_x64(True):
        d = data64()
        gained = scipy_gain(lambda p: -col.pca_elbo(col.PcaParams(*p), d, jnp.ones(rank)), tuple(start))
    assert gained < STATIONARY_RTOL, gained
