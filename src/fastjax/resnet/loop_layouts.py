"""Which work a rolled ``lax.scan`` runs slower than a Python loop of jitted calls, on small bodies of
the Part II ResNet's shape (the experiments of chapters/resnet/04-scan.md).

Five bodies: elementwise work only; four 3×3 convolutions, channels-last (NHWC/HWIO) and
channels-first (NCHW/OIHW); and those convolutions with their kernel's gradient, which a train step
adds. Each is timed once per jitted call from Python and K times in one scan (per step), and the
scan's compiled program is kept so that its convolutions can be counted by place and layout
(:func:`fastjax.resnet.bench.convolutions`). ``trace_runs`` and ``loop_against_scan`` read where the
time of the network's steps goes, as calls and as one scan, from ``jax.profiler`` traces.
``forward_against_train`` runs the same test on the network: its forward pass against its train step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from fastjax.resnet.bench import NHWC_LABELS, convolutions, trace_ops
from fastjax.tools import profiling, timing

Carry = tuple[jax.Array, jax.Array]


def layouts(batch: int, channels: int = 8, seed: int = 0) -> dict[str, tuple[jax.Array, jax.Array, tuple[str, str, str]]]:
    """An ``(batch, 8, 8, channels)`` input and a 3×3 kernel (activations O(1)), in both layouts, with
    their ``dimension_numbers``; NumPy draws, so no small JAX program is compiled for them."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((batch, 8, 8, channels), np.float32))
    w = jnp.asarray(rng.standard_normal((3, 3, channels, channels), np.float32) / np.float32(np.sqrt(9 * channels)))
    return {"NHWC": (x, w, ("NHWC", "HWIO", "NHWC")),
            "NCHW": (x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), ("NCHW", "OIHW", "NCHW"))}


def conv_chain(x: jax.Array, w: jax.Array, dims: tuple[str, str, str]) -> jax.Array:
    for _ in range(4):
        x = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dims)
    return x


def conv_body(dims: tuple[str, str, str], grad: bool) -> Callable[[Carry, Any], tuple[Carry, None]]:
    """A scan body of four convolutions; with ``grad``, their kernel's gradient (a tiny step keeps the
    kernel unchanged in effect), as in a train step."""
    def body(carry, _):
        x, w = carry
        if grad:
            g = jax.grad(lambda w: jnp.sum(conv_chain(x, w, dims) ** 2))(w)
            return (x, w - 1e-6 * g), None
        return (0.5 * conv_chain(x, w, dims), w), None
    return body


def elementwise_body(carry: Carry, _: Any) -> tuple[Carry, None]:
    x, w = carry
    for _ in range(8):
        x = 0.9 * jnp.tanh(x) + 0.1 * jnp.sin(x)
    return (x, w), None


def bodies(batch: int) -> dict[str, tuple[Callable, Carry]]:
    """The five bodies by name, each with its starting carry."""
    lay = layouts(batch)
    return {"elementwise only": (elementwise_body, lay["NHWC"][:2]),
            **{f"conv {name}, forward": (conv_body(d, False), (x, w)) for name, (x, w, d) in lay.items()},
            **{f"conv {name}, with gradient": (conv_body(d, True), (x, w)) for name, (x, w, d) in lay.items()}}


def loop_and_scan(body: Callable, carry: Carry, k: int, unroll: int = 1):
    """Callables running one jitted body per call, and ``k`` bodies in one scan; and the scan's
    compiled program."""
    one = jax.jit(lambda c: body(c, None)[0]).lower(carry).compile()
    many = jax.jit(lambda c: jax.lax.scan(body, c, None, length=k, unroll=unroll)[0]).lower(carry).compile()
    return (lambda: one(carry)), (lambda: many(carry)), many


def measure_bodies(batch: int, k: int, repeats: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Per step, each body in a Python loop and in a scan, timed side by side: the ratio scan ÷ loop by
    body, and the table's rows (with the scan's convolutions by place and layout)."""
    fns, per, programs = {}, {}, {}
    for name, (body, carry) in bodies(batch).items():
        fns[f"{name} | loop"], fns[f"{name} | scan"], programs[name] = loop_and_scan(body, carry, k)
        per[f"{name} | scan"] = k
    t = timing.time_interleaved(fns, repeats=repeats, per=per)
    ratios = {name: t[f"{name} | scan"].median / t[f"{name} | loop"].median for name in programs}
    rows = [{"loop body": n, "µs per step, Python loop": t[f"{n} | loop"].median_us,
             "µs per step, scan": t[f"{n} | scan"].median_us, "scan ÷ loop": r,
             "convolutions in the scan": convolutions(programs[n].as_text())} for n, r in ratios.items()]
    return ratios, rows


def measure_unrolls(batch: int, k: int, repeats: int, unrolls: tuple[int, ...] = (1, 2, 5, 10)) -> list[dict[str, Any]]:
    """The conv-with-gradient body (NHWC) scanned ``k`` times at each ``unroll``: time per step, compile
    seconds, and the compiled program's convolutions by place and layout."""
    x, w, dims = layouts(batch)["NHWC"]
    fns, compile_s, convs = {}, {}, {}
    for u in unrolls:
        c = timing.compile_time(jax.jit(lambda carry, u=u: jax.lax.scan(conv_body(dims, True), carry, None, length=k,
                                                                         unroll=u)[0]), (x, w))
        fns[u] = (lambda c=c: c.compiled((x, w)))
        compile_s[u], convs[u] = c.compile_seconds, convolutions(c.compiled.as_text())
    t = timing.time_interleaved(fns, repeats=repeats, per={u: k for u in unrolls})
    return [{"unroll": u, "µs per step": t[u].median_us, "compile (s)": compile_s[u], "convolutions": convs[u]}
            for u in unrolls]


def trace_runs(runs: dict[str, tuple[Callable[[], Any], int, str]], folder: str | Path) -> tuple[dict, dict]:
    """Each ``name: (call, times, hlo)`` run ``times`` times under ``jax.profiler.trace`` (in ``folder/name``):
    its ops, slowest first, joined with the compiled program's HLO text ``hlo``
    (:func:`fastjax.resnet.bench.trace_ops`), and the trace file written, by name."""
    ops, files = {}, {}
    for name, (call, times, hlo) in runs.items():
        with jax.profiler.trace(f"{folder}/{name}"):
            out = None
            for _ in range(times):
                out = call()
            jax.block_until_ready(out)
        files[name] = profiling.find_trace(f"{folder}/{name}")
        ops[name] = trace_ops(files[name], hlo)
    return ops, files


def conv_ms(rows: list[dict[str, Any]], other_layout: bool) -> float:
    """Milliseconds of a trace's convolutions in layouts other than NHWC/HWIO (or in that layout)."""
    return sum(r["total ms"] for r in rows if r["op"] == "convolution" and (r["labels"] != NHWC_LABELS) == other_layout)


def loop_against_scan(ops: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """From the traces of the same steps as calls (``"loop"``) and as one scan (``"scan"``): the op time
    of each (ms), the scan's share in other-layout convolutions and in copies (%), the scan's extra time
    (ms) and the convolutions' share of it (%)."""
    totals = {p: sum(r["total ms"] for r in rows) for p, rows in ops.items()}
    all_conv = {p: conv_ms(rows, True) + conv_ms(rows, False) for p, rows in ops.items()}
    extra = totals["scan"] - totals["loop"]
    return {"scan_ms": totals["scan"], "loop_ms": totals["loop"],
            "share_other_conv": 100 * conv_ms(ops["scan"], True) / totals["scan"],
            "copy_share": 100 * sum(r["total ms"] for r in ops["scan"] if r["op"] == "copy") / totals["scan"],
            "extra_ms": extra, "conv_extra_share": 100 * (all_conv["scan"] - all_conv["loop"]) / extra}


def forward_step(graphdef: Any) -> Callable:
    """``step(state, images, labels) -> (state, loss)``: the network's loss alone on the nnx.State of
    (model, optimizer), BatchNorm statistics still updated, no gradient (jit it)."""
    def step(state, images, labels):
        model, optimizer = nnx.merge(graphdef, state)
        loss = optax.softmax_cross_entropy_with_integer_labels(model(images), labels).mean()
        return nnx.state((model, optimizer)), loss
    return step


def _carrying(executable: Any, state: Any, args: tuple) -> Callable[[], Any]:
    box = [state]

    def call():
        box[0], loss = executable(box[0], *args)
        return loss
    return call


def forward_against_train(graphdef: Any, state: Any, images: Any, labels: Any, k: int,
                          train_loop: Callable[[], Any], train_scan: Callable[[], Any],
                          repeats: int) -> tuple[dict[str, timing.Timing], str]:
    """The forward pass compiled for one batch per call and as a rolled ``lax.scan`` over ``k`` batches,
    timed in turns with the train step's two programs (``train_loop``, ``train_scan``: calls of the
    compiled programs that carry their state, the scan's over ``k`` batches), per step. Returns the
    timings by ``"forward | loop"``, ``"forward | scan"``, ``"train step | loop"``, ``"train step | scan"``
    and the forward scan's compiled HLO text."""
    fwd = forward_step(graphdef)
    one = jax.jit(fwd).lower(state, images[0], labels[0]).compile()
    scan = jax.jit(lambda s, a, b: jax.lax.scan(lambda c, xy: fwd(c, *xy), s, (a, b))).lower(
        state, images[:k], labels[:k]).compile()
    t = timing.time_interleaved({"forward | loop": _carrying(one, state, (images[0], labels[0])),
                                 "forward | scan": _carrying(scan, state, (images[:k], labels[:k])),
                                 "train step | loop": train_loop, "train step | scan": train_scan},
                                repeats=repeats, per={"forward | scan": k, "train step | scan": k})
    return t, scan.as_text()


def scan_against_floor(programs: dict[str, Callable], state: Any, images: Any, labels: Any, k: int,
                       floor_losses: np.ndarray) -> tuple[dict[str, float], float]:
    """Run each compiled scan program (``programs``: name -> ``program(state, images[i:i+k], labels[i:i+k])
    -> (state, losses)``) over all the batches from ``state``, ``k`` steps per call, and check its losses
    against the floor's with ``ladder.assert_same_losses`` (a scan is another program: it rounds
    differently, and Adam amplifies that; an AssertionError past ``LOSS_RTOL``). Returns each program's
    largest relative difference from the floor, and the smallest relative change of the floor's loss from
    one step to the next (what a scan that drops its state would have to hide in)."""
    from fastjax.resnet import ladder

    worst = {}
    for name, program in programs.items():
        carry, out = state, []
        for i in range(0, len(images), k):
            carry, loss = program(carry, images[i:i + k], labels[i:i + k])
            out.append(loss)
        losses = np.concatenate(out)
        ladder.assert_same_losses(losses, floor_losses, name)
        worst[name] = float(np.max(np.abs(losses / floor_losses - 1)))
    return worst, float(np.min(np.abs(np.diff(floor_losses) / floor_losses[1:])))
