"""Part I's practice exercises (chapters/pln/08-practice.md): pln-1 to pln-4.

Every answer is a PLN fit on a small problem (the oaks counts, first 10 taxa: 116 × 10): it returns the
final ``(M, S)`` and the ELBO before each update. The starting programs and the references are the
page's, exported to ``pln_code``; the references reuse the rungs of ``fastjax.pln.rungs``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from fastjax.exercises import Exercise, pln_code as code, register, same_arrays

PAGE = "chapters/pln/08-practice"
N_ITER = 20  # iterations of a checked fit: a fit of the starting programs lasts a few ms to a second


@functools.lru_cache(maxsize=1)
def small_data() -> Any:
    """The page's small problem, loaded once (JAX arrays cannot change, and no fit donates them)."""
    return code.small_oaks()


def _fit_arguments() -> tuple:
    return (small_data(), N_ITER)


def same_fit(got: Any, want: Any) -> None:
    """Raise AssertionError, in plain words, unless ``got`` is ``((M, S), ELBOs)`` and agrees with ``want``.

    The fits of the page run the same float32 operations grouped into other programs: their ELBOs and
    final (M, S) were identical bits in our runs (both legs). The bounds leave room for another
    compiler's rounding, which Rprop's sign-based steps can carry over a few iterations; a wrong fit
    (a dropped optimizer state, the ELBO after the update, another start) is off by 10 % or more.
    """
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], (tuple, list))
            and len(got[0]) == 2):
        raise AssertionError("your fit must return ((M, S), ELBOs): the final parameters as a pair, and the "
                             f"ELBO before each update; it returned a {type(got).__name__}")
    got_elbos, want_elbos = np.asarray(got[1]), np.asarray(want[1])
    if got_elbos.shape != want_elbos.shape:
        raise AssertionError(f"your fit returned {got_elbos.shape[0] if got_elbos.ndim else 0} ELBOs, the "
                             f"reference {want_elbos.shape[0]}: one per iteration run")
    same_arrays(got_elbos, want_elbos, rtol=1e-5, what="the ELBO trajectory")
    same_arrays(tuple(got[0]), tuple(want[0]), rtol=1e-4, atol=1e-6, what="the final (M, S)")


WRONG_HINT = ("compare your trajectory with the starting program's, one iteration at a time: the same start "
              "(pln.start), the ELBO before each update (not after), the optimizer state carried from step "
              "to step")

register(Exercise(
    name="pln-1", title="Jit the update once", part="Part I", page=PAGE,
    skill="remove a retrace: one optimizer, one jitted update for every fit", minutes=20,
    arguments=_fit_arguments, reference=code.fit_update_jitted_once, start=code.fit_new_optimizer_each_time,
    same=same_fit, wrong_hint=WRONG_HINT,
    slow_hint="pln.optimizer() returns a new update function at each call, and jax.jit caches by function: a "
              "fit that makes its optimizer and jits its update compiles it again. Make both once, outside "
              "the fit (chapters/pln/02-jit)",
    witness=("compiles", "programs"),  # programs: a step run op by op dispatches one program per operation
    slow_hints={"compiles": "pln.optimizer() returns a new update function at each call, and jax.jit caches by "
                            "function: a fit that makes its optimizer (or jits a step) inside compiles it again. "
                            "Make the optimizer and the jitted step once, outside the fit (chapters/pln/02-jit)",
                "programs": "nothing compiles again, so the optimizer is made once; but the update runs op by op: "
                        "jit the whole step, gradient and tx.update together (jax.jit of a function that calls "
                        "both), once, outside the fit (chapters/pln/02-jit)"},
    repeats=2,  # the starting program compiles at every call: two rounds say so
))

register(Exercise(
    name="pln-2", title="The loop into lax.scan", part="Part I", page=PAGE,
    skill="move the Python loop of the fit into lax.scan", minutes=25,
    arguments=_fit_arguments, reference=code.fit_scan, start=code.fit_update_jitted_once,
    same=same_fit, wrong_hint=WRONG_HINT,
    slow_hint="one jitted function whose body is a lax.scan over the iterations (n_iter static), carrying "
              "(params, optimizer state) and returning the ELBOs as the scan's stacked output "
              "(chapters/pln/03-scan)",
    witness=("programs",),  # the loop dispatches the jitted update once per iteration, the scan once per fit
    repeats=3,
))

register(Exercise(
    name="pln-3", title="A state that does not rebuild itself", part="Part I", page=PAGE,
    skill="carry the state as a NamedTuple instead of a class whose tree_unflatten runs __init__", minutes=25,
    arguments=_fit_arguments, reference=code.fit_with_namedtuple, start=code.fit_with_class,
    same=same_fit, wrong_hint=WRONG_HINT,
    slow_hint="JAX rebuilds the state a jitted step returns with tree_unflatten; if that runs __init__, Python "
              "recomputes whatever __init__ computes after every step. Carry a NamedTuple (rung 4's PlnState), "
              "or build the object without __init__ (chapters/pln/05-pytree-class)",
    witness=("programs",),  # __init__ run after every step dispatches its operations, one program each
    repeats=3,
))


def _stopping_arguments() -> tuple:
    return (small_data(),)


register(Exercise(
    name="pln-4", title="Stop inside the program", part="Part I", page=PAGE,
    skill="move the stopping rule into lax.while_loop (no Python if on a device value per iteration)", minutes=30,
    arguments=_stopping_arguments, reference=code.fit_until_in_program, start=code.fit_until_host_check,
    same=same_fit,
    wrong_hint="the fit must stop where pyPLNmodels' criterion (pln.criterion_update, from the ELBO before each "
               f"update) first falls below TOL_PRACTICE = {code.TOL_PRACTICE:g}, or after pln.MAXITER iterations, "
               "and return the ELBOs of the iterations it ran",
    slow_hint="one jitted lax.while_loop whose state holds the parameters, the optimizer state, the criterion "
              "and the ELBOs (a buffer of pln.MAXITER), and whose condition tests the criterion: no Python "
              "between iterations (rung 3's fit_until_converged, chapters/pln/03-scan)",
    witness=("host reads", "programs"),  # the starting program reads the criterion (float()) at every iteration
    repeats=2,  # the starting program is 10x slower or more: two rounds say so
))


def count_inits(cls: type, fit: Any, *args: Any) -> int:
    """How many times ``cls.__init__`` runs during ``fit(*args)`` (the evidence of pln-3: a pytree class whose
    ``tree_unflatten`` calls ``__init__`` runs it again for every state JAX rebuilds). ``__init__`` is
    wrapped for the call only."""
    count = [0]
    original = cls.__init__

    def counting(self: Any, *a: Any, **k: Any) -> None:
        count[0] += 1
        original(self, *a, **k)

    cls.__init__ = counting
    try:
        fit(*args)
    finally:
        cls.__init__ = original
    return count[0]
