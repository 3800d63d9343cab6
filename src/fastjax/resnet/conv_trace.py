"""Where a ResNet train step's time goes, convolution by convolution (chapters/floor/03-resnet-floor.md).

- ``traced_ops``: :func:`fastjax.tools.profiling.top_ops` of several calls of a compiled step, in ms per call.
- ``conv_breakdown``: the convolutions of such a trace by direction (backward when their metadata names
  ``transpose(jvp(...))``, else forward) and by stage of the network, and each one with its layout.
- ``kind_of`` / ``by_kind`` / ``matrix_products``: a trace's ops as convolutions, matrix products,
  concatenations and the rest; the matrix products a compiled program runs as kernels.
- ``layouts``: the layouts (``dim_labels``) of a compiled program's convolutions.
"""

from __future__ import annotations

import re
import tempfile
from typing import Any

import jax

from fastjax.resnet.resnet_nnx import ResNetConfig
from fastjax.tools import profiling

KINDS = ("convolution", "matrix products", "concatenate", "fusions and the rest")


def traced_ops(executable: Any, args: tuple, calls: int = 5) -> list[dict[str, Any]]:
    """``profiling.top_ops`` of ``calls`` calls of a compiled step on ``args`` (after one untraced call),
    each row's ``total ms`` divided by ``calls``: ms per step."""
    if calls < 1:
        raise ValueError(f"traced_ops needs at least one call to trace; got calls={calls}")
    jax.block_until_ready(executable(*args))
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        for _ in range(calls):
            out = executable(*args)
        jax.block_until_ready(out)
    rows = profiling.top_ops(profiling.read_trace(profiling.find_trace(folder)), executable.as_text())
    return [{**r, "total ms": r["total ms"] / calls} for r in rows]


def _lines(hlo: str) -> dict[str, str]:
    """Each instruction's line of a compiled program's text, by name."""
    out = {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
        if m:
            out[m.group(1)] = line
    return out


def stage_of(line: str, config: ResNetConfig) -> int | None:
    """The stage whose channel count (width·2ˢ) is the largest in an instruction's result shape (None: none)."""
    dims = [int(d) for d in re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = \w+\[([\d,]*)\]", line).group(1).split(",") if d]
    found = [s for s in range(config.stages) if config.width * 2**s in dims]
    return max(found) if found else None


def conv_breakdown(rows: list[dict[str, Any]], hlo: str, config: ResNetConfig, side: int = 8
                   ) -> tuple[dict[tuple[str, str], float], list[dict[str, Any]]]:
    """ms per step of the convolutions among ``rows`` (of :func:`traced_ops`), keyed by ``(direction,
    "stage s (h×w)")`` (stage 0 works on ``side``-pixel images, each next stage on half as many a side);
    and each convolution, slowest first: its name, direction, stage, layout, result type and ms."""
    lines, groups, each = _lines(hlo), {}, []
    for r in rows:
        if r["op"] != "convolution":
            continue
        line = lines[r["op name"]]
        direction = "backward" if "transpose(jvp" in line else "forward"
        stage = stage_of(line, config)
        pixels = side >> stage if stage is not None else "?"
        key = (direction, f"stage {stage} ({pixels}×{pixels})")
        groups[key] = groups.get(key, 0.0) + r["total ms"]
        each.append({"op name": r["op name"], "direction": direction, "stage": stage, "layout": r["labels"],
                     "result": re.search(r"= (\w+\[[\d,]*\])", line).group(1), "ms": r["total ms"]})
    return groups, each


def kind_of(row: dict[str, Any]) -> str:
    """Convolution (XLA's, or one a ynn_fusion wraps), matrix product (``profiling.op_kind``'s, less the
    convolutions: a dot, or a ynn_fusion wrapping one), concatenation, or the rest."""
    if row["op"] == "convolution":
        return "convolution"
    if profiling.op_kind(row) == "matrix products":
        return "matrix products"
    return "concatenate" if row["op"] == "concatenate" else "fusions and the rest"


def by_kind(rows: list[dict[str, Any]]) -> dict[str, float]:
    """ms of ``rows`` summed by :func:`kind_of`."""
    out: dict[str, float] = {}
    for r in rows:
        out[kind_of(r)] = out.get(kind_of(r), 0.0) + r["total ms"]
    return out


def matrix_products(hlo: str) -> int:
    """The matrix products among a compiled program's instructions that run as kernels (not inside a
    fusion), by the rule of :func:`kind_of`: a dot, or a ynn_fusion that does not wrap a convolution."""
    return sum(kind_of({"op": ins["op"], "op name": name}) == "matrix products"
               for name, ins in profiling.instructions(hlo).items() if not ins["in_fusion"])


def layouts(hlo: str) -> list[str]:
    """The distinct layouts (``dim_labels``) of a compiled program's convolutions, sorted."""
    return sorted(set(re.findall(r"dim_labels=([^,\s]+)", hlo)))
