"""Which work a rolled ``lax.scan`` runs slower than a Python loop of jitted calls, on small bodies of
the Part II ResNet's shape (the experiments of chapters/resnet/04-scan.md).

Five bodies: elementwise work only; four 3×3 convolutions, channels-last (NHWC/HWIO) and
channels-first (NCHW/OIHW); and those convolutions with their kernel's gradient, which a train step
adds. Each is timed once per jitted call from Python and K times in one scan (per step), and the
scan's compiled program is kept so that its convolutions can be counted by place and layout
(:func:`fastjax.resnet.bench.convolutions`).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fastjax.resnet.bench import convolutions
from fastjax.tools import timing

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
