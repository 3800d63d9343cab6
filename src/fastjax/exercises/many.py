"""Part IV's practice page's exercises (chapters/many/04-practice.md): many-1 to many-4.

The programs and the reference solutions are the page's, exported to ``many_code``. Each exercise's inputs
are the book's data (the oaks counts of Part I, the digits of Part II), made the same way at both sizes,
small enough that a check runs in seconds; none needs PyTorch.

many-3's witness is memory: its ``run`` compiles the answer, reads XLA's memory analysis of the compiled
program, and raises :class:`OutOfMemory` where the scratch (temp) exceeds ``MEMORY_BUDGET_MIB``, as a device
with that much free memory would refuse to run it. It is not raced (``timed=False``): chunks trade memory
for time, and the lesson is the memory.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fastjax import pln
from fastjax.tools import timing
from fastjax.exercises import (Exercise, compiled_for, many_code as code, register, same_arrays, scratch_bytes,
                               unseen)

PAGE = "chapters/many/04-practice"
PART = "Part IV"
PCA_TAXA = 10  # many-2: the small problem of Part I's practice page (116 × 10)
# many-2's new data sets, one per check (``unseen``): the first taxa of the oaks counts, 11 to 114 of them
NEW_WIDTHS = tuple(range(11, 115))
BOOT_SAMPLES, BOOT_TAXA = 64, 50  # many-3: 64 bootstrap samples of the oaks counts, first 50 taxa
# many-3: the scratch memory a program may need. The all-at-once program needs about 20 MiB, chunks of 16
# about 5.7 MiB, chunks of 8 about 3 MiB (XLA's memory analysis, jax 0.10.2 and 0.12, see notes/TOLERANCES.md):
# 8 sits 2.5x from the all-at-once program, and the reference (chunks of 8, the largest within half of it) 2.8x below.
MEMORY_BUDGET_MIB = 8
SEEDS = tuple(range(8))  # many-4: the sweep's members
SWEEP_STEPS, SWEEP_BATCH = 10, 32  # many-4: steps, and digits per batch


# ---------------------------------------------------------------- the inputs

@functools.lru_cache(maxsize=1)
def glm_problem() -> tuple:
    """many-1's ``(x, counts, offsets)``: the oaks design (intercept; tree resistant, tree susceptible, against
    intermediate; south-west, against north-east; distance to the ground, standardized), ``(116, 5)``, and the
    counts and log offsets, ``(116, 114)``, float32. Cached: JAX arrays cannot change."""
    import pandas as pd

    covariates = pd.read_csv(pln.data_folder("oaks") / "covariates.csv")
    distance = covariates["distTOground"].to_numpy(np.float64)
    x = np.column_stack([np.ones(len(covariates)), covariates["tree"] == "resistant",
                         covariates["tree"] == "susceptible", covariates["orientation"] == "SW",
                         (distance - distance.mean()) / distance.std()])
    oaks = pln.load_oaks_counts()
    return tuple(jnp.asarray(np.asarray(a, np.float64), jnp.float32) for a in (x, oaks.counts, oaks.offsets))


@functools.lru_cache(maxsize=None)
def pca_problem(taxa: int = PCA_TAXA) -> pln.PlnData:
    """many-2's data: the oaks counts, the first ``taxa`` taxa, float32 JAX arrays (Part I's practice problem)."""
    from fastjax.exercises.pln_code import small_oaks

    return small_oaks(taxa=taxa)


@functools.lru_cache(maxsize=1)
def bootstrap_problem() -> pln.PlnData:
    """many-3's ``BOOT_SAMPLES`` bootstrap samples of the oaks counts (first ``BOOT_TAXA`` taxa), stacked."""
    from fastjax.pln import collection as col

    oaks = pln.load_oaks_counts()
    data = pln.check_pln_data(np.asarray(oaks.counts)[:, :BOOT_TAXA], np.asarray(oaks.offsets)[:, :BOOT_TAXA])
    samples, _ = col.bootstrap_samples(data, BOOT_SAMPLES, seed=0)
    return pln.to_jax(samples)


@functools.lru_cache(maxsize=1)
def _sweep_batches() -> tuple:
    from fastjax.resnet import digits

    split = digits.split()
    xs, ys = digits.stack_batches(split.train_images, split.train_labels, SWEEP_BATCH, SWEEP_STEPS, seed=0)
    return jnp.asarray(xs.reshape(SWEEP_STEPS, SWEEP_BATCH, 64)), jnp.asarray(ys)


HIDDEN = 32  # many-4: units of the hidden layer


def init_member(seed: int) -> tuple:
    """One many-4 member's state: its weights (He-scaled), its BatchNorm running statistics, its SGD momentum."""
    rng = np.random.default_rng(seed)
    params = {"w1": rng.standard_normal((64, HIDDEN)) * np.sqrt(2 / 64), "gamma": np.ones(HIDDEN),
              "beta": np.zeros(HIDDEN), "w2": rng.standard_normal((HIDDEN, 10)) / np.sqrt(HIDDEN), "b2": np.zeros(10)}
    params = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
    stats = {"mean": jnp.zeros(HIDDEN), "var": jnp.ones(HIDDEN)}
    return params, stats, code.TX.init(params)


def sweep_problem() -> tuple:
    """many-4's ``(states, xs, ys)``: the members' first states stacked (one row per seed of ``SEEDS``), and
    ``SWEEP_STEPS`` batches of ``SWEEP_BATCH`` digits as rows of 64 pixels, with their labels."""
    return (code.stack_members([init_member(seed) for seed in SEEDS]), *_sweep_batches())


# ---------------------------------------------------------------- comparing results

def relative_to_largest(got: Any, want: Any, fraction: float, what: str) -> None:
    """Each array of ``got`` within ``fraction`` of the largest entry of the reference's array (no rtol)."""
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    if jax.tree.structure(got) != jax.tree.structure(want):  # same_arrays names the structure
        same_arrays(got, want, rtol=0, what=what)
    for g, w in zip(got_leaves, want_leaves):
        same_arrays(g, w, rtol=0, atol=fraction * float(np.max(np.abs(np.asarray(w)))), what=what)


def _coefficients(got: Any, want: Any) -> None:
    # float32 Newton fits, converged: 1.7e-5 from float64 at most on coefficients up to 12 (2.7e-6 where
    # |b| < 1), the loop and the vmap 2.4e-5 apart (SSE4.2 to AVX-512 code): the bound 1e-4 + 1e-4·|b| is 25x
    # the worst of them. The ridge penalty on the intercept too moves some coefficient by 1.7, 7,500x the bound.
    same_arrays(got, want, rtol=1e-4, atol=1e-4, what="the coefficients (taxon, covariate)")


def _elbo_paths(got: Any, want: Any) -> None:
    # float32 ELBOs of the same fits, padded or not: identical bits here; 7.3e-6 (relative) from float64 at
    # most; a mask on the wrong columns, one column too many or no mask moves some member's ELBO by 11 % or
    # more (tests/test_exercises_many.py). 1e-3 sits 130x above the one and 100x below the other.
    same_arrays(got, want, rtol=1e-3, what="the ELBO trajectories (rank, step)")


def _refits(got: Any, want: Any) -> None:
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError("your bootstrap must return (coefficients, ELBOs), as refit does for each sample; "
                             f"it returned a {type(got).__name__}")
    # float32, the same operations per sample in batches of another size: identical bits in our runs; Rprop
    # amplifies a difference only where a gradient entry is within rounding of 0. From float64: ELBOs 3.5e-6
    # (relative), coefficients 1.7e-6 (absolute; |B| from 3e-4 to 3.3), 45x inside 1e-5 + 1e-4·|B|. A sample
    # refitted in its neighbour's place is off by 0.8 % (ELBOs) and 170 % (coefficients) at least.
    same_arrays(got[0], want[0], rtol=1e-4, atol=1e-5, what="the coefficients (sample, 1, taxon)")
    same_arrays(got[1], want[1], rtol=1e-4, what="the ELBOs (sample, step)")


def _sweep(got: Any, want: Any) -> None:
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise AssertionError("your sweep must return (states, losses): the members' states stacked as they came "
                             f"in, and the losses (member, step); it returned a {type(got).__name__}")
    states, losses = got
    # float32, the same operations per member: 2e-7 between the loop and the vmap, 3.7e-7 of the largest entry
    # from float64 after 10 steps of SGD (SSE4.2 to AVX-512 code); 1e-4 of each array's largest entry leaves
    # 270x, and BatchNorm's statistics taken over the members (losses 30 % off), or one copy of the running
    # statistics (18 % off and more), are far outside it.
    relative_to_largest(losses, want[1], 1e-4, "the losses (member, step)")
    if not (isinstance(states, (tuple, list)) and len(states) == 3):
        raise AssertionError("the states must be (weights, running statistics, optimizer state), stacked by member")
    relative_to_largest(states[0], want[0][0], 1e-4, "the weights (one row per member)")
    relative_to_largest(states[1], want[0][1], 1e-4, "BatchNorm's running statistics (one row per member)")
    relative_to_largest(states[2], want[0][2], 1e-4, "the optimizer state (one row per member)")


# ---------------------------------------------------------------- many-3: the memory budget

class OutOfMemory(MemoryError):
    """many-3's program needs more scratch memory than ``MEMORY_BUDGET_MIB``."""


def run_within_budget(answer: Callable[..., Any], args: tuple) -> Any:
    """Compile ``answer`` for ``args`` (once), and run it, unless its scratch memory exceeds the budget."""
    compiled, temp = compiled_for(answer, *args), scratch_bytes(answer, *args)
    if temp > MEMORY_BUDGET_MIB * 2**20:
        raise OutOfMemory(f"the compiled program needs {temp / 2**20:.1f} MiB of scratch memory (XLA's memory "
                          f"analysis), above the budget of {MEMORY_BUDGET_MIB} MiB: a device with that much free "
                          "memory would stop here (RESOURCE_EXHAUSTED). The check compiles your whole answer as one "
                          "program (jax.jit), as the exercise asks: a Python loop over chunks is unrolled into it, and "
                          "its chunks' scratch adds up; jax.lax.map(..., batch_size=k) keeps one chunk's")
    return compiled(*args)


# ---------------------------------------------------------------- the exercises

def _as_numpy(answer: Callable[..., Any], args: tuple) -> Any:
    # the result read once as NumPy, for every program alike: a final read costs every answer the same
    return np.asarray(answer(*args))


register(Exercise(
    name="many-1", title="One program for a loop of fits", part=PART, page=PAGE,
    skill="turn a Python loop of small fits into one program with jax.vmap", minutes=20,
    arguments=glm_problem, reference=code.fit_all_taxa, start=code.fit_each_taxon,
    run=_as_numpy, same=_coefficients,
    wrong_hint="vmap fit_poisson itself: the design shared (in_axes None), the counts and the offsets mapped over "
               "their columns (in_axes 1), and the taxa first in the result (out_axes 0)",
    slow_hint="one jax.jit(jax.vmap(fit_poisson, in_axes=(None, 1, 1))): one program for all the taxa, called once",
    # the starting program reads every fit's coefficients (np.asarray) before the next, and dispatches a program
    # per taxon; a lax.map over the taxa is one program whose fits run one after another (loops: the fit's
    # while loop once per taxon, where the vmap runs each of its loops once for all taxa)
    witness=("host reads", "programs", "loops"),
    slow_hints={"host reads": "the loop waits for each fit's coefficients (np.asarray) before it starts the next: "
                              "vmap the fit over the taxa, and read the table once, after the one call",
                "programs": "nothing waits, but the loop still dispatches one program per taxon: vmap the fit over "
                            "the columns, and jit the vmapped function once",
                "loops": "one program, but its taxa run one after another (a lax.map or a loop inside jit runs the "
                         "fit's loop once per taxon): jax.vmap the fit over the columns instead"},
    repeats=3,  # the loop is 10x slower or more: three rounds say so
))


def _pca_arguments() -> tuple:
    return (pca_problem(),)


def _new_width(answer: Callable[..., Any], args: tuple) -> Any:
    return answer(pca_problem(unseen(answer, NEW_WIDTHS)))  # data of a shape new to the answer's programs


register(Exercise(
    name="many-2", title="Ranks padded to one shape", part=PART, page=PAGE,
    skill="pad members of different sizes to one shape, with a mask, so that one program fits them all", minutes=30,
    arguments=_pca_arguments, reference=code.fit_ranks_at_once, start=code.fit_ranks_one_by_one,
    probe=_new_width, same=_elbo_paths,
    wrong_hint="member q's mask holds q ones, then zeros (its first q columns are real, as member_start draws "
               "them); multiply M, S and C by it before they enter the ELBO, take log 1 = 0 instead of log S² on the "
               "padding, and count n·q/2 with the mask's sum",
    slow_hint="pad every member to the largest rank and fit them all with one jitted jax.vmap over the masks: "
              "one program, whatever the ranks",
    # compiles, counted on new data: one program per rank for the loop, one for the padded collection; a loop
    # over the padded members calls one program, once per member (programs), and runs the fit's loop once per
    # member (loops) where the vmap runs it once for all
    witness=("compiles", "programs", "loops"),
    slow_hints={"compiles": "for new data (the check fits a collection of another number of taxa) your version "
                            "compiled one program per shape: pad every member to the largest rank, mask, and fit "
                            "them with one jitted jax.vmap",
                "programs": "one program compiles, but it still runs member by member: jax.vmap the fit over the "
                            "masks, so that one call fits every rank",
                "loops": "one program compiles, but it still runs member by member: jax.vmap the fit over the "
                         "masks, so that one call fits every rank"},
    repeats=3,
))


def _bootstrap_arguments() -> tuple:
    return (bootstrap_problem(),)


register(Exercise(
    name="many-3", title="In chunks, within a memory budget", part=PART, page=PAGE,
    skill="run a vmap that does not fit in memory in chunks with jax.lax.map(..., batch_size=k)", minutes=20,
    arguments=_bootstrap_arguments, reference=code.bootstrap_in_chunks, start=code.bootstrap_all_at_once,
    run=run_within_budget, same=_refits,
    wrong_hint="jax.lax.map(refit, samples, batch_size=k) with a k whose scratch fits the budget (read it with "
               f"scratch_mib for a few k): {MEMORY_BUDGET_MIB} MiB. Refit every sample, in order, unchanged",
    timed=False,  # the witness is memory, read by run_within_budget; chunks are not meant to be faster
))


register(Exercise(
    name="many-4", title="BatchNorm statistics per member", part=PART, page=PAGE,
    skill="sweep networks with BatchNorm as one program, each member keeping its own statistics", minutes=30,
    arguments=sweep_problem, reference=code.train_all_at_once, start=code.train_one_by_one, same=_sweep,
    wrong_hint="vmap train_step over every member's state (in_axes 0 for weights, running statistics and optimizer "
               "state alike; None for the batch): inside it, BatchNorm's axis 0 is the member's own batch. Do not "
               "stack the members by hand, and keep one row of running statistics per member",
    slow_hint="one jax.jit(jax.vmap(train_step, in_axes=(0, None, None))), called once per step for all members",
    witness=("programs",),  # a loop over the members dispatches a step per member and step; the vmap one per step
    repeats=5,
))


def members_stacked_by_hand(states: Any, xs: Any, ys: Any) -> tuple:
    """many-4 written by hand, the members' weights stacked, a wrong answer on purpose: BatchNorm's mean over
    axis 0 is then over the members, not over each member's batch (its running statistics are left as they
    were, for brevity). ``(states, losses)``, the losses ``(member, step)``, as the exercise asks."""
    def losses_of(params, x, y):
        h = jnp.einsum("bi,kih->kbh", x, params["w1"])  # (members, batch, units)
        h = (h - h.mean(axis=0)) / jnp.sqrt(h.var(axis=0) + code.EPS) * params["gamma"][:, None] + params["beta"][:, None]
        logits = jnp.einsum("kbh,khc->kbc", jax.nn.relu(h), params["w2"]) + params["b2"][:, None]
        return jax.vmap(lambda l: optax.softmax_cross_entropy_with_integer_labels(l, y).mean())(logits)

    @jax.jit
    def step(state, x, y):
        params, stats, opt_state = state
        (_, member_losses), grads = jax.value_and_grad(lambda p: (losses_of(p, x, y).sum(), losses_of(p, x, y)),
                                                       has_aux=True)(params)
        updates, opt_state = code.TX.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), stats, opt_state), member_losses

    out = []
    for x, y in zip(xs, ys):
        states, loss = step(states, x, y)
        out.append(loss)
    return states, jnp.stack(out, axis=1)


def scratch_mib(fn: Callable[..., Any], *args: Any) -> float:
    """XLA's scratch memory (temp) for one call of ``fn(*args)``, in MiB (compiled once and kept, as the check does)."""
    return scratch_bytes(fn, *args) / 2**20


def chunk_sizes(repeats: int) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, timing.Timing]]:
    """many-3's evidence, on the check's samples: the all-at-once program, chunks of 32 and 16, and the
    reference's chunks of ``code.CHUNK``, each compiled once. Raises if any computes other numbers than the
    reference, or if ``code.CHUNK`` is not the largest chunk tried whose scratch is at most half the budget.
    Returns the table's rows (scratch in MiB, within the budget, ms per call), the scratch by program (MiB),
    and the timings (``repeats`` rounds in turns)."""
    (samples,) = _bootstrap_arguments()
    start_name, ref_name = "all 64 at once (start)", f"chunks of {code.CHUNK} (reference)"
    programs = {start_name: code.bootstrap_all_at_once,
                **{f"chunks of {k}": jax.jit(lambda s, k=k: jax.lax.map(code.refit, s, batch_size=k)) for k in (32, 16)},
                ref_name: code.bootstrap_in_chunks}
    compiled = {name: compiled_for(fn, samples) for name, fn in programs.items()}  # compiled once, kept
    scratch = {name: scratch_mib(fn, samples) for name, fn in programs.items()}
    want = compiled[ref_name](samples)
    for name, program in compiled.items():
        # float32, the same operations per sample in batches of another size: identical bits in our runs; 1e-5
        # leaves room for another vector width (a sample in its neighbour's place is off by 0.8 % or more)
        same_arrays(program(samples), want, rtol=1e-5, what=name)
    t = timing.time_interleaved({name: (lambda p=p: p(samples)) for name, p in compiled.items()}, repeats=repeats)
    rows = [{"program": name, "scratch (MiB)": scratch[name],
             "within the budget": "yes" if scratch[name] <= MEMORY_BUDGET_MIB else "no",
             "ms per call": t[name].median * 1e3} for name in programs]
    # the reference's chunk is the largest of those tried whose scratch is at most half the budget
    tried = {BOOT_SAMPLES: start_name, 32: "chunks of 32", 16: "chunks of 16", code.CHUNK: ref_name}
    within_half = [k for k, name in tried.items() if scratch[name] <= MEMORY_BUDGET_MIB / 2]
    if not within_half or code.CHUNK != max(within_half):
        raise AssertionError(f"the reference's chunk {code.CHUNK} is not the largest of {sorted(tried)} whose scratch "
                             f"is at most half of {MEMORY_BUDGET_MIB} MiB: {within_half}")
    return rows, scratch, t
