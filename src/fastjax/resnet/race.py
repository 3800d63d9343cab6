"""The race of chapters/resnet/08-pytorch.md: Part II's ResNet in PyTorch (the twin written in that page,
:mod:`fastjax.resnet.torch_twin`) against the book's JAX steps, from the same weights on the same batches:
per train step, over a training run to a held-out accuracy (compilation apart and included, and read from
JAX's persistent cache in a fresh process), over the width of the network, and a profile of each side's
step. torch is imported only inside the functions that need it, so this module imports without it.

    FASTJAX_SIZE=full python -m fastjax.resnet.race --out race.json   # the whole race, and its ratios
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from fastjax import sizes
from fastjax.resnet import digits, floor as FL, resnet_eqx, resnet_nnx, rungs as R
from fastjax.resnet.bench import FASTER_FLOOR
from fastjax.resnet.ladder import settings, training_batches
from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools import profiling
from fastjax.tools import timing
from fastjax.tools.timing import Ratio, Timing, block, time_interleaved
TORCH_EAGER = "PyTorch eager"  # the twin as chapters/resnet/08-pytorch.md first writes it: NCHW, default Adam
# The twin as a PyTorch engineer tunes it for a CPU: model and input in channels_last (oneDNN then needs no
# reorder of the activations around each convolution) and Adam(fused=True) (one kernel updates every tensor).
TORCH_TUNED = "PyTorch tuned"
# The tuned twin's whole train step (forward, backward, Adam's step) under torch.compile, per mode; the
# torch.compile contenders of torch_modes compile the model only and keep Adam eager.
WHOLE_STEP = {"default": "torch.compile, whole tuned step",
              "max-autotune-no-cudagraphs": "torch.compile, whole tuned step (max-autotune-no-cudagraphs)"}
# Every way torch_way knows: name -> (channels_last for model and input, torch.optim.Adam's options, the
# torch.compile mode of the whole step or None). The full race runs them all, each its own row.
TORCH_WAYS = {TORCH_EAGER: (False, {}, None),
              "PyTorch channels_last": (True, {}, None),
              "PyTorch fused Adam": (False, {"fused": True}, None),
              "PyTorch foreach Adam": (False, {"foreach": True}, None),
              TORCH_TUNED: (True, {"fused": True}, None),
              **{name: (True, {"fused": True}, mode) for mode, name in WHOLE_STEP.items()}}
TORCH_EAGER_NAMES = (TORCH_EAGER, TORCH_TUNED)  # the quick race's PyTorch ways
TORCH_RACE_SAVED_AS = "resnet-torch"  # the part name its chapter saves the race under (fastjax.bench.save_part)
RACE_JAX = ("nnx.jit", "eqx.filter_jit", "floor", FASTER_FLOOR)


def race_settings() -> Any:
    """Sizes of the race: timing rounds per step, the training run (steps, an accuracy check every
    ``every`` steps, the held-out accuracy ``target``, rounds), the ``torch.compile`` modes, and the
    width sweep (two widths at the quick size, as in chapters/resnet/07-overhead.md: each width compiles
    again). Measured with the floor: the quick network (one stage) reaches 40 % held-out accuracy
    after about 85 of its 100 steps; the full one 94 % after 20, 98 % after 60 of its 600. The quick sweep
    leaves Part V's floor out: with one stage it has no image small enough to change, so it is the floor.
    ``torch.compile`` races at the full size only: its first call on a machine with an empty Inductor
    cache took 20 s at the quick size (2 s from the cache), a third of the page's minute."""
    return sizes.choose(
        quick=dict(repeats=5, run_steps=100, every=5, target=0.4, rounds=3, torch_modes=(), torch_ways=TORCH_EAGER_NAMES,
                   widths=(2, 32), sweep_names=(TORCH_EAGER, TORCH_TUNED, "floor"), sweep_repeats=3),
        full=dict(repeats=9, run_steps=600, every=10, target=0.98, rounds=3,
                  torch_modes=("default", "max-autotune-no-cudagraphs"), torch_ways=tuple(TORCH_WAYS),
                  widths=(2, 4, 8, 16, 32, 64), sweep_names=(TORCH_EAGER, TORCH_TUNED, "nnx.jit", "floor", FASTER_FLOOR),
                  sweep_repeats=5))


def torch_name(mode: str) -> str:
    """The name a ``torch.compile`` mode races under."""
    return "torch.compile" if mode == "default" else f"torch.compile ({mode})"


@dataclass
class Contender:
    """One way to train the network, restartable from the first weights: ``reset()`` puts back the
    weights and a fresh Adam; ``run(x, y)`` does one step on a batch from ``batch(images, labels)`` (the
    side's own format, made once outside the clock) and returns the loss; ``accuracy(images, labels)``:
    held-out accuracy with the running statistics. ``error``: why it cannot run (then nothing else works)."""

    name: str
    reset: Callable[[], None]
    run: Callable[[Any, Any], Any]
    batch: Callable[[Any, Any], tuple[Any, Any]]
    accuracy: Callable[[Any, Any], float]
    error: str | None = None
    first_call: float | None = None  # seconds of the first step ever run (compilation happens there)
    extra: dict[str, Any] = field(default_factory=dict)  # what a profile needs: the jitted step and its state
    threads: timing.Threads = field(default_factory=timing.xla_threads)  # its side's threads (a knob for PyTorch)

    def __post_init__(self) -> None:
        step = self.run

        def run(x: Any, y: Any) -> Any:
            if self.first_call is not None:
                return step(x, y)
            t0 = time.perf_counter()
            out = block(step(x, y))
            self.first_call = time.perf_counter() - t0
            return out

        self.run = run


@nnx.jit
def _nnx_predict(model: Any, x: jax.Array) -> jax.Array:
    return model(x).argmax(-1)


@eqx.filter_jit
def _eqx_predict(model: Any, state: Any, x: jax.Array) -> jax.Array:
    return resnet_eqx.forward(eqx.nn.inference_mode(model), state, x)[0].argmax(-1)


def nnx_accuracy(model: Any, images: Any, labels: Any) -> float:
    """Held-out accuracy of an NNX network in eval mode (running statistics), jitted once for every
    network of the same structure (``resnet_nnx.accuracy`` runs eagerly: seconds at the full size)."""
    model.eval()
    try:
        return float(np.mean(np.asarray(_nnx_predict(model, jnp.asarray(images))) == np.asarray(labels)))
    finally:
        model.train()


def eqx_accuracy(model: Any, state: Any, images: Any, labels: Any) -> float:
    """Held-out accuracy of the Equinox twin in inference mode, jitted (as ``nnx_accuracy``)."""
    return float(np.mean(np.asarray(_eqx_predict(model, state, jnp.asarray(images))) == np.asarray(labels)))


def _jax_contender(name: str, config: ResNetConfig, seed: int) -> Contender:
    """One of ``RACE_JAX``: its jitted step is made once (so ``reset`` compiles nothing again)."""
    batch = lambda images, labels: (jnp.asarray(images), jnp.asarray(labels))  # noqa: E731
    box: dict[str, Any] = {}
    if name == "nnx.jit":
        step = nnx.jit(R.train_step)

        def reset() -> None:
            box["model"] = resnet_nnx.make_model(config, seed)
            box["opt"] = nnx.Optimizer(box["model"], R.TX, wrt=nnx.Param)

        return Contender(name, reset, lambda x, y: step(box["model"], box["opt"], x, y), batch,
                         lambda i, l: nnx_accuracy(box["model"], i, l))
    if name == "eqx.filter_jit":
        step = eqx.filter_jit(R.eqx_train_step)

        def reset() -> None:
            model, state = resnet_eqx.from_nnx(resnet_nnx.make_model(config, seed))
            box["c"] = (model, state, R.TX.init(eqx.filter(model, eqx.is_array)))

        def run(x: Any, y: Any) -> Any:
            *c, loss = step(*box["c"], x, y)
            box["c"] = tuple(c)
            return loss

        return Contender(name, reset, run, batch, lambda i, l: eqx_accuracy(box["c"][0], box["c"][1], i, l))
    model = resnet_nnx.make_model(config, seed)
    graphdef, treedef, leaves0 = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
    makers = {"floor": R.floor_step, FASTER_FLOOR: FL.faster_floor_step}
    if name not in makers:
        raise ValueError(f"unknown JAX contender {name!r}; choose from {RACE_JAX}")
    step = jax.jit(makers[name](graphdef, treedef))

    def run(x: Any, y: Any) -> Any:
        box["leaves"], loss = step(box["leaves"], x, y)
        return loss

    return Contender(name, lambda: box.update(leaves=leaves0), run, batch,
                     lambda i, l: nnx_accuracy(nnx.merge(graphdef, jax.tree.unflatten(treedef, box["leaves"]))[0], i, l),
                     extra={"jitted": step, "leaves": lambda: box["leaves"]})


# How many versions of one Python frame torch.compile keeps before it runs that frame uncompiled (its
# recompile_limit, 8 by default). The float64 checks and the race compile the same functions (the train step,
# the network's forward) for other dtypes, layouts and models, and the checks' hooks split them into more
# frames: at the full size, python -m fastjax.resnet.race hit the limit within its first two minutes (dynamo's
# warning names the network's convolution frame). Past it, dynamo only runs the versions it has already
# compiled and runs the frame uncompiled where none fits (FrameAction.RUN_ONLY in torch/_dynamo/convert_frame.py).
# The race raises the limit to this, for the whole process.
TORCH_RECOMPILE_LIMIT = 64


def compiled(fn: Any, mode: str) -> Any:
    """``torch.compile(fn)`` in ``mode`` ("default" for torch's default), with dynamo's recompile limit
    raised to ``TORCH_RECOMPILE_LIMIT`` (never lowered)."""
    import torch

    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, TORCH_RECOMPILE_LIMIT)
    cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * TORCH_RECOMPILE_LIMIT)
    return torch.compile(fn, mode=None if mode == "default" else mode)


def torch_way(name: str) -> tuple[Callable, Callable, Callable]:
    """How the PyTorch contender ``name`` (of ``TORCH_WAYS``) trains the twin: ``prepare(model)`` (in place:
    the memory format), ``make_optimizer(parameters)``, ``step(model, optimizer, images, labels)`` (NCHW images
    in; it puts them in the model's format; a whole-step contender's step is a new ``torch.compile`` of the
    tuned step, compiled at its first call). The race and :func:`check_torch_way` both use these."""
    import torch

    from fastjax.resnet import torch_twin as T

    if name not in TORCH_WAYS:
        raise ValueError(f"unknown PyTorch contender {name!r}; choose from {tuple(TORCH_WAYS)}")
    channels_last, adam, mode = TORCH_WAYS[name]
    step, prepare = T.torch_train_step, (lambda model: model)
    if channels_last:
        last = torch.channels_last

        def step(model: Any, optimizer: Any, images: Any, labels: Any) -> Any:
            return T.torch_train_step(model, optimizer, images.contiguous(memory_format=last), labels)

        prepare = lambda model: model.to(memory_format=last)  # noqa: E731
    if mode is not None:
        step = compiled(step, mode)
    return prepare, (lambda p: torch.optim.Adam(p, lr=R.LEARNING_RATE, **adam)), step


def check_torch_way(name: str, config: ResNetConfig, batch: int, ref64: Any = None, seed: int = 0) -> dict[str, Any]:
    """Raise ``twin_check.NotTheSameTraining`` unless the PyTorch contender ``name``, run in float64 its own
    way (:func:`torch_way`) for ``twin_check.CHECK_STEPS`` steps, trains as Part II's floor does in float64
    (``ref64``: ``twin_check.jax_float64_run``, made here when None) within what rounding allows; return
    ``check_same_training``'s gaps."""
    from fastjax.resnet import torch_twin as T, twin_check as C

    xs, ys = training_batches(C.CHECK_STEPS, batch)
    ref64 = ref64 if ref64 is not None else C.jax_float64_run(config, xs, ys, seed)
    prepare, make_optimizer, step = torch_way(name)
    model = prepare(T.from_weights(resnet_nnx.weights(resnet_nnx.make_model(config, seed)), config))
    run = C.torch_float64_run(model, xs, ys, make_optimizer=make_optimizer, step=step)
    return C.check_same_training(run, ref64, config, batch, what=name)


def check_faster_floor(config: ResNetConfig, batch: int, ref64: Any = None, seed: int = 0) -> float:
    """Raise an AssertionError (``ladder.assert_same_weights``) unless Part V's floor, trained in float64 for
    ``twin_check.CHECK_STEPS`` steps from the weights of ``make_model(config, seed)``, ends with the weights
    (running statistics included) of Part II's floor in float64 (``ref64``: ``twin_check.jax_float64_run``,
    made here when None); return the largest parameter difference."""
    from fastjax.resnet import ladder, twin_check as C

    xs, ys = training_batches(C.CHECK_STEPS, batch)
    ref64 = ref64 if ref64 is not None else C.jax_float64_run(config, xs, ys, seed)
    with jax.enable_x64(True):
        model = resnet_nnx.make_model(config, seed)
        graphdef, treedef, leaves = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
        step = jax.jit(FL.faster_floor_step(graphdef, treedef))
        leaves = ladder.to_float64(leaves)
        for x, y in zip(xs, ys):
            leaves, _ = step(leaves, jnp.asarray(x, jnp.float64), jnp.asarray(y))
        ours = resnet_nnx.weights(nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))[0])
    return ladder.assert_same_weights(ours, ref64.weights, FASTER_FLOOR)


def _torch_contender(config: ResNetConfig, seed: int, mode: str | None, name: str = TORCH_EAGER) -> Contender:
    """A PyTorch contender: ``name`` (of ``TORCH_WAYS``) as :func:`torch_way` writes it when ``mode`` is None, else
    ``torch.compile(model, mode=...)`` of the twin as first written (the model compiled, Adam eager)."""
    import torch

    from fastjax.resnet import torch_twin as T

    w = resnet_nnx.weights(resnet_nnx.make_model(config, seed))
    prepare, make_optimizer, step = torch_way(name)
    model = prepare(T.from_weights(w, config))
    net = model if mode is None else compiled(model, mode)
    box: dict[str, Any] = {}

    def reset() -> None:  # the same Parameter objects get the first weights back: no new compilation
        model.load_state_dict(T.from_weights(w, config).state_dict())
        box["opt"] = make_optimizer(model.parameters())

    return Contender(name if mode is None else torch_name(mode), reset,
                     lambda x, y: step(net, box["opt"], x, y), T.to_torch,
                     lambda i, l: T.torch_accuracy(model, i, l), extra={"model": net, "optimizer": lambda: box["opt"]},
                     threads=timing.torch_threads())


def contenders(names: tuple[str, ...], config: ResNetConfig, seed: int = 0,
               torch_modes: tuple[str, ...] = ()) -> dict[str, Contender]:
    """The contenders ``names`` (of ``RACE_JAX`` and ``TORCH_WAYS``), and one ``torch.compile``
    contender per mode in ``torch_modes``, all from the weights of ``resnet_nnx.make_model(config, seed)``."""
    out = {}
    for name in names:
        out[name] = (_torch_contender(config, seed, None, name) if name in TORCH_WAYS
                     else _jax_contender(name, config, seed))
    for mode in torch_modes:
        c = _torch_contender(config, seed, mode)
        out[c.name] = c
    for c in out.values():
        c.reset()
    return out


def first_calls(race: dict[str, Contender], x: Any, y: Any) -> dict[str, float]:
    """Seconds of each contender's first step ever (compilation happens there): a contender that has not
    run yet steps once on the batch ``(x, y)`` (NumPy), then ``reset()``. One whose first step raises
    (``torch.compile`` without a C++ compiler) gets its ``error`` set and is left out of what follows."""
    for c in race.values():
        if c.first_call is None and c.error is None:
            try:
                c.run(*c.batch(x, y))
            except Exception as err:  # noqa: BLE001 - any failure of a compiler is reported, and the race goes on
                text = str(err).strip()
                c.error = f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]
                continue
            c.reset()
    return {n: c.first_call for n, c in race.items() if c.error is None}


def threads() -> dict[str, Any]:
    """The threads each side computes with: ``torch.get_num_threads()`` (None without torch), the threads
    of XLA's CPU pool (``tf_XLAEigen``, counted in /proc on Linux, else None), and the CPUs this process may use."""
    try:
        import torch

        n_torch = torch.get_num_threads()
    except ImportError:
        n_torch = None
    task = Path("/proc/self/task")
    n_xla = None
    if task.is_dir():
        names = []
        for t in task.iterdir():
            try:
                names.append((t / "comm").read_text().strip())
            except OSError:  # a thread that ended meanwhile
                pass
        n_xla = sum(n == "tf_XLAEigen" for n in names)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"torch": n_torch, "xla": n_xla, "cpus": cpus}


def _spread(values: list[float]) -> dict[str, float]:
    """Median and quartiles of per-round values."""
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3)}


def race_step(race: dict[str, Contender], batch: int, repeats: int) -> dict[str, Any]:
    """Seconds per train step of each contender of ``race`` on one batch of ``batch`` training images, in
    turns (``time_interleaved``), first calls (compilation) timed apart, before. Each PyTorch contender runs
    at 1 thread and at one per core, in turns, and keeps its faster setting (``Timing.extra["threads"]``);
    XLA's pool is what JAX started with. Returns ``{"timings": {name: Timing}, "first_call": {name: s},
    "compile": {name: first call - median step}, "failed": {name: error}, "threads": threads()}``."""
    xs, ys = training_batches(1, batch)
    first = first_calls(race, xs[0], ys[0])
    fns = {}
    for name, c in race.items():
        if c.error is None:
            bx, by = c.batch(xs[0], ys[0])
            fns[name] = (lambda c=c, bx=bx, by=by: c.run(bx, by))
    t = time_interleaved(fns, repeats, threads={name: race[name].threads for name in fns})
    for c in race.values():
        if c.error is None:
            c.reset()
    return {"timings": t, "first_call": first, "compile": {n: max(first[n] - t[n].median, 0.0) for n in t},
            "failed": {n: c.error for n, c in race.items() if c.error}, "threads": threads()}


def waited_each_step(race: dict[str, Contender], names: tuple[str, ...], batch: int, repeats: int) -> dict[str, Any]:
    """The JAX contenders ``names`` timed twice in turns, on the batch of :func:`race_step`: as the race times
    every contender (a batch of calls, then one wait: JAX's asynchronous dispatch lets Python queue the next
    step while XLA computes the last), and waiting for each step before the next call (``sync="each"``), as
    PyTorch eager on a CPU does by itself (each operation returns when it is done). ``{name: {"async": Timing,
    "each": Timing}}``."""
    xs, ys = training_batches(1, batch)
    fns = {}
    for name in names:
        c, (bx, by) = race[name], race[name].batch(xs[0], ys[0])
        fns[f"{name} (async)"] = lambda c=c, bx=bx, by=by: c.run(bx, by)
        fns[f"{name} (each)"] = lambda c=c, bx=bx, by=by: block(c.run(bx, by))  # waits inside each call
    t = time_interleaved(fns, repeats)
    for name in names:
        race[name].reset()
    return {name: {"async": t[f"{name} (async)"], "each": t[f"{name} (each)"]} for name in names}


def race_run(race: dict[str, Contender], batch: int, steps: int, every: int, target: float, rounds: int,
             compile_seconds: dict[str, float], thread_counts: dict[str, int] | None = None) -> dict[str, Any]:
    """Each contender trains ``steps`` steps from the first weights on the same batches, in turns, for
    ``rounds`` rounds (``reset()`` before each): seconds of the whole run, and to the first check at which
    the held-out accuracy reaches ``target``. The accuracy is checked every ``every`` steps in the first
    round, the clock stopped meanwhile; later rounds only read the clock there (after waiting for the
    step). ``compile_seconds`` (from :func:`race_step`) is added for the figures "compile included".
    Ratios are per round: PyTorch eager's seconds over the contender's, in the same round. ``thread_counts``:
    the threads each contender with a knob runs with (as :func:`race_step` chose them); each run's ``load``
    (the CPU cores other processes kept busy meanwhile) is the witness of ``x_eager_*``."""
    if steps % every:
        raise ValueError(f"steps ({steps}) must be a multiple of every ({every})")
    sp = digits.split()
    xs, ys = training_batches(steps, batch)
    live = {n: c for n, c in race.items() if c.error is None}
    data = {n: [c.batch(x, y) for x, y in zip(xs, ys)] for n, c in live.items()}
    checks = list(range(every, steps + 1, every))
    clock = {n: [] for n in live}  # per round: seconds at each check
    acc = {n: [] for n in live}
    losses = {}
    witness = timing.Witness()
    counts = {n: (thread_counts or {}).get(n) for n in live}
    before = {n: c.threads.get() for n, c in live.items() if c.threads.set is not None and counts[n]}
    for r in range(rounds):
        for n, c in live.items():
            c.reset()
            if n in before:
                c.threads.set(counts[n])
            at, out, elapsed = [], [], 0.0
            with witness.measure(n):
                t0 = time.perf_counter()
                for i, (bx, by) in enumerate(data[n]):
                    out.append(c.run(bx, by))
                    if (i + 1) % every == 0:
                        block(out[-1])
                        elapsed += time.perf_counter() - t0
                        at.append(elapsed)
                        if r == 0:
                            acc[n].append(c.accuracy(sp.test_images, sp.test_labels))
                        t0 = time.perf_counter()
            clock[n].append(at)
            if r == 0:
                losses[n] = [float(v) for v in out]
    reach = {n: next((k for k, a in zip(checks, acc[n]) if a >= target), None) for n in live}
    out: dict[str, Any] = {"steps": steps, "every": every, "target": target, "rounds": rounds, "checks": checks,
                           "accuracy": acc, "steps_to_target": reach, "losses": losses, "contenders": {}}
    for n, count in before.items():
        live[n].threads.set(count)
    for n in live:
        run_s = [a[-1] for a in clock[n]]
        to_target = [a[checks.index(reach[n])] for a in clock[n]] if reach[n] else None
        comp = compile_seconds.get(n, 0.0)
        out["contenders"][n] = {
            "run_seconds": run_s, "run": _spread(run_s), "compile_seconds": comp,
            "run_compile_included": _spread([s + comp for s in run_s]),
            "to_target_seconds": to_target, "to_target": _spread(to_target) if to_target else None,
            "to_target_compile_included": _spread([s + comp for s in to_target]) if to_target else None,
            "load": witness.load(n), "threads": live[n].threads.label(counts[n])}
    if TORCH_EAGER in live:
        eager = out["contenders"][TORCH_EAGER]
        e_comp = eager["compile_seconds"]
        for n, row in out["contenders"].items():
            comp = row["compile_seconds"]
            why = timing.unsound(  # the witness of every ratio of this row ("" when sound)
                Timing(TORCH_EAGER, [a + e_comp for a in eager["run_seconds"]], load=eager["load"]),
                Timing(n, [b + comp for b in row["run_seconds"]], load=row["load"]))
            row["x_eager_run"] = {**_spread([a / b for a, b in zip(eager["run_seconds"], row["run_seconds"])]), "why": why}
            row["x_eager_run_compile_included"] = {**_spread(
                [(a + e_comp) / (b + comp) for a, b in zip(eager["run_seconds"], row["run_seconds"])]), "why": why}
            if row["to_target_seconds"] and eager["to_target_seconds"]:
                row["x_eager_to_target_compile_included"] = {**_spread(
                    [(a + e_comp) / (b + comp) for a, b in zip(eager["to_target_seconds"], row["to_target_seconds"])]),
                    "why": why}
    return out


def race_sweep(widths: tuple[int, ...], names: tuple[str, ...], repeats: int, seed: int = 0) -> dict[str, Any]:
    """Seconds per train step of the contenders ``names`` at each stem width (stages, blocks and batch of the
    size in force), timed in turns within each width; and each one's ratio to PyTorch eager's step."""
    s = settings()
    seconds: dict[str, list[Timing]] = {n: [] for n in names}
    for w in widths:
        config = ResNetConfig(width=w, stages=s.config.stages, blocks=s.config.blocks)
        step = race_step(contenders(names, config, seed), s.batch, repeats)
        for n in names:
            seconds[n].append(step["timings"][n])
    x_eager = ({n: [e.median / t.median for e, t in zip(seconds[TORCH_EAGER], ts)] for n, ts in seconds.items()}
               if TORCH_EAGER in names else {})
    ratios = ({n: [timing.ratio(e, t) for e, t in zip(seconds[TORCH_EAGER], ts)] for n, ts in seconds.items()}
              if TORCH_EAGER in names else {})
    return {"widths": list(widths), "batch": s.batch, "seconds": seconds, "x_eager": x_eager, "ratios": ratios}


def run_ratio(run: dict[str, Any], name: str, key: str = "x_eager_run_compile_included") -> Ratio:
    """PyTorch eager's training run over ``name``'s (``key`` of :func:`race_run`'s rows: the median of the
    per-round ratios), "not measured" where its witness saw the machine busy."""
    row = run["contenders"][name][key]
    why = row.get("why", "")
    return Ratio(TORCH_EAGER, name, None if why else row["median"], why,
                 {n: run["contenders"][n].get("threads") for n in (TORCH_EAGER, name)})


def train_losses(c: Contender, images: Any, labels: Any) -> np.ndarray:
    """The losses of ``c`` trained from its first weights on the batches ``images`` ``(n, batch, 8, 8, 1)``
    and ``labels`` ``(n, batch)`` (NumPy), one step each; ``c`` is reset before and after."""
    if c.error is not None:
        raise ValueError(f"{c.name} cannot run: {c.error}")
    c.reset()
    out = [c.run(*c.batch(x, y)) for x, y in zip(images, labels)]
    losses = np.array([float(v) for v in out])
    c.reset()
    return losses


# What a profile's time is spent on, per side. PyTorch: the top-level events of torch.profiler (each op
# with everything it called; the backward pass's events are the autograd engine's, one per op it
# differentiates), grouped by what they compute; the rest of the step is Python between the ops.
TORCH_KINDS = (("convolutions, forward", ("aten::conv2d",)),
               ("convolutions, backward", ("ConvolutionBackward",)),
               ("BatchNorm, forward and backward", ("aten::batch_norm", "NativeBatchNormBackward")),
               ("Adam (and zero_grad)", ("Optimizer.step", "Optimizer.zero_grad")))


def profile_torch(c: Contender, x: Any, y: Any, steps: int = 5) -> dict[str, float]:
    """Milliseconds per step of a PyTorch contender by kind of work, from ``torch.profiler`` over ``steps``
    steps on the batch ``(x, y)`` (NumPy): ``TORCH_KINDS``, "other ops" (ReLU, sums, pooling, the head, the
    loss, the rest of autograd), "Python between the ops" (the step's time under the profiler minus its
    events), and "step, profiled" (all of it). ``c`` is reset after."""
    # Kineto, the profiler's engine, writes its start and stop to stderr ("USDT: ... profiler_start") at its
    # default log level: 6 silences it, when set before the first profile in the process (checked, torch 2.13)
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch.profiler import ProfilerActivity, profile

    bx, by = c.batch(x, y)
    c.run(bx, by)  # not the first call: that one compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            c.run(bx, by)
        wall = time.perf_counter() - t0
    c.reset()
    out = {kind: 0.0 for kind, _ in TORCH_KINDS}
    out["other ops"] = 0.0
    inside = 0.0
    for e in prof.events():
        if e.cpu_parent is not None:
            continue
        ms = e.cpu_time_total / 1e3 / steps
        inside += ms
        kind = next((k for k, keys in TORCH_KINDS if any(key in e.name for key in keys)), "other ops")
        out[kind] += ms
    out["Python between the ops"] = max(wall * 1e3 / steps - inside, 0.0)
    out["step, profiled"] = wall * 1e3 / steps
    return out


_ONEDNN_TENSOR = re.compile(r"(diff_src|diff_dst|diff_wei|src|dst|wei)[_:]f32:[^:\s]*:blocked:([A-Za-z0-9]+)")
_CHANNEL_BLOCK = re.compile(r"^aB[a-z]*(\d+)b$")  # NCHW with C cut into blocks of n: aBcd8b (AVX2), aBcd16b (AVX-512)


def parse_onednn_log(text: str) -> dict[str, Any]:
    """What oneDNN's verbose log (``ONEDNN_VERBOSE=1``, or ``torch.backends.mkldnn.verbose``) says it ran:
    the convolutions' ``implementations`` (such as ``jit:avx512_core``), their activations' ``layouts``
    (such as ``aBcd16b``: channels in blocks of 16), the ``channel_blocks`` (those blocks' sizes, largest
    first; empty where no activation was blocked), and the counts of ``convolutions``, of ``activation
    reorders`` and of ``weight reorders`` (into a blocked layout or back). Reads the formats of oneDNN 2 and 3."""
    impls, layouts = set(), set()
    out: dict[str, Any] = {"convolutions": 0, "activation reorders": 0, "weight reorders": 0}
    for line in text.splitlines():
        fields = line.split(",")
        if not fields[0].endswith("_verbose") or "exec" not in fields or len(fields) < fields.index("exec") + 6:
            continue
        i = fields.index("exec")
        kind, impl, tensors = fields[i + 2], fields[i + 3], dict(_ONEDNN_TENSOR.findall(fields[i + 5]))
        if kind == "convolution":
            out["convolutions"] += 1
            impls.add(impl)
            layouts.update(tag for name, tag in tensors.items() if not name.endswith("wei"))
        elif kind == "reorder":
            blocked = [t for t in tensors.values() if t != t.lower()]  # oneDNN writes a blocked dimension in capitals
            if any(_CHANNEL_BLOCK.match(t) for t in blocked):
                out["activation reorders"] += 1
            elif any(t[0].isupper() for t in blocked):
                out["weight reorders"] += 1
    blocks = sorted({int(m.group(1)) for t in layouts if (m := _CHANNEL_BLOCK.match(t))}, reverse=True)
    return {**out, "implementations": sorted(impls), "layouts": sorted(layouts), "channel_blocks": blocks}


def onednn_convolutions(c: Contender, x: Any, y: Any) -> dict[str, Any]:
    """:func:`parse_onednn_log` of one train step of a PyTorch contender on the batch ``(x, y)`` (NumPy), not
    its first, with ``isa``: the instruction set PyTorch's CPU kernels use here
    (``torch.backends.cpu.get_cpu_capability()``). oneDNN prints its log to the process's standard output,
    which is redirected to a file for the step. ``c`` is reset after."""
    import ctypes
    import sys
    import tempfile

    import torch

    bx, by = c.batch(x, y)
    c.run(bx, by)
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                c.run(bx, by)
        finally:
            ctypes.CDLL(None).fflush(None)  # oneDNN writes with C's stdio: empty its buffer into the file
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    c.reset()
    return {"isa": torch.backends.cpu.get_cpu_capability(), **parse_onednn_log(text)}


def profile_jax(c: Contender, x: Any, y: Any, steps: int = 5) -> dict[str, float]:
    """Milliseconds per step of a JAX contender's operations by kind, from a ``jax.profiler`` trace of
    ``steps`` steps on the batch ``(x, y)`` (NumPy), read with ``fastjax.tools.profiling``: convolutions
    and matrix products, forward and backward (the metadata of each op names the JAX operation it came
    from: ``transpose(jvp(...))`` is the backward pass), "Adam and running statistics" (fusions outside
    the gradient), "other fusions" (BatchNorm, ReLU, sums, layout copies and the patches'), "ops, summed" (XLA runs
    some at once on its threads, so this can exceed the step), and "step, traced" (wall time per step).
    Only contenders with a jitted step on a flat state (the floors) can be profiled this way."""
    import tempfile

    if "jitted" not in c.extra:
        raise ValueError(f"{c.name}: profile_jax needs a floor-type contender (a jitted step on a flat list)")
    bx, by = c.batch(x, y)
    c.run(bx, by)
    leaves = c.extra["leaves"]()
    hlo = c.extra["jitted"].lower(leaves, bx, by).compile().as_text()  # the compiled program (cached)
    block(c.extra["jitted"](leaves, bx, by))
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        t0 = time.perf_counter()
        for _ in range(steps):
            out = c.extra["jitted"](leaves, bx, by)
        block(out)
        wall = time.perf_counter() - t0
    c.reset()
    op_names = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*?op_name=\"([^\"]*)\"", line)
        if m:
            op_names[m.group(1)] = m.group(2)
    out_ms: dict[str, float] = {}
    for r in profiling.top_ops(profiling.read_trace(profiling.find_trace(folder)), hlo):
        where = op_names.get(r["op name"], "")
        backward = "transpose(jvp" in where
        gradient = backward or "jvp(" in where
        kind = profiling.op_kind(r)
        if r["op"] == "convolution":
            key = f"convolutions, {'backward' if backward else 'forward'}"
        elif kind == "matrix products":
            key = f"matrix products, {'backward' if backward else 'forward'}"
        elif where and not gradient:  # an op named outside the gradient: the optimizer's update, or BatchNorm's averages
            key = "Adam and running statistics"
        else:
            key = "other fusions"
        out_ms[key] = out_ms.get(key, 0.0) + r["total ms"] / steps
    out_ms["ops, summed"] = sum(out_ms.values())
    out_ms["step, traced"] = wall * 1e3 / steps
    return out_ms


def _first_call_here(name: str, width: int, stages: int, blocks: int, batch: int, cache_dir: str) -> dict[str, float]:
    """In this (fresh) process: the first step of the JAX contender ``name``, with JAX's persistent
    compilation cache in ``cache_dir`` (every program kept, however small or quick to compile). Seconds."""
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default 1 s
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    c = contenders((name,), ResNetConfig(width=width, stages=stages, blocks=blocks))[name]
    xs, ys = training_batches(1, batch)
    cpu = time.process_time()
    first_calls({name: c}, xs[0], ys[0])
    return {"first_call_seconds": c.first_call, "first_call_cpu_seconds": time.process_time() - cpu}


def cached_first_call(name: str, config: ResNetConfig | None = None, batch: int | None = None) -> dict[str, float]:
    """The first step of the JAX contender ``name`` in a fresh process, twice, with one persistent
    compilation cache (a new temporary folder): the first process compiles and fills it, the second
    reads the compiled program from it (tracing and lowering still run). Seconds of wall time, and of CPU
    time of all the process's threads (``*_cpu_seconds``); the processes' start-up (imports) is not counted."""
    import subprocess
    import sys
    import tempfile

    s = settings()
    config, batch = config or s.config, batch or s.batch
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        cmd = [sys.executable, "-m", "fastjax.resnet.race", "--first-call", name, "--cache-dir", folder,
               "--config", str(config.width), str(config.stages), str(config.blocks), "--batch", str(batch)]
        for key in ("cold_cache_seconds", "warm_cache_seconds"):
            done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), timeout=900)
            if done.returncode:
                raise RuntimeError(f"the fresh process for {name!r} failed:\n{done.stderr[-2000:]}")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            out[key], out[key.replace("seconds", "cpu_seconds")] = got["first_call_seconds"], got["first_call_cpu_seconds"]
    return out


def race(config: ResNetConfig | None = None) -> dict[str, Any]:
    """The whole race at the size in force, for ``python -m fastjax.bench``: per step, over a training run
    and over widths (PyTorch eager, ``torch.compile`` per mode, the JAX steps), with the threads used and
    the fastest JAX step's first call in a fresh process with a persistent compilation cache. Raises
    ImportError (torch's own) where torch is not installed."""
    import torch  # noqa: F401  (the race needs it: fail here, before anything is timed)

    s, r = settings(), race_settings()
    config = config or s.config
    race_ = contenders((*r.torch_ways, *RACE_JAX), config, torch_modes=r.torch_modes)
    checked = {name: check_torch_way(name, config, s.batch) for name in r.torch_ways}
    step = race_step(race_, s.batch, r.repeats)
    run = race_run(race_, s.batch, r.run_steps, r.every, r.target, r.rounds, step["compile"],
                   {n: t.extra.get("thread_count") for n, t in step["timings"].items()})
    best = min((n for n in RACE_JAX if n in step["timings"]), key=lambda n: step["timings"][n].median)
    cached = cached_first_call(best, config, s.batch)
    sweep = race_sweep(r.widths, r.sweep_names, r.sweep_repeats)
    alone = kernels_alone(config, s.batch, r.repeats)
    return {"config": vars(config).copy(), "batch": s.batch, "checked_float64": checked, "step": step, "run": run, "best_jax": best,
            "cached_first_call": cached, "sweep": sweep, "kernels_alone": alone}


def fastest_torch(timings: dict[str, Timing]) -> str:
    """The PyTorch contender (eager as first written, tuned, or compiled) with the shortest median step."""
    return min((n for n in timings if n not in RACE_JAX), key=lambda n: timings[n].median)


def race_ratios(result: dict[str, Any]) -> dict[str, Ratio]:
    """The ratios of the race, from a :func:`race` result (medians; > 1: the JAX step is faster), each a
    ``timing.Ratio`` that is "not measured" where its witness saw a busy machine: the fastest JAX step against
    the fastest PyTorch contender, PyTorch eager and the fastest ``torch.compile`` per step; against eager over
    the training run with compilation included, compiling and with the persistent cache; ``nnx.jit``
    against eager per step; the fastest PyTorch contender against the patches products alone
    (:func:`kernels_alone`, where the result has them); and the fastest JAX step against eager at each
    width of the sweep."""
    t, best = result["step"]["timings"], result["best_jax"]
    compiled = [n for n in t if n.startswith("torch.compile")]
    runs = result["run"]["contenders"]
    warm = max(result["cached_first_call"]["warm_cache_seconds"] - t[best].median, 0.0)
    e = runs[TORCH_EAGER]
    best_torch = fastest_torch(t)
    out = {f"{best} / {best_torch} (the fastest PyTorch contender), per step": timing.ratio(t[best_torch], t[best]),
           f"{best} / PyTorch eager, per step": timing.ratio(t[TORCH_EAGER], t[best])}
    if compiled:
        fastest_compiled = min(compiled, key=lambda n: t[n].median)
        out[f"{best} / {fastest_compiled}, per step"] = timing.ratio(t[fastest_compiled], t[best])
    out[f"{best} / PyTorch eager, {result['run']['steps']}-step run, compile included"] = run_ratio(result["run"], best)
    cached = run_ratio(result["run"], best)
    cached.value = float(np.median([(a + e["compile_seconds"]) / (b + warm)
                                    for a, b in zip(e["run_seconds"], runs[best]["run_seconds"])])) if cached.measured else None
    out[f"{best} / PyTorch eager, {result['run']['steps']}-step run, compile from the persistent cache"] = cached
    out["nnx.jit / PyTorch eager, per step"] = timing.ratio(t[TORCH_EAGER], t["nnx.jit"])
    if "kernels_alone" in result:  # the most a step built on the patches products could gain on the fastest PyTorch
        out[f"{best_torch} / the patches products alone (the ceiling of a step built on them)"] = timing.ratio(
            t[best_torch], result["kernels_alone"]["timings"][KERNELS_ALONE_XLA])
    sweep = result["sweep"]
    for name, rs in sweep.get("ratios", {}).items():
        if name != TORCH_EAGER:
            for w, x in zip(sweep["widths"], rs):
                out[f"{name} / PyTorch eager, per step, width {w}"] = x
    return out


# The tables of chapters/resnet/08-pytorch.md, built from the race's results.

def float32_drift(race_: dict[str, Contender], images: Any, labels: Any,
                  at: tuple[int, ...] = (1, 2, 3, 5, 10, 20)) -> list[dict[str, Any]]:
    """How far PyTorch eager's, PyTorch tuned's and the faster floor's float32 losses drift from Part II's
    floor's when all train from the same weights on ``images``/``labels`` (one step per batch): one row per
    step of ``at`` (1-based, at most ``len(images)``), the relative difference of each. A measurement."""
    floor_losses = train_losses(race_["floor"], images, labels)
    drift = {n: train_losses(race_[n], images, labels) for n in (TORCH_EAGER, TORCH_TUNED, FASTER_FLOOR)}
    return [{"step": k, **{n: abs(v[k - 1] / floor_losses[k - 1] - 1) for n, v in drift.items()}} for k in at]


def step_rows(step: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-step race (:func:`race_step`) as table rows, each contender against PyTorch eager."""
    t = step["timings"]
    return [{"contender": n, "threads": v.extra["threads"], "ms per step": v.median * 1e3, "q1": v.q1 * 1e3,
             "q3": v.q3 * 1e3, "× PyTorch eager": timing.ratio(t[TORCH_EAGER], v).text("{:.2f}"),
             "first call (s)": step["first_call"][n]} for n, v in t.items()]


def run_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The training-run race (:func:`race_run`) as table rows, each contender against PyTorch eager."""
    def x(n: str, key: str) -> str:
        return run_ratio(run, n, key).text("{:.2f}") if key in run["contenders"][n] else ""
    return [{"contender": n, "threads": r["threads"], "steps to target": run["steps_to_target"][n],
             "s to target": r["to_target"]["median"] if r["to_target"] else float("nan"),
             "compile (s)": r["compile_seconds"], f"s for {run['steps']} steps": r["run"]["median"],
             "× eager, run": x(n, "x_eager_run"), "× eager, run, compile incl.": x(n, "x_eager_run_compile_included"),
             "× eager, to target, compile incl.": x(n, "x_eager_to_target_compile_included")}
            for n, r in run["contenders"].items()]


def cached_run_ratio(run: dict[str, Any], timings: dict[str, Timing], fastest: str,
                     cached: dict[str, float]) -> Ratio:
    """PyTorch eager's training run (its compilation included) over ``fastest``'s with its compiled program
    read from the persistent cache (``cached``: :func:`cached_first_call`), the median over rounds; "not
    measured" where the run race's witness saw the machine busy."""
    warm = max(cached["warm_cache_seconds"] - timings[fastest].median, 0.0)
    fast, eager = run["contenders"][fastest], run["contenders"][TORCH_EAGER]
    out = run_ratio(run, fastest)
    out.value = float(np.median([(e + eager["compile_seconds"]) / (b + warm) for e, b in
                                 zip(eager["run_seconds"], fast["run_seconds"])])) if out.measured else None
    return out


def answer(timings: dict[str, Timing], run: dict[str, Any], fastest_floor: str,
           run_cached: Ratio) -> tuple[list[dict[str, Any]], str, str]:
    """The page's answer: table rows of its ratios (the fastest JAX step against the fastest PyTorch
    contender, PyTorch eager and the fastest ``torch.compile`` per step, against eager over the training
    run with compilation, ``fastest_floor`` from the persistent cache (``run_cached``), ``nnx.jit``
    against eager), and two sentences: the per-step answer and the rest, or, where any ratio is not
    measured, the sentence that says why and a pointer to the tables."""
    t = timings
    best = min((n for n in RACE_JAX if n in t), key=lambda n: t[n].median)
    compiled = [n for n in t if n.startswith("torch.compile")]
    best_compile = min(compiled, key=lambda n: t[n].median) if compiled else None
    best_torch = fastest_torch(t)
    x_best_torch, x_best = timing.ratio(t[best_torch], t[best]), timing.ratio(t[TORCH_EAGER], t[best])
    x_compile = timing.ratio(t[best_compile], t[best]) if compiled else None
    x_run, x_nnx = run_ratio(run, best), timing.ratio(t[TORCH_EAGER], t["nnx.jit"])
    x_tuned = timing.ratio(t[TORCH_EAGER], t[TORCH_TUNED])
    rows = [(f"fastest JAX step ({best}) / the fastest PyTorch contender ({best_torch}), per step", x_best_torch),
            ("fastest JAX step / PyTorch eager, per step", x_best),
            *([(f"fastest JAX step / {best_compile}, per step", x_compile)] if compiled else []),
            (f"fastest JAX step / PyTorch eager, {run['steps']}-step run, compile included", x_run),
            (f"{fastest_floor} / PyTorch eager, {run['steps']}-step run, compiled program from the persistent cache",
             run_cached),
            ("nnx.jit / PyTorch eager, per step", x_nnx)]
    rows = [{"ratio": name, "measured": r.text("{:.2f}"), "threads": ", ".join(f"{k}: {v}" for k, v in r.threads.items() if v)}
            for name, r in rows]
    published = [x_best_torch, x_best, x_tuned, x_run, run_cached, x_nnx, *([x_compile] if compiled else [])]
    if not all(r.measured for r in published):  # one sentence that says why not
        return rows, next(r for r in published if not r.measured).says(
            "", otherwise="The race of the JAX steps against PyTorch"), "The tables on this page give the medians each side measured."
    said_compile = x_compile.text("{:.2f}× torch.compile's") if compiled else "torch.compile races at the full size only"
    per_step = (f"Against the fastest PyTorch contender, {best_torch}, the fastest JAX step ({best}) runs at "
                f"{x_best_torch.value:.2f}× its speed per step.")
    rest = (f"PyTorch tuned alone runs at {x_tuned.value:.2f}× PyTorch eager's speed. Against the twin as first "
            f"written the fastest JAX step runs at {x_best.value:.2f}× PyTorch eager's speed per step "
            f"({said_compile}), and at {x_run.value:.2f}× eager's over the training run with its "
            f"compilation counted ({run_cached.value:.2f}× with the compiled program read from the persistent "
            f"cache); nnx.jit runs at {x_nnx.value:.2f}× eager's speed per step.")
    return rows, per_step, rest


def sweep_said(sweep: dict[str, Any]) -> str:
    """Of a :func:`race_sweep`: Part II's floor against PyTorch eager at the sweep's two ends, in one sentence,
    or the sentence that says which end was not measured."""
    ends = [(sweep["ratios"]["floor"][i], sweep["widths"][i]) for i in (0, -1)]
    busy = [r.says("", otherwise=f"The race at width {w}") for r, w in ends if not r.measured]
    if busy:
        return busy[0]
    return ("The floor runs at {:.2f}× PyTorch eager's speed at width {} and {:.2f}× at width {}."
            .format(ends[0][0].value, ends[0][1], ends[1][0].value, ends[1][1]))


def profile_rows(prof_torch: dict[str, float], prof_jax: dict[str, dict[str, float]],
                 timings: dict[str, Timing]) -> list[dict[str, Any]]:
    """One row per kind of work (ms per step) of :func:`profile_torch`'s and :func:`profile_jax`'s
    profiles side by side, and a last row with each side's step timed without a profiler (``timings``)."""
    kinds = list(dict.fromkeys([*prof_torch, *[k for p in prof_jax.values() for k in p]]))
    rows = [{"ms per step": k, TORCH_EAGER: prof_torch.get(k, float("nan")),
             **{n: p.get(k, float("nan")) for n, p in prof_jax.items()}} for k in kinds]
    rows.append({"ms per step": "step, timed without a profiler (race above)", TORCH_EAGER: timings[TORCH_EAGER].median * 1e3,
                 **{n: timings[n].median * 1e3 for n in prof_jax}})
    return rows


def main(argv: list[str] | None = None) -> None:
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="The ResNet's race against PyTorch (and its fresh-process first calls).")
    parser.add_argument("--first-call", metavar="NAME", help="time this JAX contender's first step in this process")
    parser.add_argument("--cache-dir", help="(with --first-call) JAX's persistent compilation cache")
    parser.add_argument("--config", type=int, nargs=3, metavar=("WIDTH", "STAGES", "BLOCKS"))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--out", type=Path, help="write the race (at the size of FASTJAX_SIZE) to this JSON file")
    parser.add_argument("--threads", type=int, help="threads for each side: torch.set_num_threads and XLA's CPU "
                        "pool (PJRT_NPROC, read when JAX's backend starts); default: each side's own choice")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1; got {args.threads}")
        from fastjax.setup.workaround import backend_started

        if backend_started():
            parser.error("--threads must be set before JAX's backend starts; run it as a fresh process")
        os.environ["PJRT_NPROC"] = str(args.threads)
        os.environ["FASTJAX_THREADS"] = str(args.threads)  # the races try this count only (timing.thread_settings)
        import torch

        torch.set_num_threads(args.threads)
    if args.first_call:
        if not (args.cache_dir and args.config and args.batch):
            sys.exit("--first-call needs --cache-dir, --config and --batch")
        print(json.dumps({**_first_call_here(args.first_call, *args.config, args.batch, args.cache_dir),
                          "threads": threads()}))
        return
    from fastjax.tools import timing

    result = race()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(timing.to_plain({"stamp": timing.stamp(), "result": result}), indent=2, default=float))
        print(f"wrote {args.out}")
    t = result["step"]["timings"]
    print(timing.format_table([{"per train step": n, "threads": v.extra.get("threads", ""), "ms": v.median * 1e3,
                                "q1": v.q1 * 1e3, "q3": v.q3 * 1e3, "first call (s)": result["step"]["first_call"][n],
                                "× PyTorch eager": timing.ratio(t[TORCH_EAGER], v).text()} for n, v in t.items()]))
    print(f"threads: {result['step']['threads']}; failed: {result['step']['failed']}")
    for name, x in race_ratios(result).items():
        print(f"{x.text('{:6.2f}')}  {name}")
    print(timing.stamp_text())



def conv_kernels(config: ResNetConfig | None = None, batch: int | None = None, repeats: int = 7,
                 seed: int = 0) -> dict[str, Timing]:
    """Seconds of one 3×3 convolution (stride 1, ``c`` to ``c`` channels, as in each stage of ``config``:
    images of 8, 4, 2 pixels a side, ``width·2ˢ`` channels) on ``batch`` images, forward and backward (the
    gradients of input and kernel, given the output's), on each side, timed in turns: XLA's convolution
    (``lax.conv_general_dilated``, NHWC, what Part II's floor runs), Part V's patches product
    (``floor.conv_as_matmul``), and PyTorch's ``F.conv2d`` (oneDNN; its backward alone, the graph kept), in
    NCHW as first written and in ``channels_last`` as PyTorch tuned runs it.
    Keys: ``"<side> <direction>, stage s (h×h, c channels)"``."""
    import torch
    import torch.nn.functional as F

    s = settings()
    config, batch = config or s.config, batch or s.batch
    rng = np.random.default_rng(seed)
    pad = ((1, 1), (1, 1))
    xla = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"))  # noqa: E731
    patches = lambda x, k: FL.conv_as_matmul(x, k, (1, 1), pad)  # noqa: E731
    fns: dict[str, Callable[[], Any]] = {}
    for stage, c in enumerate(config.stage_widths()):
        side = 8 >> stage
        where = f"stage {stage} ({side}×{side}, {c} channels)"
        x = rng.standard_normal((batch, side, side, c)).astype(np.float32)
        k = (rng.standard_normal((3, 3, c, c)) / np.sqrt(9 * c)).astype(np.float32)
        g = rng.standard_normal((batch, side, side, c)).astype(np.float32)
        xj, kj, gj = jnp.asarray(x), jnp.asarray(k), jnp.asarray(g)
        for name, conv in (("XLA convolution", xla), ("Part VI patches", patches)):
            fwd = jax.jit(conv)
            bwd = jax.jit(lambda x_, k_, g_, conv=conv: jax.vjp(conv, x_, k_)[1](g_))
            fns[f"{name} forward, {where}"] = lambda f=fwd, a=xj, b=kj: f(a, b)
            fns[f"{name} backward, {where}"] = lambda f=bwd, a=xj, b=kj, d=gj: f(a, b, d)
        for name, fmt in (("PyTorch", torch.contiguous_format), ("PyTorch channels_last", torch.channels_last)):
            xt = torch.tensor(x.transpose(0, 3, 1, 2)).contiguous(memory_format=fmt).requires_grad_(True)
            kt = torch.tensor(k.transpose(3, 2, 0, 1)).contiguous(memory_format=fmt).requires_grad_(True)
            gt = torch.tensor(g.transpose(0, 3, 1, 2)).contiguous(memory_format=fmt)
            yt = F.conv2d(xt, kt, padding=1)

            def torch_fwd(xt=xt, kt=kt):
                with torch.no_grad():
                    return F.conv2d(xt, kt, padding=1)

            fns[f"{name} forward, {where}"] = torch_fwd
            fns[f"{name} backward, {where}"] = lambda yt=yt, xt=xt, kt=kt, gt=gt: torch.autograd.grad(
                yt, (xt, kt), gt, retain_graph=True)
    return time_interleaved(fns, repeats, threads={n: timing.torch_threads() if n.startswith("PyTorch") else timing.xla_threads()
                                                   for n in fns})  # each PyTorch kernel at its faster thread count



def network_convs(config: ResNetConfig, batch: int) -> list[dict[str, Any]]:
    """Every convolution met in a forward pass of the network on ``batch`` images, in order, read off the
    network itself (a recording convolution, traced without computing): ``input`` (NHWC shape), ``kernel``
    (HWIO), ``strides``, ``padding`` and ``output`` (NHWC shape)."""
    seen: list[dict[str, Any]] = []

    def record(lhs, rhs, window_strides, padding, *args, **kwargs):
        out = jax.lax.conv_general_dilated(lhs, rhs, window_strides, padding, *args, **kwargs)
        seen.append({"input": tuple(lhs.shape), "kernel": tuple(rhs.shape), "strides": tuple(window_strides),
                     "padding": tuple(map(tuple, padding)), "output": tuple(out.shape)})
        return out

    model = FL.with_convs(resnet_nnx.make_model(config), record)
    model.eval()  # the same shapes as in training, and nothing to update while tracing
    jax.eval_shape(model, jax.ShapeDtypeStruct((batch, 8, 8, 1), jnp.float32))
    return seen


def conv_products(config: ResNetConfig, batch: int) -> list[dict[str, Any]]:
    """The matrix products a train step computes when every convolution of :func:`network_convs` is a
    patches product (Part V's ``floor.conv_as_matmul``): the forward ``patches (m, k) @ kernel (k, n)``,
    the input gradient ``(m, n) @ kernel.T (n, k)`` (whose patches are then summed back into images), and
    the kernel gradient ``(n, m) @ patches (m, k)``; m: output pixels of the batch, k: ``kh·kw·c_in``, n:
    ``c_out``. The first convolution reads the images, which need no gradient, so it has no
    input-gradient product. Each row: ``conv`` (its index), ``product``, ``shape`` (m, k, n of
    ``(m, k) @ (k, n)``) and ``flops``."""
    rows = []
    for i, c in enumerate(network_convs(config, batch)):
        kh, kw, c_in, c_out = c["kernel"]
        m, k, n = int(np.prod(c["output"][:-1])), kh * kw * c_in, c_out
        shapes = {"forward": (m, k, n), "input gradient": (m, n, k), "kernel gradient": (n, m, k)}
        if i == 0:
            del shapes["input gradient"]
        rows += [{"conv": i, "product": p, "shape": s, "flops": 2 * s[0] * s[1] * s[2]} for p, s in shapes.items()]
    return rows


KERNELS_ALONE_XLA = "XLA: the patches products alone"
KERNELS_ALONE_ONEDNN = "oneDNN: the convolutions alone (channels_last)"


def kernels_alone(config: ResNetConfig | None = None, batch: int | None = None, repeats: int = 7,
                  seed: int = 0) -> dict[str, Any]:
    """The convolutions of one train step with nothing else, on each side, timed in turns on random
    operands made beforehand: on the JAX side the matrix products of :func:`conv_products` as one compiled
    program of independent products (no patches to gather or sum, no BatchNorm, no Adam, XLA free to run
    products at once on its threads), so that a step computing its convolutions as these products cannot
    take less; on PyTorch's (when torch imports), every convolution of :func:`network_convs` forward and
    backward (input and kernel gradients, none for the images) by oneDNN in ``channels_last``, as PyTorch
    tuned runs them. Returns ``timings`` ({name: Timing}, names ``KERNELS_ALONE_*``), ``flops`` (of the
    products), ``products`` (how many) and ``flops_per_s`` (of XLA's products)."""
    s = settings()
    config, batch = config or s.config, batch or s.batch
    rows = conv_products(config, batch)
    rng = np.random.default_rng(seed)
    operands = [(jnp.asarray(rng.standard_normal((m, k)), jnp.float32), jnp.asarray(rng.standard_normal((k, n)), jnp.float32))
                for m, k, n in (r["shape"] for r in rows)]
    together = jax.jit(lambda ops: [a @ b for a, b in ops])
    fns: dict[str, Callable[[], Any]] = {KERNELS_ALONE_XLA: lambda: together(operands)}
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        torch = None
    if torch is not None:
        graphs = []
        for i, c in enumerate(network_convs(config, batch)):
            cl = torch.channels_last
            x = torch.randn(*np.array(c["input"])[[0, 3, 1, 2]]).contiguous(memory_format=cl).requires_grad_(i > 0)
            kern = torch.randn(*np.array(c["kernel"])[[3, 2, 0, 1]]).contiguous(memory_format=cl).requires_grad_(True)
            graphs.append((x, kern, c))

        def onednn() -> None:
            for x, kern, c in graphs:
                y = F.conv2d(x, kern, stride=c["strides"], padding=[p[0] for p in c["padding"]])
                torch.autograd.grad(y, [t for t in (x, kern) if t.requires_grad], torch.ones_like(y))

        fns[KERNELS_ALONE_ONEDNN] = onednn
    timings = time_interleaved(fns, repeats, threads={n: timing.torch_threads() if n == KERNELS_ALONE_ONEDNN
                                                      else timing.xla_threads() for n in fns})
    flops = float(sum(r["flops"] for r in rows))
    return {"timings": timings, "flops": flops, "products": len(rows),
            "flops_per_s": flops / timings[KERNELS_ALONE_XLA].median}


if __name__ == "__main__":
    main()
