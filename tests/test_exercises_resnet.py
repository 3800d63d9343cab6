"""Part II's practice exercises (fastjax.exercises.resnet): for each one, a right answer passes the check
and does not compile again, a plausible wrong answer is named wrong with a message, and a slow answer is
named slow by a margin that load cannot flip (a retrace, which the check counts, not times)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import resnet as practice, resnet_code as code
from fastjax.resnet import rungs as R

# one worker runs this file, so that each program compiles once for all its tests
pytestmark = pytest.mark.xdist_group("exercises-resnet")

NAMES = ("resnet-1", "resnet-2", "resnet-3", "resnet-4")
REFERENCES = {"resnet-1": code.train_flat, "resnet-2": code.test_loss, "resnet-3": code.train_flat,
              "resnet-4": code.train_flat_eqx}
STARTS = {"resnet-1": code.train_nnx_jit, "resnet-2": code.test_loss_start, "resnet-3": code.train_scan,
          "resnet-4": code.train_filter_jit}


def test_the_four_exercises_are_registered_with_their_page(root):
    found = {e.name: e for e in ex.all_exercises("resnet")}
    assert set(NAMES) <= set(found)
    toc = (root / "_toc.yml").read_text()
    for name in NAMES:
        e = found[name]
        assert e.part == "Part II" and e.page == practice.PAGE and e.page in toc and e.minutes > 0
        assert e.start is STARTS[name] and e.reference is REFERENCES[name]


@pytest.mark.parametrize("name", NAMES)
def test_the_starting_program_is_right(name):
    # the page checks the starting program as its answer: it must be right (and slow, below)
    report = ex.check(name, STARTS[name], time_it=False)
    assert report.right, report.text()





@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_right_and_does_not_compile_again(name):
    report = ex.check(name, REFERENCES[name], time_it=False)
    assert report.right, report.text()
    assert ex.compiles_on_a_second_run(name, REFERENCES[name]) == 0


def _flat_without(write_back):
    def train(model, optimizer, images, labels):
        graphdef, treedef, leaves = R.floor_start(model, optimizer)
        step = code.flat_step(graphdef, treedef)
        losses = []
        for x, y in zip(images, labels):
            leaves, loss = step(leaves, x, y)
            losses.append(loss)
        write_back(model, optimizer, graphdef, jax.tree.unflatten(treedef, leaves))
        return jnp.stack(losses)

    return train


def test_resnet_1_a_loop_that_forgets_to_write_back_is_wrong():
    report = ex.check("resnet-1", _flat_without(lambda *a: None), time_it=False)
    assert not report.right and "losses of the two epochs" in report.problem and "nnx.update" in report.text()


def test_resnet_1_a_stale_optimizer_state_is_wrong():
    # only the model gets the new weights; Adam's moments and count stay those of the start (4.5e-3 off)
    def model_only(model, optimizer, graphdef, state):
        trained, _ = nnx.merge(graphdef, state)
        nnx.update(model, nnx.state(trained))

    report = ex.check("resnet-1", _flat_without(model_only), time_it=False)
    assert not report.right and "differ from the reference's" in report.problem


def _retracing(train):
    """``train`` plus a jitted lambda made on every call: a new function, so JAX traces and compiles it each
    time (a tiny program, so that the test stays quick), the mistake of a jit built inside a function."""
    def answer(*args):
        out = train(*args)
        if isinstance(out, tuple):
            return (*out[:-1], jax.jit(lambda ls: ls + 0.0)(out[-1]))
        return jax.jit(lambda ls: ls + 0.0)(out)

    return answer


@pytest.mark.parametrize("name", ["resnet-1", "resnet-3", "resnet-4"])
def test_an_answer_that_compiles_on_every_call_is_slow(name):
    report = ex.check(name, _retracing(REFERENCES[name]), repeats=1)
    assert report.right and report.retraces and report.slow and not report.passed, report.text()
    assert "RIGHT, BUT SLOW" in report.text() and "compiled" in report.text()


def test_resnet_2_the_starting_program_is_slow_it_compiles_every_call():
    report = ex.check("resnet-2", code.test_loss_start, repeats=1)
    assert report.right and report.retraces and report.slow, report.text()
    assert report.structural_misses == ["compiles"] and "(jit(loss_of))" in report.text()  # counted, not timed
    assert "make the nnx.jit once" in report.text()


@jax.jit
def _eval_loss_split(graphdef, state, images, labels):  # resnet-2 another way: split once, jax.jit, merge
    return R.loss_fn(nnx.merge(graphdef, state), images, labels)


def eval_split_and_merged(model, images, labels):
    model.eval()
    graphdef, state = nnx.split(model)
    loss = _eval_loss_split(graphdef, state, images, labels)
    model.train()
    return loss


eval_loss_decorated = nnx.jit(lambda model, images, labels: R.loss_fn(model, images, labels))


def eval_with_a_module_level_lambda(model, images, labels):  # another: a lambda, but made once
    model.eval()
    try:
        return eval_loss_decorated(model, images, labels)
    finally:
        model.train()


def test_resnet_2_right_answers_written_other_ways_pass_on_their_compilations():
    for right in (code.test_loss, eval_split_and_merged, eval_with_a_module_level_lambda):
        report = ex.check("resnet-2", right, repeats=1)
        assert report.right and report.compiles == 0 and not report.structural_misses, (right.__name__, report.text())
        assert report.passed or report.by_time == "slow", report.text()


def test_resnet_2_evaluating_in_training_mode_is_wrong():
    report = ex.check("resnet-2", lambda model, images, labels: code.eval_loss(model, images, labels),
                      time_it=False)
    assert not report.right and "test loss" in report.problem and "model.eval()" in report.text()


def test_resnet_2_leaving_the_model_in_evaluation_mode_is_named():
    def stays_in_eval(model, images, labels):
        model.eval()
        return code.eval_loss(model, images, labels)

    report = ex.check("resnet-2", stays_in_eval, time_it=False)
    assert not report.right and "left in evaluation mode" in report.problem


def test_resnet_3_a_scan_over_the_first_batch_only_is_wrong():
    # an indexing slip: every step of the scan sees the epoch's first batch
    def first_batch_only(model, optimizer, images, labels):
        return code.train_scan(model, optimizer, jnp.broadcast_to(images[:1], images.shape),
                               jnp.broadcast_to(labels[:1], labels.shape))

    report = ex.check("resnet-3", first_batch_only, time_it=False)
    assert not report.right and "losses of the two epochs" in report.problem


def test_resnet_4_returning_the_untrained_model_is_wrong():
    def stale(model, bn_state, opt_state, images, labels):
        *_, losses = code.train_flat_eqx(model, bn_state, opt_state, images, labels)
        return model, bn_state, opt_state, losses

    report = ex.check("resnet-4", stale, time_it=False)
    assert not report.right and "differ from the reference's" in report.problem and "eqx.combine" in report.text()


def test_resnet_4_returning_only_the_losses_is_named():
    report = ex.check("resnet-4", lambda *args: code.train_flat_eqx(*args)[-1], time_it=False)
    assert not report.right and "must return (model, bn_state, opt_state, losses)" in report.problem


def test_problems_are_fresh_and_the_same_each_time():
    a, b = practice.training_problem(), practice.training_problem()
    assert a[0] is not b[0] and a[1] is not b[1]
    assert practice.two_epochs(code.train_flat, a).shape == (2 * practice.STEPS,)
    assert jnp.array_equal(practice.two_epochs(code.train_flat, b), practice.two_epochs(code.train_flat,
                                                                                         practice.training_problem()))
