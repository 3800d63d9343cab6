"""Part III's practice exercises (chapters/tools/05-practice.md): tools-1 to tools-4.

The starting programs and the references are the page's, exported to ``tools_code``; the data is Part I's
practice problem (``pln_code.small_oaks``: the oaks counts, first 10 taxa).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from fastjax import pln
from fastjax.exercises import Exercise, pln_code, register, same_arrays, tools_code as code, unseen
from fastjax.exercises.pln import same_fit, small_data

PAGE = "chapters/tools/05-practice"
TALL_REPEAT = 20  # tools-1: the small problem's rows stacked 20 times (2,320 × 10): the hat matrix is 2,320²


# ---------------------------------------------------------------- tools-1: the hot operation

@functools.lru_cache(maxsize=1)
def tall_data() -> Any:
    return pln_code.small_oaks(repeat=TALL_REPEAT)


def _loss_arguments() -> tuple:
    data = tall_data()
    return (pln.start(data), data)


_GRADIENTS: dict[Callable[..., Any], Callable[..., Any]] = {}


def value_and_grad_of(loss: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.jit(jax.value_and_grad(loss))``, made once per loss and kept: tools-1's check calls a loss
    this way, and the page times the same jitted functions, so that each compiles once."""
    if loss not in _GRADIENTS:
        _GRADIENTS[loss] = jax.jit(jax.value_and_grad(loss))
    return _GRADIENTS[loss]


def _value_and_grad(answer: Callable[..., Any], args: tuple) -> Any:
    return value_and_grad_of(answer)(*args)


def _same_value_and_gradients(got: Any, want: Any) -> None:
    """The value within 1e-6 (relative) and each gradient within 1e-5 of its largest entry: the page's
    two losses agree to 0 and 6e-11; the book's loss in float64 sits 1e-7 away; leaving out the diag(Σ S²)
    term of Σ moves the gradient in S by 7e-5 of its largest entry."""
    if not (isinstance(got, tuple) and len(got) == 2):
        raise AssertionError("the check differentiates your loss: it must return one number, the -ELBO")
    same_arrays(got[0], want[0], rtol=1e-6, what="the loss")
    for i, (g, w) in enumerate(zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]))):
        same_arrays(g, w, rtol=0.0, atol=1e-5 * float(np.max(np.abs(np.asarray(w)))),
                    what=f"the gradient with respect to {'MS'[i]}")


register(Exercise(
    name="tools-1", title="Find the hot operation, and shrink it", part="Part III", page=PAGE,
    skill="find the hot operation in a profile and shrink it", minutes=30,
    arguments=_loss_arguments, reference=code.loss_with_coefficients, start=code.loss_with_hat_matrix,
    run=_value_and_grad, same=_same_value_and_gradients,
    wrong_hint="keep every term of the profiled ELBO: R = M − XB with B = (XᵀX)⁻¹XᵀM, Σ = (RᵀR + diag(Σᵢ Sᵢ²)) / n, "
               "−(n/2) log|Σ| plus pln.poisson_part",
    slow_hint="profile it (profiling.traced_ops on the compiled value_and_grad): the slowest operations have "
              "n × n results. The regression needs B = (XᵀX)⁻¹XᵀM, a d × p matrix, not the n × n hat matrix",
    # the hat matrix is an n × n intermediate (2,320², 20 MiB in float32) in the compiled value_and_grad
    witness=("scratch",), program=value_and_grad_of,
    repeats=3,
))


# ---------------------------------------------------------------- tools-2: a compile time

FIXED_COUNT = 8  # the count whose criterion values are compared with the reference's
# The counts the structural count asks an answer for, one new to it per check (``unseen``), so that a program
# compiled per count compiles on it: 4 to 12 ELBOs first (0.1-0.6 s to compile unrolled here), then the
# others up to 48, for a process that checks the same function many times.
NEW_COUNTS = tuple(k for k in (*range(4, 13), *range(2, 4), *range(13, 49)) if k != FIXED_COUNT)


@functools.lru_cache(maxsize=1)
def fit_elbos() -> Any:
    return code.fit_elbos(small_data())


def _elbo_arguments() -> tuple:
    return (fit_elbos(),)


def _criterion_paths(answer: Callable[..., Any], args: tuple) -> Any:
    (elbos,) = args
    return np.asarray(answer(elbos, FIXED_COUNT))


def _criterion_path_new_count(answer: Callable[..., Any], args: tuple) -> Any:
    (elbos,) = args
    return answer(elbos, unseen(answer, NEW_COUNTS))  # a count the answer's programs have not seen


register(Exercise(
    name="tools-2", title="Cut a compile time", part="Part III", page=PAGE,
    skill="cut a compile time: a lax.scan instead of a Python loop unrolled in jit", minutes=25,
    arguments=_elbo_arguments, reference=code.criterion_path_scan, start=code.criterion_path_unrolled,
    run=_criterion_paths, probe=_criterion_path_new_count,
    # the same float32 operations rolled or unrolled: identical bits in our runs; the criterion is a
    # difference of normalized ELBOs and loses digits, so 1e-5 leaves room for another grouping
    same=lambda got, want: same_arrays(got, want, rtol=1e-5, what="the criterion values"),
    wrong_hint="the criterion after each ELBO is pln.criterion_update(crit, elbo).value, starting from "
               "pln.criterion_start(elbos.dtype); return the first `count` of them",
    slow_hint="a Python loop over range(count) inside jit puts count copies of its body in the program, and "
              "a static count compiles a new program for every count. Scan over all the ELBOs (one program, "
              "one copy of the body) and keep the first `count` values outside it",
    # counted: compilations of programs of the answer's own; a slice of the result outside jit (path[:count],
    # on the JAX array or in NumPy) is JAX's eager operation, compiled once per count, and not counted
    witness=("compiles",),
    slow_hints={"compiles": "the program named above compiled again for a new count: `count` reaches it (a static "
                            "argument, a range(count) or a shape made from count inside jit). Give the jitted "
                            "function the ELBOs only, scan over all of them, and slice its result after the call",
                "time": "nothing compiles again; what is left is the program itself: one lax.scan over the ELBOs "
                        "(one copy of the body), not a Python loop unrolled inside jit"},
    repeats=3,
))


# ---------------------------------------------------------------- tools-3: donation

@functools.lru_cache(maxsize=1)
def history_rows() -> list:
    return code.history_rows()


def _row_arguments() -> tuple:
    return (history_rows(),)


register(Exercise(
    name="tools-3", title="Donate the buffer", part="Part III", page=PAGE,
    skill="donate a buffer, so that XLA writes into it instead of copying it", minutes=20,
    arguments=_row_arguments, reference=code.record_row_in_place, start=code.record_row,
    run=lambda answer, args: code.fill_history(answer, args[0]),
    same=lambda got, want: same_arrays(got, want, rtol=0.0, what="the filled history"),  # copies: exact
    wrong_hint="row t of the history must hold the t-th row given (history.at[t].set(row))",
    slow_hint="each call copies the whole history to change one row, because the caller keeps the old one; "
              "donate it (jax.jit(..., donate_argnums=0)) and XLA writes the row in place",
    witness=("copies",),  # without donation each call copies the history (one copy instruction per call)
    repeats=2,  # the starting program is 10x slower or more: two rounds say so
))


# ---------------------------------------------------------------- tools-4: a host round trip

def _logged_fit_arguments() -> tuple:
    return (small_data(), code.N_ELBOS)


register(Exercise(
    name="tools-4", title="A host round trip in the loop", part="Part III", page=PAGE,
    skill="take a host round trip (a callback) out of the training loop", minutes=20,
    arguments=_logged_fit_arguments, reference=code.fit_elbos_on_device, start=code.fit_logged,
    same=same_fit,
    wrong_hint="return the final (M, S) and the ELBO before each update, one per iteration, as rung 3's "
               "scan_fit does",
    slow_hint="jax.debug.callback makes the compiled loop call back into Python at every iteration; return "
              "the ELBOs as the scan's stacked output and read them once, after the fit",
    witness=("host reads",),  # the starting program's callback reads each ELBO (float()) in Python: 50 reads
    repeats=3,
))
