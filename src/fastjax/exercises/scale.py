"""Part V's practice page's exercises (chapters/scale/04-practice.md): scale-1 to scale-4.

The programs and the reference solutions are the page's, exported to ``scale_code``. The checks split
their data over the devices that JAX has when they run (:func:`mesh`): eight simulated CPU devices on the
page, one in a notebook or a test process where JAX started without asking for more. Every problem's
number of cells is a multiple of 8, so that 1, 2, 4 or 8 devices divide it; with another device count,
the mesh takes the largest count that divides it.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fastjax import pln
from fastjax.exercises import Exercise, register, same_arrays, scale_code as code
from fastjax.scale import sharding

PAGE = "chapters/scale/04-practice"
PART = "Part V"
ENTROPY_CELLS, ENTROPY_GENES = 64, 64  # scale-1: the starting program makes two dispatches per cell
COVARIANCE_CELLS, COVARIANCE_GENES = 512, 128  # scale-2
FIT_CELLS, FIT_GENES = 256, 64  # scale-3: what the fit pays besides its arithmetic
# scale-4: large enough that the arithmetic every device repeats shows. The fit's scan alone, data
# placed, split against copied, on the 2-core machine (busy, so ratios vary from run to run): 256 × 64
# 0.7x (copied faster: one all-reduce fewer per step), 512 × 128 1.2x to 3.0x, 1024 × 512 3.4x.
LARGE_FIT_CELLS, LARGE_FIT_GENES = 1024, 512
CELL_COUNTS = (ENTROPY_CELLS, COVARIANCE_CELLS, FIT_CELLS, LARGE_FIT_CELLS)
# The fits' tolerance: the same float32 steps, the update done by XLA or NumPy, in one program or in
# twelve; losses and coefficients a few ulps apart per step (measured: 3e-7 relative at most over 12
# steps, tests/test_exercises_scale.py). A fit that averages over the cells of one device only, or skips
# the update, moves the losses by 1e-2 or more.
FIT_RTOL = 1e-4


def mesh(explicit: bool = False) -> Any:
    """A 1-D mesh over the most devices (of those JAX has) that divides every problem's number of cells."""
    n = math.gcd(*CELL_COUNTS)
    k = max(d for d in range(1, len(jax.devices()) + 1) if n % d == 0)
    return sharding.sample_mesh(k, explicit=explicit)


@functools.lru_cache(maxsize=4)
def _counts(cells: int, genes: int) -> np.ndarray:
    """The first ``cells`` × ``genes`` single-cell counts that pyPLNmodels ships (float32, read once)."""
    counts = pln.load_scrna_counts(cells, genes).counts.astype(np.float32)
    counts.setflags(write=False)
    return counts


def entropy_problem() -> tuple:
    """``(counts,)``: ``ENTROPY_CELLS`` × ``ENTROPY_GENES`` counts on the devices, split by cells."""
    return (sharding.shard_rows(jnp.asarray(_counts(ENTROPY_CELLS, ENTROPY_GENES)), mesh()),)


def covariance_problem() -> tuple:
    """``(mesh, x)``: an explicit mesh, and log(1 + counts) of ``COVARIANCE_CELLS`` cells split over it."""
    m = mesh(explicit=True)
    return m, sharding.shard_rows(jnp.asarray(np.log1p(_counts(COVARIANCE_CELLS, COVARIANCE_GENES))), m)


def fit_problem(cells: int = FIT_CELLS, genes: int = FIT_GENES) -> tuple:
    """``(mesh, covariates, counts)``: the mesh, and on the host (NumPy) an intercept and the centred log
    library size of each cell ``(cells, 2)``, and the counts ``(cells, genes)``."""
    counts = _counts(cells, genes)
    size = np.log(counts.sum(axis=1) + 1.0)
    covariates = np.column_stack([np.ones(cells), size - size.mean()]).astype(np.float32)
    return mesh(), covariates, counts.copy()


def large_fit_problem() -> tuple:
    """:func:`fit_problem` with ``LARGE_FIT_CELLS`` × ``LARGE_FIT_GENES`` counts (scale-4)."""
    return fit_problem(LARGE_FIT_CELLS, LARGE_FIT_GENES)


def _several_devices() -> str:
    """Empty where the mesh has more than one device; else why the lesson cannot show, in words."""
    if mesh().size > 1:
        return ""
    return ("on one device there is nothing to gather: the starting program and the reference are the same "
            "program. Part IV's pages run on 8 simulated devices (sharding.use_cpu_devices(8), before JAX starts)")


def _four_devices() -> str:
    """Empty where the mesh has four devices or more; else why the data per device cannot show the lesson."""
    if mesh().size >= 4:
        return ""
    return (f"on {mesh().size} device(s) a copy of the data weighs at most twice a device's share, too close "
            "to tell from a right answer's other arrays. Part IV's pages run on 8 simulated devices "
            "(sharding.use_cpu_devices(8), before JAX starts)")


def _in_mesh(answer: Callable[..., Any], args: tuple) -> Any:
    m, x = args
    with jax.set_mesh(m):
        return answer(x)


def same_fit(got: Any, want: Any) -> None:
    """Raise AssertionError (plain words) unless two fits ``(coef, losses)`` agree within ``FIT_RTOL``
    (the coefficients: of their largest entry)."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise AssertionError("a fit returns (coef, losses): the coefficients and the loss of each step")
    coef, losses = (np.asarray(a, dtype=np.float32) for a in got)
    want_coef, want_losses = (np.asarray(a) for a in want)
    same_arrays(losses, want_losses, rtol=FIT_RTOL, what="the losses of the fit")
    same_arrays(coef, want_coef, rtol=0, atol=FIT_RTOL * float(np.max(np.abs(want_coef))),
                what="the fitted coefficients")


def _same_covariance(got: Any, want: Any) -> None:
    # float32 sums over 512 cells in another order: ~1e-6 of the largest entry; 1e-4 of it catches a
    # division by n instead of n − 1 (0.2 % off) and a matrix left uncentred
    same_arrays(got, want, rtol=0, atol=1e-4 * float(np.max(np.abs(np.asarray(want)))), what="the covariance")


register(Exercise(
    name="scale-1", title="One call over the sharded axis", part=PART, page=PAGE,
    skill="a batched op (vmap) over the sharded axis, not a loop over samples", minutes=15,
    arguments=entropy_problem, reference=code.entropies, start=code.entropies_loop,
    # the same float32 operations per cell, summed in another order by vmap: a few ulps of ~3 nats;
    # normalizing by the total of all cells instead of each cell's moves them by whole nats
    same=lambda got, want: same_arrays(got, want, rtol=1e-5, what="the entropies"),
    wrong_hint="each cell's profile is divided by that cell's total (a sum over its genes, axis 1 of counts)",
    slow_hint="one jitted call on the whole array: jax.jit(jax.vmap(cell_entropy))",
    witness=("programs",),  # the loop dispatches programs per cell; the vmap one for all
    repeats=3,
))

register(Exercise(
    name="scale-2", title="Partial sums, not a gather", part=PART, page=PAGE,
    skill="contract the sharded axis into a replicated result (out_sharding=P()), no all-gather", minutes=20,
    arguments=covariance_problem, reference=code.gene_covariance, start=code.gene_covariance_start,
    run=_in_mesh, same=_same_covariance,
    wrong_hint="centre each gene on its mean over the cells, and divide by n − 1",
    slow_hint="no reshard of x: jnp.matmul(centred.T, centred, out_sharding=jax.P()) sums each device's "
              "partial product with one all-reduce",
    # the gather runs only where the mesh has more than one device (Part IV's pages ask for 8); on one device
    # both programs are the same: nothing to count, and time decides (it cannot tell them apart)
    witness=("all-gathers",), trace_applies=_several_devices,
))

register(Exercise(
    name="scale-3", title="The whole fit on the devices", part=PART, page=PAGE,
    skill="data split once, parameters kept on the devices, all steps in one call (lax.scan)", minutes=25,
    arguments=fit_problem, reference=code.fit_one_call, start=code.fit_host, same=same_fit,
    wrong_hint="start from zero coefficients, take STEPS steps of coef − LEARNING_RATE × gradient, carry the "
               "coefficients from step to step, and return the loss before each step",
    slow_hint="shard_rows the data and replicate the coefficients once; then one jitted lax.scan over the STEPS "
              "steps (jitted once, outside your function): no np.asarray or float() inside the loop",
    witness=("host reads",),  # the starting program reads the gradient and the loss back at every step
))

register(Exercise(
    name="scale-4", title="Split the data, do not copy it", part=PART, page=PAGE,
    skill="shard an array over the devices instead of replicating it", minutes=15,
    arguments=large_fit_problem, reference=code.fit_one_call, start=code.fit_copied, same=same_fit,
    wrong_hint="the same fit as scale-3: only where the data lives changes",
    slow_hint="sharding.shard_rows puts each device's cells on it; sharding.replicate gives every device "
              "every cell, and XLA then computes the whole gradient on each",
    # the copied data is every row on every device (8x a share on 8 devices); counted where it is placed
    witness=("data per device",), trace_applies=_four_devices,
))
