"""Part II's practice page's exercises (chapters/resnet/09-practice.md): resnet-1 to resnet-4.

The programs and the reference solutions are the page's, exported to ``resnet_code``. Three exercises
train Part II's network for two "epochs" (two calls of the answer, the second on what the first left
behind) and compare the losses of both; one evaluates the test loss. The problems are small, so that a
check compiles and runs in seconds on a laptop CPU, and the same in both sizes.
"""

from __future__ import annotations

from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx

from fastjax.exercises import Exercise, register, resnet_code as code, same_arrays
from fastjax.resnet import digits, ladder, resnet_eqx, resnet_nnx, rungs as R
from fastjax.resnet.resnet_nnx import ResNetConfig

PAGE = "chapters/resnet/09-practice"
PART = "Part II"
CONFIG = ResNetConfig(width=8, stages=1, blocks=1)  # Part II's quick network
BATCH = 32  # images per step
# The Equinox exercise trains on smaller batches: what it removes is per-call work, which a step of 32
# images hid behind its compute (1.4x measured, against 2-2.8x with 8 images per step).
EQX_BATCH = 8
STEPS = 4  # steps per epoch; a run trains two epochs
TEST_IMAGES = 256
# Two programs that train the same way, compiled differently (a scan, another order of sums), give
# losses a few 1e-7 apart over two epochs (1.2e-7 measured); a program that traces the same step gives
# the same bits. The mistakes to catch move them far more: the optimizer's state not written back moves
# the second epoch's losses by 4.5e-3, the model's by 3e-2, each step's change of the loss is 2e-3 or
# more (measured at this size; tests/test_exercises_resnet.py). 1e-5 is 80 times the rounding seen.
LOSS_RTOL = 1e-5


def training_problem(config: ResNetConfig = CONFIG, batch: int = BATCH, steps: int = STEPS, seed: int = 0) -> tuple:
    """A fresh NNX network and Adam, and two epochs of batches: ``(model, optimizer, images1, labels1,
    images2, labels2)``, the images of each epoch stacked ``(steps, batch, 8, 8, 1)``."""
    model = resnet_nnx.make_model(config, seed)
    xs, ys = (jnp.asarray(a) for a in ladder.training_batches(2 * steps, batch, seed))
    return model, nnx.Optimizer(model, R.TX, wrt=nnx.Param), xs[:steps], ys[:steps], xs[steps:], ys[steps:]


def eqx_problem(config: ResNetConfig = CONFIG, batch: int = EQX_BATCH, steps: int = STEPS, seed: int = 0) -> tuple:
    """The Equinox twin of the same network (the same weights), its BatchNorm state and a fresh Adam state,
    and the same two epochs: ``(model, bn_state, opt_state, images1, labels1, images2, labels2)``."""
    model, bn_state = resnet_eqx.from_nnx(resnet_nnx.make_model(config, seed))
    xs, ys = (jnp.asarray(a) for a in ladder.training_batches(2 * steps, batch, seed))
    opt_state = R.TX.init(eqx.filter(model, eqx.is_array))
    return model, bn_state, opt_state, xs[:steps], ys[:steps], xs[steps:], ys[steps:]


def evaluation_problem(config: ResNetConfig = CONFIG, n_images: int = TEST_IMAGES, seed: int = 0) -> tuple:
    """A fresh network (in training mode) and the first ``n_images`` test images and labels."""
    split = digits.split()
    return (resnet_nnx.make_model(config, seed), jnp.asarray(split.test_images[:n_images]),
            jnp.asarray(split.test_labels[:n_images]))


def _losses(value: Any, what: str) -> jax.Array:
    try:
        return jnp.asarray(value, dtype=jnp.float32).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be the losses, an array or a list of numbers; got {type(value).__name__}") from None


def two_epochs(train: Callable[..., Any], problem: tuple) -> jax.Array:
    """Call ``train(model, optimizer, images, labels)`` on each epoch of ``problem`` (see
    :func:`training_problem`), the second on the model and optimizer the first left; the losses of both."""
    model, optimizer, xs1, ys1, xs2, ys2 = problem
    first = _losses(train(model, optimizer, xs1, ys1), "what the training function returns")
    second = _losses(train(model, optimizer, xs2, ys2), "what the training function returns")
    return jnp.concatenate([first, second])


def two_epochs_eqx(train: Callable[..., Any], problem: tuple) -> jax.Array:
    """The same for an Equinox training function ``train(model, bn_state, opt_state, images, labels) ->
    (model, bn_state, opt_state, losses)``: the second epoch starts from what the first returned."""
    model, bn_state, opt_state, xs1, ys1, xs2, ys2 = problem
    out = train(model, bn_state, opt_state, xs1, ys1)
    if not isinstance(out, (tuple, list)) or len(out) != 4:
        raise TypeError("the training function must return (model, bn_state, opt_state, losses); got "
                        f"{type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else ""))
    model, bn_state, opt_state, first = out
    *_, second = train(model, bn_state, opt_state, xs2, ys2)
    return jnp.concatenate([_losses(first, "the losses it returns"), _losses(second, "the losses it returns")])


def _evaluate(answer: Callable[..., Any], problem: tuple) -> jax.Array:
    model, images, labels = problem
    loss = answer(model, images, labels)
    if model.stem_bn.use_running_average:  # set by model.eval(), cleared by model.train()
        raise ValueError("the model is left in evaluation mode: call model.train() before returning")
    return _losses(loss, "the test loss")


def _same_losses(got: Any, want: Any) -> None:
    same_arrays(got, want, rtol=LOSS_RTOL, what="the losses of the two epochs")


register(Exercise(
    name="resnet-1", title="Take the walk out of the loop", part=PART, page=PAGE,
    skill="split once, jit a step on a flat list of arrays (no per-call graph walk)", minutes=20,
    arguments=training_problem, reference=code.train_flat, start=code.train_nnx_jit, run=two_epochs,
    same=_same_losses, repeats=5,
    witness=("python calls",),  # nnx.jit walks the model and the optimizer in Python on every step
    wrong_hint="after the loop, write the arrays back into both objects: nnx.update((model, optimizer), "
               "jax.tree.unflatten(treedef, leaves)); the second epoch starts from what the first left there",
    slow_hint="take nnx.split (or R.floor_start) out of the loop, and build the jitted step once per structure "
              "of (model, optimizer) (e.g. functools.cache on graphdef and treedef), not once per call",
))

register(Exercise(
    name="resnet-2", title="Stop compiling the evaluation", part=PART, page=PAGE,
    skill="find a retrace (count_traces, explain_cache_misses) and remove it", minutes=15,
    arguments=evaluation_problem, reference=code.test_loss, start=code.test_loss_start, run=_evaluate,
    # the same forward pass on the same weights: the same float32 loss; evaluating in training mode (the
    # batch's statistics) moves it by 6 % (measured)
    same=lambda got, want: same_arrays(got, want, rtol=LOSS_RTOL, what="the test loss"),
    wrong_hint="evaluate with model.eval() (BatchNorm's running statistics), then model.train() again",
    slow_hint="a function defined inside the call is a new function each time, and JAX compiles it again: "
              "make the nnx.jit once, outside the function",
    witness=("compiles",),
    repeats=3,
))

register(Exercise(
    name="resnet-3", title="A loop in lax.scan that got slower", part=PART, page=PAGE,
    skill="measure a change meant to help, and undo it when it does not", minutes=20,
    arguments=training_problem, reference=code.train_flat, start=code.train_scan, run=two_epochs,
    same=_same_losses, repeats=5,
    witness=("loops",),  # the rolled scan runs as an XLA while loop; a loop of jitted steps, or an unrolled scan, has none
    wrong_hint="the scan must carry the state from one step to the next, and the state must go back into the "
               "model and the optimizer after the epoch",
    slow_hint="on XLA:CPU a rolled lax.scan of train steps ran slower than one call per step (chapter 4, "
              "resnet/04-scan): measure both; a Python loop of jitted steps, or a fully unrolled scan, avoids it",
))

register(Exercise(
    name="resnet-4", title="Equinox: no flatten and no wait per step", part=PART, page=PAGE,
    skill="the flatten trick: jit a step on a flat list of arrays", minutes=20,
    arguments=eqx_problem, reference=code.train_flat_eqx, start=code.train_filter_jit, run=two_epochs_eqx,
    same=_same_losses, repeats=5,
    witness=("python calls",),  # eqx.filter_jit partitions and flattens the model in Python on every step
    wrong_hint="return the trained model and states (unflatten the leaves after the loop and eqx.combine the "
               "arrays with the static part), not the ones you were given",
    slow_hint="flatten once before the loop and keep the jitted step where the next call finds it (a "
              "functools.cache keyed on the tree structure); a new jax.jit per call compiles again",
))


def retrace_counts(model: Any, images: Any, labels: Any, calls: int = 3) -> dict[str, int]:
    """The evidence of resnet-2 (chapters/resnet/09-practice.md): how many times the loss is traced in
    ``calls`` calls of it, wrapped four ways (a new ``nnx.jit`` per call, one ``nnx.jit`` made once, a new
    ``jax.jit`` of the same function per call, a new ``jax.jit`` of a new function per call). ``jax.jit``
    keys its cache on the function it wraps; a new ``nnx.jit`` traces again even of the same function.
    In evaluation mode the loss writes nothing back into the model, so ``jax.jit`` can take it as it is.
    Raises AssertionError unless the counts are ``calls, 1, 1, calls``: they hold on any machine."""
    from fastjax.tools.timing import count_traces

    wraps = {"a new nnx.jit of the same function per call": (True, nnx.jit),
             "one nnx.jit, made once": (False, nnx.jit),
             "a new jax.jit of the same function per call": (True, jax.jit),
             "a new jax.jit of a new function per call": (True, lambda f: jax.jit(lambda *a: f(*a)))}
    traces = {}
    model.eval()
    try:
        for label, (per_call, wrap) in wraps.items():
            counted = count_traces(R.loss_fn)
            made = wrap(counted)
            for _ in range(calls):
                (wrap(counted) if per_call else made)(model, images, labels)
            traces[label] = counted.count
    finally:
        model.train()
    want = dict(zip(wraps, (calls, 1, 1, calls)))
    if traces != want:
        raise AssertionError(f"traces {traces}, expected {want}")
    return traces


def scan_convolutions(config: ResNetConfig = CONFIG, batch: int = BATCH, scan_was_slower: bool = True
                      ) -> tuple[int, int, str]:
    """The evidence of resnet-3 (chapters/resnet/09-practice.md): where the compiled programs of an epoch
    in one ``lax.scan`` (``resnet_code.scanned_steps``) and of one step (``resnet_code.flat_step``) keep
    their convolutions, counted by :func:`fastjax.resnet.bench.convolutions`. Returns the scan's
    convolutions in a loop in another layout than NHWC/HWIO, the one-step program's in another layout,
    and whether that is the pattern chapters/resnet/04-scan.md found, in words (``scan_was_slower``: what
    the race measured here)."""
    from fastjax.resnet.bench import convolutions

    model, optimizer, xs, ys, *_ = training_problem(config, batch)
    graphdef, treedef, leaves = R.floor_start(model, optimizer)
    scan = convolutions(code.scanned_steps(graphdef, treedef).lower(leaves, xs, ys).compile().as_text())
    step = convolutions(code.flat_step(graphdef, treedef).lower(leaves, xs[0], ys[0]).compile().as_text())
    print("convolutions by place and layout:", {"lax.scan": scan, "one step": step})
    in_loop_other = scan.get("in a loop, other layout", 0)
    step_other = sum(n for k, n in step.items() if k.endswith("other layout"))
    if not scan_was_slower:
        why = "here the scan was at least as fast, so it can stay"
    elif in_loop_other > 0 and step_other == 0:
        why = "the pattern that chapter found, beside a scan that was the slower program here"
    else:
        why = ("not that pattern, although the scan was the slower program here: its time goes elsewhere on this "
               "machine, and a profile of both programs (Part III) shows where")
    return in_loop_other, step_other, why
