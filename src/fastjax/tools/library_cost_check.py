"""The check behind the profiling page's cost table (chapters/tools/01-profile): on CPU, XLA's own cost
analysis leaves out exactly the LAPACK calls of a program (each counted as -1 flop and -1 byte), and
``profiling.cost`` puts back each call's textbook count, no more.

``check_xla_counts_library_calls_as_minus_one`` compiles a triangular solve and an LU of a given size with
and without the call; ``check_pln_step_cost`` counts the PLN step's LAPACK calls by hand from the model's
shapes and compares. Both raise ``AssertionError`` where a count disagrees.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fastjax.tools import profiling

# float64 sums of whole numbers and thirds, added in another order: measured 1e-16
LIBRARY_FLOPS_RTOL = 1e-12


def check_xla_counts_library_calls_as_minus_one(p: int) -> None:
    """A triangular solve (``trsm``) and an LU factorisation (``getrf``) of a p×p matrix each change XLA's
    flop count of a program by exactly -1, whatever they compute: the same program with and without the
    call (JAX writes NaN where LU reports a failure: kept in both)."""
    tri, rhs = jnp.tril(jnp.ones((p, p))) + p * jnp.eye(p), jnp.ones((p, p))
    pairs = {"trsm": (jax.jit(lambda l, b: jax.scipy.linalg.solve_triangular(l, b, lower=True) * 2.0).lower(tri, rhs),
                      jax.jit(lambda l, b: b * 2.0).lower(tri, rhs)),
             "getrf": (jax.jit(lambda a: jax.lax.linalg.lu(a)[0]).lower(tri),
                       jax.jit(lambda a, info: jnp.where(info >= 0, a, jnp.nan)).lower(tri, jnp.int32(0)))}
    for kernel, (with_call, without_call) in pairs.items():
        with_call, without_call = with_call.compile(), without_call.compile()
        kernels = [c["kernel"] for c in profiling.library_calls(with_call.as_text())]
        if kernels != [kernel]:
            raise AssertionError(f"expected one {kernel} call, found {kernels}")
        if profiling.xla_cost(with_call)["flops"] != profiling.xla_cost(without_call)["flops"] - 1:
            raise AssertionError(f"XLA does not count the {kernel} call as -1 flop")


def check_pln_step_cost(cost: dict[str, float], xla_cost: dict[str, float], hlo: str, p: int, d: int,
                        float_bytes: int) -> None:
    """What ``profiling.cost`` adds to XLA's count of the PLN step (``p`` species, ``d`` covariates) is the -1
    of each of its library calls taken back plus the textbook flops and bytes of those calls: log|Σ| is an
    LU of the p×p Σ, its gradient two triangular solves with p right-hand sides; B = (XᵀX)⁻¹XᵀM an LU of the
    d×d XᵀX and two solves with p right-hand sides, its gradient two more."""
    ib = 4  # bytes of LAPACK's int32 pivots and status
    lu_flops, solve_flops = (lambda k: 2 * k**3 / 3), (lambda k, m: k * k * m)  # k×k matrix, m right-hand sides
    lu_bytes = lambda k: 2 * float_bytes * k * k + ib * (k + 1)  # noqa: E731 reads A; writes its LU, pivots, status
    solve_bytes = lambda k, m: float_bytes * (k * k + 2 * k * m)  # noqa: E731 reads the triangle and m columns, writes m
    textbook_flops = lu_flops(p) + 2 * solve_flops(p, p) + lu_flops(d) + 4 * solve_flops(d, p)
    textbook_bytes = lu_bytes(p) + 2 * solve_bytes(p, p) + lu_bytes(d) + 4 * solve_bytes(d, p)
    calls = hlo.count(" custom-call(")  # every custom call of the step, LAPACK or not
    if calls != 1 + 2 + 1 + 4:
        raise AssertionError(f"{calls} custom calls in the PLN step, expected 8")
    added_flops, want = cost["flops"] - xla_cost["flops"], calls + textbook_flops
    if abs(added_flops - want) > LIBRARY_FLOPS_RTOL * abs(want):  # as np.testing.assert_allclose with this rtol
        raise AssertionError(f"profiling.cost adds {added_flops} flops, the textbook {want}")
    added = cost["bytes accessed"] - xla_cost["bytes accessed"]
    if added != calls + textbook_bytes:
        raise AssertionError(f"profiling.cost adds {added} bytes, the textbook {calls + textbook_bytes}")


def check_costs(costs: dict[str, dict[str, float]], xla_costs: dict[str, dict[str, float]], pln_hlo: str, p: int,
                d: int, float_bytes: int) -> None:
    """Both checks on CPU; elsewhere (no LAPACK calls), that ``profiling.cost`` leaves every count as XLA's."""
    if jax.default_backend() == "cpu":
        check_xla_counts_library_calls_as_minus_one(p)
        check_pln_step_cost(costs["pln"], xla_costs["pln"], pln_hlo, p, d, float_bytes)
    elif not all(costs[name][k] == xla_costs[name][k] for name in xla_costs for k in xla_costs[name]):
        raise AssertionError("profiling.cost changed a count of a program without LAPACK calls")
