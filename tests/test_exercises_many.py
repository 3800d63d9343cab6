"""Part IV's practice exercises (fastjax.exercises.many): for each one, the starting program computes the
reference's numbers, the reference passes and does not compile again, a plausible wrong answer is named wrong
with a message, and a slow answer (or one over many-3's memory budget) is named by a witness that load cannot
flip: a count of host reads or compilations, or XLA's memory analysis."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import many as practice, many_code as code

pytestmark = pytest.mark.xdist_group("exercises-many")

NAMES = ("many-1", "many-2", "many-3", "many-4")
REFERENCES = {"many-1": code.fit_all_taxa, "many-2": code.fit_ranks_at_once, "many-3": code.bootstrap_in_chunks,
              "many-4": code.train_all_at_once}
STARTS = {"many-1": code.fit_each_taxon, "many-2": code.fit_ranks_one_by_one, "many-3": code.bootstrap_all_at_once,
          "many-4": code.train_one_by_one}


def test_the_four_exercises_are_registered_with_their_page(root):
    found = {e.name: e for e in ex.all_exercises("many")}
    assert sorted(found) == list(NAMES)
    toc, page = (root / "_toc.yml").read_text(), (root / f"{practice.PAGE}.md").read_text()
    assert "many" in ex.PARTS and practice.PAGE in toc
    for name in NAMES:
        e = found[name]
        assert e.part == "Part IV" and e.page == practice.PAGE and e.minutes > 0
        assert e.start is STARTS[name] and e.reference is REFERENCES[name]
        assert f'exercises.check("{name}", my_answer)' in page and f"## Exercise {name}:" in page


@pytest.mark.parametrize("name", ["many-1", "many-2", "many-4"])
def test_the_starting_program_is_right(name):
    assert ex.check(name, STARTS[name], time_it=False).right


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_right_and_does_not_compile_again(name):
    assert ex.check(name, REFERENCES[name], time_it=False).right
    assert ex.compiles_on_a_second_run(name, REFERENCES[name]) == 0


# ---------------------------------------------------------------- many-1: a loop of fits

def test_many_1_the_loop_reads_every_fit_and_is_slow_whatever_the_clock_says():
    report = ex.check("many-1", code.fit_each_taxon, repeats=1)
    assert report.right and report.slow and not report.passed, report.text()
    assert report.structural_misses == ["host reads", "programs", "loops"] and report.host_reads == 114, report.text()
    assert "read the table once" in report.text()


def test_many_1_taxa_on_the_wrong_axis_of_the_result_are_named():
    report = ex.check("many-1", jax.jit(jax.vmap(code.fit_poisson, in_axes=(None, 1, 1), out_axes=1)), time_it=False)
    assert not report.right and "shape (5, 114)" in report.problem and "out_axes 0" in report.text()


def test_many_1_the_tolerance_is_far_from_rounding_and_far_from_a_mistake():
    x, counts, offsets = practice.glm_problem()
    with jax.enable_x64(True):  # the fits to rounding
        exact = np.asarray(code.fit_all_taxa(*(jnp.asarray(a, jnp.float64) for a in (x, counts, offsets))))
    allowed = 1e-4 + 1e-4 * np.abs(exact)  # the check's atol and rtol
    for fn in (code.fit_each_taxon, code.fit_all_taxa):
        assert np.max(np.abs(np.asarray(fn(x, counts, offsets)) - exact) / allowed) < 0.1  # 10x margin or more

    # a plausible mistake: the ridge penalty on every coefficient, the intercept included
    penalized_intercept = jax.jit(jax.vmap(lambda y, o: _fit_penalizing_all(x, y, o), in_axes=(1, 1)))
    report = ex.check("many-1", lambda x_, c, o: penalized_intercept(c, o), time_it=False)
    assert not report.right and "coefficients" in report.problem


def _fit_penalizing_all(x, y, offset):
    b = jnp.zeros(x.shape[1], x.dtype).at[0].set(jnp.log(jnp.sum(y) / jnp.sum(jnp.exp(offset))))

    def newton(_, b):
        mu = jnp.exp(offset + x @ b)
        hessian = (x.T * mu) @ x + code.RIDGE * jnp.eye(x.shape[1], dtype=x.dtype)
        return b + jnp.linalg.solve(hessian, x.T @ (y - mu) - code.RIDGE * b)

    return jax.lax.fori_loop(0, code.NEWTON_STEPS, newton, b)


# ---------------------------------------------------------------- many-2: padded and masked

def _padded_with(masks_of):
    """many-2's reference with the masks ``masks_of(q_max)`` instead of the right ones."""
    def answer(data):
        q_max = max(code.RANKS)
        return code.fit_padded(code.member_start(data, q_max), data, jnp.asarray(masks_of(q_max), data.counts.dtype))
    return answer


WRONG_MASKS = {
    "no mask": lambda q_max: np.ones((len(code.RANKS), q_max)),  # the padding leaks: every member of rank q_max
    "the last columns": lambda q_max: np.arange(q_max)[::-1] < np.asarray(code.RANKS)[:, None],
    "one column too many": lambda q_max: np.arange(q_max) <= np.asarray(code.RANKS)[:, None],
}


@pytest.mark.parametrize("mistake", sorted(WRONG_MASKS))
def test_many_2_a_wrong_mask_is_named(mistake):
    answer = _padded_with(WRONG_MASKS[mistake])
    report = ex.check("many-2", answer, time_it=False)
    assert not report.right and "ELBO trajectories" in report.problem and "mask" in report.text(), report.text()
    # the size of the mistake that the check's comment quotes: 11 % or more on some member (measured); 5 % here
    got, want = np.asarray(answer(practice.pca_problem())), np.asarray(code.fit_ranks_at_once(practice.pca_problem()))
    assert np.max(np.abs(got / want - 1)) > 5e-2


def test_many_2_a_padding_that_enters_log_s2_is_named():
    # S padded with zeros and the mask left out of log S²: log 0 = -inf, NaN in the gradient
    def elbo(params, data, mask):
        return code.pca_elbo_masked(params, data, mask) + 0.5 * jnp.sum(jnp.log((params.s * mask) ** 2)) \
            - 0.5 * jnp.sum(jnp.log(jnp.where(mask > 0, (params.s * mask) ** 2, 1.0)))

    fit = jax.jit(jax.vmap(lambda p, d, m: code.rprop_fit(lambda *a: -elbo(*a), p, d, m), in_axes=(None, None, 0)))

    def answer(data):
        q_max = max(code.RANKS)
        masks = jnp.asarray(np.arange(q_max) < np.asarray(code.RANKS)[:, None], data.counts.dtype)
        return fit(code.member_start(data, q_max), data, masks)

    report = ex.check("many-2", answer, time_it=False)
    assert not report.right and ("NaN" in report.problem or "infinity" in report.problem), report.text()


def test_many_2_one_program_per_rank_is_slow_by_its_compilations_on_new_data():
    report = ex.check("many-2", code.fit_ranks_one_by_one, repeats=1)
    assert report.right and report.slow and not report.passed, report.text()
    assert report.structural_misses == ["compiles", "programs", "loops"] and report.compiles == len(code.RANKS), report.text()
    assert report.reference_structure.compiles == 1 and "pad every member" in report.text()


def test_many_2_the_tolerance_is_far_from_rounding():
    data = practice.pca_problem()
    ours = np.asarray(code.fit_ranks_at_once(data), np.float64)
    with jax.enable_x64(True):
        exact = np.asarray(code.fit_ranks_at_once(jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), data)))
    assert np.max(np.abs(ours / exact - 1)) < 1e-3 / 10  # the check's rtol is ten times float32's error or more


def test_many_2_the_mask_removes_the_padding_exactly_in_float64():
    data = practice.pca_problem()
    with jax.enable_x64(True):
        data64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), data)
        alone, padded = np.asarray(code.fit_ranks_one_by_one(data64)), np.asarray(code.fit_ranks_at_once(data64))
    # float64: the same n·p terms per ELBO and the padding's exact zeros, summed in another order, over 30 Rprop
    # steps that only amplify a gradient entry within rounding of 0: u64 · n·p · a condition of ~10 is 1e-12;
    # 1e-10 leaves 100× (measured 0), and a wrong mask is off by 11 % or more (above)
    assert np.max(np.abs(padded / alone - 1)) < 1e-10


# ---------------------------------------------------------------- many-3: the memory budget

def test_many_3_all_at_once_is_over_the_budget_with_the_same_numbers():
    report = ex.check("many-3", code.bootstrap_all_at_once)
    assert not report.right and "OutOfMemory" in report.problem and "budget of 8 MiB" in report.problem
    assert "batch_size=k" in report.text()
    samples = practice.bootstrap_problem()
    got, want = code.bootstrap_all_at_once(samples), code.bootstrap_in_chunks(samples)
    ex.same_arrays(got, want, rtol=0, what="all at once against chunks")  # identical bits here


def test_many_3_the_budget_sits_far_from_both_programs():
    samples = practice.bootstrap_problem()
    budget = practice.MEMORY_BUDGET_MIB * 2**20
    assert practice.scratch_bytes(code.bootstrap_all_at_once, samples) > 2 * budget
    assert practice.scratch_bytes(code.bootstrap_in_chunks, samples) < budget / 2


@pytest.mark.parametrize("k, fits", [(16, True), (4, True), (32, False)])
def test_many_3_any_chunk_that_fits_passes_and_a_larger_one_is_refused(k, fits):
    answer = jax.jit(lambda s: jax.lax.map(code.refit, s, batch_size=k))
    report = ex.check("many-3", answer)
    assert report.right == fits and report.passed == fits, report.text()
    if not fits:
        assert "OutOfMemory" in report.problem


def test_many_3_chunks_by_hand_that_drop_the_last_samples_are_named():
    def answer(samples):  # chunks of 12 cut by hand: 5 of them, and the last 4 samples forgotten
        chunks = jax.tree.map(lambda a: a[:60].reshape(5, 12, *a.shape[1:]), samples)
        out = jax.lax.map(jax.vmap(code.refit), chunks)
        return jax.tree.map(lambda a: a.reshape(60, *a.shape[2:]), out)

    report = ex.check("many-3", answer)
    assert not report.right and "shape (60, 1, 50)" in report.problem, report.text()


# ---------------------------------------------------------------- many-4: BatchNorm per member

def _shared_statistics(states, xs, ys):
    """The sweep with one copy of the running statistics: after each step their mean over the members,
    broadcast back to every member."""
    losses = []
    for x, y in zip(xs, ys):
        states, loss = code.train_step_members(states, x, y)
        params, stats, opt_state = states
        stats = jax.tree.map(lambda a: jnp.broadcast_to(a.mean(axis=0), a.shape), stats)
        states = (params, stats, opt_state)
        losses.append(loss)
    return states, jnp.stack(losses, axis=1)


def test_many_4_one_copy_of_the_running_statistics_is_named():
    report = ex.check("many-4", _shared_statistics, time_it=False)
    assert not report.right and "running statistics" in report.problem, report.text()
    # the weights and losses are right: only BatchNorm's state is wrong, by far more than the tolerance
    got, want = _shared_statistics(*practice.sweep_problem()), code.train_all_at_once(*practice.sweep_problem())
    mean_got, mean_want = np.asarray(got[0][1]["mean"]), np.asarray(want[0][1]["mean"])
    assert np.max(np.abs(mean_got - mean_want)) > 1e-2 * np.max(np.abs(mean_want))


def test_many_4_statistics_taken_over_the_members_are_named():
    report = ex.check("many-4", practice.members_stacked_by_hand, time_it=False)
    assert not report.right and "the losses" in report.problem and "axis 0" in report.text(), report.text()


def test_many_4_the_tolerance_is_far_from_rounding():
    states, xs, ys = practice.sweep_problem()
    ours = code.train_all_at_once(states, xs, ys)
    with jax.enable_x64(True):
        exact = code.train_all_at_once(jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), states),
                                       jnp.asarray(xs, jnp.float64), ys)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(exact)):
        b = np.asarray(b)
        assert np.max(np.abs(np.asarray(a, np.float64) - b)) < 1e-4 / 10 * np.max(np.abs(b))


def test_many_4_an_answer_that_compiles_on_every_call_is_slow():
    def retracing(states, xs, ys):  # the vmapped step jitted anew in every call: compiled every time
        step = jax.jit(jax.vmap(code.train_step, in_axes=(0, None, None)))
        losses = []
        for x, y in zip(xs, ys):
            states, loss = step(states, x, y)
            losses.append(loss)
        return states, jnp.stack(losses, axis=1)

    report = ex.check("many-4", retracing, repeats=1)
    assert report.right and report.retraces and report.slow and not report.passed, report.text()
