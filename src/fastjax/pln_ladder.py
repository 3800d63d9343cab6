"""Every rung of the PLN ladder (Part I) as a compact function, measured side by side.

Each chapter writes its rung in the page for the lesson and checks that the rung here gives the
same ELBO trajectory, so what ``measure_ladder`` times is what the chapters teach. All rungs run
the same algorithm: pyPLNmodels' Rprop (lr 0.01, step sizes in [1e-10, 50]) on (M, S), with B and Σ
profiled out, from pyPLNmodels' start. A fit of ``n_iter`` iterations returns ``(M, S, elbos)``
where ``elbos[k]`` is the ELBO before update ``k`` (as pyPLNmodels records it).
"""

from __future__ import annotations

import contextlib
import functools
import io
import time
from typing import Any, Callable, NamedTuple

import fastjax  # noqa: F401  (the CPU workaround, before jax)
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fastjax import pln, sizes
from fastjax.timing import Timing, block, compile_time, first_call_seconds, time_interleaved, time_per_call

LR = 0.01  # pyPLNmodels' default learning rate
TARGET_GAP = 5e-4  # "reached": within 0.05 % of pyPLNmodels' final ELBO


def settings() -> Any:
    """The sizes in force: data repeats, iterations of a fit, iterations per timed call, repeats."""
    return sizes.choose(
        quick=dict(repeat=1, n_iter=50, n_time=30, n_time_eager=3, repeats=3, race_repeats=1),
        full=dict(repeat=100, n_iter=1000, n_time=100, n_time_eager=5, repeats=5, race_repeats=1),
    )


def make_optimizer(lr: float = LR) -> optax.GradientTransformation:
    """pyPLNmodels' optimizer in optax: Rprop with step sizes clipped to [1e-10, 50].
    (optax's first Rprop update is zero, torch's is not: the trajectories differ by one step.)"""
    return optax.rprop(lr, min_step_size=1e-10, max_step_size=50.0)


def loss(params: tuple[Any, Any], data: pln.PlnData) -> Any:
    """The negative profiled ELBO at ``params = (M, S)``."""
    m, s = params
    return -pln.profiled_elbo(m, s, data)


def start(data: pln.PlnData) -> tuple[Any, Any]:
    """pyPLNmodels' starting point (M, S) for ``data`` (JAX arrays)."""
    return pln.init_latent(data.counts)


# ----------------------------------------------------------------------------- rung 1: eager

class PlnEager:
    """Rung 1: a Python class and a Python loop, every operation dispatched eagerly."""

    def __init__(self, data: pln.PlnData, lr: float = LR):
        self.data = data
        self.tx = make_optimizer(lr)
        self.params = start(data)
        self.opt_state = self.tx.init(self.params)

    def step(self) -> Any:
        """One Rprop update; returns the ELBO before it."""
        value, grads = jax.value_and_grad(loss)(self.params, self.data)
        updates, self.opt_state = self.tx.update(grads, self.opt_state, self.params)
        self.params = optax.apply_updates(self.params, updates)
        return -value

    def fit(self, n_iter: int, progress: bool = False) -> np.ndarray:
        """Run ``n_iter`` steps; return the ELBO trajectory."""
        steps = range(n_iter)
        if progress:
            from tqdm.auto import tqdm
            steps = tqdm(steps, desc="eager fit")
        return np.asarray(jnp.stack([self.step() for _ in steps]))


def fit_eager(data: pln.PlnData, n_iter: int, progress: bool = False) -> tuple[Any, Any, np.ndarray]:
    """Rung 1 as a function: ``(M, S, elbos)``."""
    model = PlnEager(data)
    elbos = model.fit(n_iter, progress=progress)
    return model.params[0], model.params[1], elbos


# ----------------------------------------------------------------------------- rung 2: jit pieces

_TX = make_optimizer()
_grad_jit = jax.jit(jax.value_and_grad(loss))
_update_jit = jax.jit(_TX.update)  # jitted once, at module level: new objects reuse the compiled code
_apply_jit = jax.jit(optax.apply_updates)


class PlnJit(PlnEager):
    """Rung 2: the same class with each piece jitted once (gradient, optimizer update, apply)."""

    def __init__(self, data: pln.PlnData):
        super().__init__(data)
        self.tx = _TX
        self.opt_state = _TX.init(self.params)

    def step(self) -> Any:
        value, grads = _grad_jit(self.params, self.data)
        updates, self.opt_state = _update_jit(grads, self.opt_state, self.params)
        self.params = _apply_jit(self.params, updates)
        return -value


def fit_jit(data: pln.PlnData, n_iter: int) -> tuple[Any, Any, np.ndarray]:
    """Rung 2 as a function: ``(M, S, elbos)``."""
    model = PlnJit(data)
    elbos = model.fit(n_iter)
    return model.params[0], model.params[1], elbos


# ----------------------------------------------------------------------------- rung 3: scan

def scan_fit(params: tuple[Any, Any], data: pln.PlnData, n_iter: int) -> tuple[Any, Any]:
    """The whole fit as one ``lax.scan`` (jit it with ``n_iter`` static): ``(params, elbos)``."""
    tx = make_optimizer()

    def body(carry, _):
        params, opt_state = carry
        value, grads = jax.value_and_grad(loss)(params, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), -value

    (params, _), elbos = jax.lax.scan(body, (params, tx.init(params)), length=n_iter)
    return params, elbos


scan_fit_jit = jax.jit(scan_fit, static_argnames="n_iter")


def fit_scan(data: pln.PlnData, n_iter: int) -> tuple[Any, Any, np.ndarray]:
    """Rung 3 as a function: ``(M, S, elbos)``."""
    (m, s), elbos = scan_fit_jit(start(data), data, n_iter=n_iter)
    return m, s, np.asarray(elbos)


# ----------------------------------------------------------------------------- rung 4: NamedTuple

class PlnState(NamedTuple):
    """Rung 4: the state of a fit, a NamedTuple (a pytree JAX flattens in C++)."""

    m: Any
    s: Any
    opt_state: Any


def _state_step(state: PlnState, data: pln.PlnData, tx: optax.GradientTransformation) -> tuple[PlnState, Any]:
    value, (gm, gs) = jax.value_and_grad(loss)((state.m, state.s), data)
    updates, opt_state = tx.update((gm, gs), state.opt_state, (state.m, state.s))
    m, s = optax.apply_updates((state.m, state.s), updates)
    return PlnState(m, s, opt_state), -value


def _namedtuple_fit(state: PlnState, data: pln.PlnData, n_iter: int) -> tuple[PlnState, Any]:
    tx = make_optimizer()
    return jax.lax.scan(lambda st, _: _state_step(st, data, tx), state, length=n_iter)


namedtuple_fit = jax.jit(_namedtuple_fit, static_argnames="n_iter")


def init_state(data: pln.PlnData) -> PlnState:
    """The starting PlnState (pyPLNmodels' start and a fresh Rprop state)."""
    m, s = start(data)
    return PlnState(m, s, make_optimizer().init((m, s)))


def fit_namedtuple(data: pln.PlnData, n_iter: int) -> tuple[Any, Any, np.ndarray]:
    """Rung 4 as a function: ``(M, S, elbos)``."""
    state, elbos = namedtuple_fit(init_state(data), data, n_iter=n_iter)
    return state.m, state.s, np.asarray(elbos)


# ----------------------------------------------------------------------------- rung 5: pytree class

@jax.tree_util.register_pytree_node_class
class PlnModel:
    """Rung 5: a class registered as a pytree. Leaves: M, S, the optimizer state. Static: lr."""

    def __init__(self, m: Any, s: Any, opt_state: Any, lr: float = LR):
        self.m, self.s, self.opt_state, self.lr = m, s, opt_state, lr

    @classmethod
    def create(cls, data: pln.PlnData, lr: float = LR) -> "PlnModel":
        """Start from pyPLNmodels' init (validation and set-up live here, not in ``__init__``)."""
        m, s = start(data)
        return cls(m, s, make_optimizer(lr).init((m, s)), lr)

    def tree_flatten(self) -> tuple[tuple[Any, ...], float]:
        return (self.m, self.s, self.opt_state), self.lr  # aux_data: hashable, no arrays

    @classmethod
    def tree_unflatten(cls, lr: float, leaves: tuple[Any, ...]) -> "PlnModel":
        obj = object.__new__(cls)  # no __init__: nothing re-run, nothing reset
        obj.m, obj.s, obj.opt_state = leaves
        obj.lr = lr
        return obj

    def step(self, data: pln.PlnData) -> tuple["PlnModel", Any]:
        """One Rprop update; returns the new model and the ELBO before it."""
        tx = make_optimizer(self.lr)
        value, grads = jax.value_and_grad(loss)((self.m, self.s), data)
        updates, opt_state = tx.update(grads, self.opt_state, (self.m, self.s))
        m, s = optax.apply_updates((self.m, self.s), updates)
        return PlnModel(m, s, opt_state, self.lr), -value

    @jax.jit(static_argnames="n_iter")
    def fit(self, data: pln.PlnData, n_iter: int) -> tuple["PlnModel", Any]:
        """``n_iter`` steps in one ``lax.scan``: the fitted model and the ELBO trajectory."""
        return jax.lax.scan(lambda model, _: model.step(data), self, length=n_iter)


def fit_pytree(data: pln.PlnData, n_iter: int) -> tuple[Any, Any, np.ndarray]:
    """Rung 5 as a function: ``(M, S, elbos)``."""
    model, elbos = PlnModel.create(data).fit(data, n_iter=n_iter)
    return model.m, model.s, np.asarray(elbos)


# ----------------------------------------------------------------------------- rung 6: NNX

def _nnx():
    from flax import nnx
    return nnx


def make_nnx(data: pln.PlnData) -> tuple[Any, Any]:
    """Rung 6: the PLN as an ``nnx.Module`` (M and S are ``nnx.Param``) and its ``nnx.Optimizer``."""
    nnx = _nnx()

    class PlnNnx(nnx.Module):
        def __init__(self, m, s):
            self.m, self.s = nnx.Param(m), nnx.Param(s)

        def __call__(self, data):
            return pln.profiled_elbo(self.m[...], self.s[...], data)

    model = PlnNnx(*start(data))
    return model, nnx.Optimizer(model, make_optimizer(), wrt=nnx.Param)


def nnx_train_step(model: Any, optimizer: Any, data: pln.PlnData) -> Any:
    """One Rprop update of an NNX model in place; returns the ELBO before it."""
    nnx = _nnx()
    value, grads = nnx.value_and_grad(lambda mdl: -mdl(data))(model)
    optimizer.update(model, grads)
    return -value


def nnx_steppers(data: pln.PlnData) -> dict[str, tuple[Callable[[], Any], Callable[[], tuple[Any, Any]]]]:
    """Each NNX way to call a train step, as ``name -> (step() -> elbo, params() -> (M, S))``, each on
    its own fresh model: ``nnx.jit``, ``jax.jit`` + split/merge, and the newer paths when present."""
    nnx = _nnx()
    out = {}

    model, opt = make_nnx(data)
    step_nnx = nnx.jit(nnx_train_step)
    out["nnx.jit"] = (lambda m=model, o=opt: step_nnx(m, o, data), lambda m=model: (m.m[...], m.s[...]))

    model, opt = make_nnx(data)
    graphdef, state = nnx.split((model, opt))

    @jax.jit
    def pure_step(state, data):
        model, opt = nnx.merge(graphdef, state)
        elbo = nnx_train_step(model, opt, data)
        return nnx.state((model, opt)), elbo

    box = {"state": state}

    def step_split():
        box["state"], elbo = pure_step(box["state"], data)
        return elbo

    def params_split():
        mdl, _ = nnx.merge(graphdef, box["state"])
        return mdl.m[...], mdl.s[...]

    out["jax.jit + split/merge"] = (step_split, params_split)

    if hasattr(nnx, "jit_partial"):
        model, opt = make_nnx(data)
        partial = nnx.jit_partial(nnx_train_step, model, opt, graph=False)
        out["nnx.jit_partial(graph=False)"] = (lambda: partial(data), lambda m=model: (m.m[...], m.s[...]))
    return out


def fit_nnx(data: pln.PlnData, n_iter: int, how: str = "jax.jit + split/merge") -> tuple[Any, Any, np.ndarray]:
    """Rung 6 as a function, with the NNX path ``how``: ``(M, S, elbos)``."""
    step, params = nnx_steppers(data)[how]
    elbos = np.asarray(jnp.stack([step() for _ in range(n_iter)]))
    return (*params(), elbos)


# ----------------------------------------------------------------------------- measuring

def python_loop(step: Callable[[], Any], n: int) -> Callable[[], Any]:
    """A callable that runs ``step()`` ``n`` times in a Python loop and returns the last result."""
    def run():
        out = None
        for _ in range(n):
            out = step()
        return out
    return run


def fresh_scan_fit(n_iter: int) -> Callable[..., Any]:
    """A new ``jax.jit`` of the scan fit with ``n_iter`` fixed: a new cache entry, so
    ``compile_time`` on it measures a real trace and compile."""
    return jax.jit(functools.partial(scan_fit, n_iter=n_iter))


def interleaved(calls: dict[str, tuple[Callable[[], Any], int]], rounds: int) -> list[Timing]:
    """``timing.time_interleaved`` with one call per round; ``calls``: name -> (fn, iterations per call)."""
    out = time_interleaved({name: fn for name, (fn, _) in calls.items()}, repeats=rounds,
                           per={name: per for name, (_, per) in calls.items()}, sync="each", min_repeat_seconds=0.0)
    return list(out.values())


def measure_ladder(data: pln.PlnData | None = None) -> dict[str, Any]:
    """Per-iteration time of every rung and of the floor (the AOT-compiled scan fit), measured
    in turns in one run, with compile time apart. Returns {"rungs", "floor", "extra"}."""
    cfg = settings()
    if data is None:
        data = pln.to_jax(pln.load_oaks_counts(cfg.repeat))
    n, p, d = data.shape
    nt = cfg.n_time
    p0 = start(data)

    eager = PlnEager(data)
    eager_first = first_call_seconds(eager.step)
    aot = compile_time(fresh_scan_fit(nt), p0, data)
    st0, model0 = init_state(data), PlnModel.create(data)
    calls = {
        "1 no-jit": (python_loop(eager.step, cfg.n_time_eager), cfg.n_time_eager),
        "2 jit": (python_loop(PlnJit(data).step, nt), nt),
        "3 scan": (lambda: scan_fit_jit(p0, data, n_iter=nt), nt),
        "4 NamedTuple": (lambda: namedtuple_fit(st0, data, n_iter=nt), nt),
        "5 pytree class": (lambda: model0.fit(data, n_iter=nt), nt),
    }
    for how, (step, _) in nnx_steppers(data).items():
        calls[f"6 {how}"] = (python_loop(step, nt), nt)
    calls["floor: AOT-compiled scan"] = (lambda: aot.compiled(p0, data), nt)
    timings = interleaved(calls, cfg.repeats)
    floor = timings.pop()
    floor.compile_seconds = aot.compile_seconds
    # lax.scan called outside jit re-traces and re-compiles on every call: timed apart (slow).
    rescan = time_per_call(lambda: scan_fit(p0, data, n_iter=nt), name="3 scan, not jitted",
                           repeats=3, number=1, warmup=0, per=nt)
    timings.insert(3, rescan)
    extra = dict(n=n, p=p, d=d, n_time=nt, n_time_eager=cfg.n_time_eager, size=cfg.size,
                 lower_seconds=aot.lower_seconds, compile_seconds=aot.compile_seconds,
                 eager_first_step_seconds=eager_first)
    return {"rungs": timings, "floor": floor, "extra": extra}


def fit_pyplnmodels(data: pln.PlnData) -> tuple[Any, float, np.ndarray, np.ndarray]:
    """Fit ``pyPLNmodels.Pln`` with its defaults, quietly: (model, seconds, elbos, cumulative seconds)."""
    from pyPLNmodels import Pln

    model = Pln(np.asarray(data.counts), offsets=np.asarray(data.offsets), add_const=False,
                exog=np.asarray(data.covariates))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        t0 = time.perf_counter()
        model.fit()
        seconds = time.perf_counter() - t0
    elbos = np.array([float(e) for e in model._elbo_criterion_monitor.elbo_list])
    return model, seconds, elbos, np.asarray(model._time_recorder.running_times)


def first_reaching(elbos: np.ndarray, target: float, gap: float = TARGET_GAP) -> int | None:
    """Index of the first ELBO within ``gap`` (relative) of ``target``, or None."""
    hit = np.flatnonzero(np.asarray(elbos) >= target - gap * abs(target))
    return int(hit[0]) if hit.size else None


def race_pyplnmodels(data_np: pln.PlnData | None = None) -> dict[str, Any]:
    """Time to reach pyPLNmodels' final ELBO (within 0.05 %): ``Pln.fit`` (defaults, torch, same CPU)
    against the AOT-compiled scan fit stopped at the first iteration that reaches it. Seconds are
    medians over ``race_repeats`` runs; compile time is reported apart."""
    cfg = settings()
    data_np = pln.load_oaks_counts(cfg.repeat) if data_np is None else data_np
    data = pln.to_jax(data_np)
    fit_pyplnmodels(pln.load_oaks_counts(1))  # warm-up: torch's first fit is slower
    runs = [fit_pyplnmodels(data_np) for _ in range(cfg.race_repeats)]
    model, _, p_elbos, _ = runs[len(runs) // 2]
    target = float(model.elbo)
    k_p = first_reaching(p_elbos, target)
    n_iter = len(p_elbos)
    _, _, j_elbos = fit_scan(data, n_iter)
    k_j = first_reaching(j_elbos, target)
    out = dict(n=data.shape[0], p=data.shape[1], target_elbo=target, pyplnmodels_iterations=n_iter,
               pyplnmodels_seconds=float(np.median([r[1] for r in runs])),
               pyplnmodels_iters_to_target=k_p + 1,
               pyplnmodels_seconds_to_target=float(np.median([r[3][k_p] for r in runs])),
               jax_elbo_after_same_iterations=float(j_elbos[-1]),
               jax_iters_to_target=None if k_j is None else k_j + 1)
    if k_j is None:
        return out
    p0 = start(data)
    aot = compile_time(fresh_scan_fit(k_j + 1), p0, data)
    run = time_per_call(aot.compiled, p0, data, name="jax to target", repeats=max(3, cfg.race_repeats), number=1)
    _, elbos = aot.compiled(p0, data)
    compile_s = aot.total_seconds
    out.update(jax_seconds_to_target=run.median, jax_compile_seconds=compile_s,
               jax_elbo_at_target=float(np.asarray(elbos)[-1]),
               speedup_compile_excluded=out["pyplnmodels_seconds_to_target"] / run.median,
               speedup_compile_included=out["pyplnmodels_seconds_to_target"] / (run.median + compile_s))
    return out
