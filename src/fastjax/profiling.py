"""Reading what the profiler and the compiler report, and a roofline against measured peaks.

- ``find_trace`` / ``read_trace``: the timed events of a ``jax.profiler.trace`` run (the gzipped
  Chrome/Perfetto JSON it writes), in µs.
- ``top_ops``: those events joined with a compiled program's HLO text: total ms per HLO instruction.
- ``fusions`` / ``unfused``: what XLA fused in a compiled program, read from ``compiled.as_text()``.
- ``cost``: ``compiled.cost_analysis()`` as one dict on every JAX version (older ones return a list).
- ``peak_flops`` / ``peak_bandwidth`` / ``roofline``: the device's measured peaks and the least time
  a program with given flops and bytes can take on it.

The HLO parsing is :mod:`fastjax.bench_resnet`'s (one parser for the whole book).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastjax.bench_resnet import _computations, instructions
from fastjax.timing import time_per_call

# Instructions that compute nothing (they name, reshape in place, or bundle values): left out of counts.
BOOKKEEPING = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}


def find_trace(folder: str | Path) -> Path:
    """The newest ``*.trace.json.gz`` that ``jax.profiler.trace(folder)`` wrote under ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no trace folder at {folder}: pass the folder given to jax.profiler.trace")
    files = sorted(folder.rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no *.trace.json.gz under {folder}: did the jax.profiler.trace block run?")
    return files[-1]


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """The complete events (``"ph": "X"``) of a gzipped Chrome/Perfetto trace: name, thread name,
    start ``ts`` and duration ``dur`` in µs, ordered by start."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no trace file at {path}")
    try:
        with gzip.open(path) as f:
            data = json.load(f)
    except (OSError, EOFError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a gzipped JSON trace: {err}") from None
    raw = data.get("traceEvents", []) if isinstance(data, dict) else data
    if not isinstance(raw, list):
        raise TypeError(f"{path}: 'traceEvents' should be a list of events; got {type(raw).__name__}")
    threads = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
               for e in raw if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name"}
    events = [{"name": e.get("name", ""), "thread": threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
               "ts": float(e["ts"]), "dur": float(e["dur"])}
              for e in raw if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not events:
        raise ValueError(f"{path} holds no timed events (\"ph\": \"X\" with a \"dur\"): "
                         "was anything run inside the jax.profiler.trace block?")
    return sorted(events, key=lambda e: e["ts"])


def _kernels(hlo: str) -> dict[str, list[str]]:
    """The computations whose instructions run as kernels: the entry, loop bodies and conditions,
    called computations; not fusion bodies, nor the reducers and comparators given to ``to_apply``."""
    comps = _computations(hlo)
    inner = set(re.findall(r" fusion\(.*?calls=%?([\w.\-]+)", hlo)) | set(re.findall(r"to_apply=%?([\w.\-]+)", hlo))
    return {name: lines for name, lines in comps.items() if name not in inner}


def _fusion_lines(hlo: str) -> list[tuple[str, str, str]]:
    """(name, kind, fused computation) of each fusion that runs as one kernel (not one nested in another)."""
    out = []
    for lines in _kernels(hlo).values():
        for line in lines:
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*? fusion\(.*?kind=(k\w+).*?calls=%?([\w.\-]+)", line)
            if m:
                out.append(m.groups())
    return out


def _opcodes(lines: list[str]) -> list[str]:
    ops = [m.group(1) for ln in lines if (m := re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = .*? ([\w\-]+)\(", ln))]
    return [op for op in ops if op not in BOOKKEEPING]


def fusions(hlo: str) -> list[dict[str, Any]]:
    """Each fusion of a compiled program (``compiled.as_text()``): its name, kind (``kLoop``:
    elementwise; ``kInput``: ends in a reduction; ``kOutput``: a library call with work fused into
    its output; ``kCustom``: backend-specific) and the operations fused into it."""
    if "HloModule" not in hlo:
        raise ValueError("expected the text of a compiled HLO module (compiled.as_text()); it has no 'HloModule'")
    comps = _computations(hlo)
    return [{"name": name, "kind": kind, "ops": _opcodes(comps.get(called, []))}
            for name, kind, called in _fusion_lines(hlo)]


def unfused(hlo: str) -> Counter:
    """Operations of a compiled program that run on their own, outside any fusion, counted by opcode
    (bookkeeping such as parameters, constants and bitcasts left out; loops and calls included)."""
    if "HloModule" not in hlo:
        raise ValueError("expected the text of a compiled HLO module (compiled.as_text()); it has no 'HloModule'")
    return Counter(op for lines in _kernels(hlo).values() for op in _opcodes(lines) if op != "fusion")


def top_ops(events: list[dict[str, Any]], hlo: str, n: int | None = None) -> list[dict[str, Any]]:
    """Trace events of the HLO instructions of one compiled program, summed per instruction, slowest
    first: name, what :func:`instructions` says of it (opcode, with a fusion wrapping one convolution
    counted as a convolution; in a loop or not; layout), calls, total ms, and share of the program's
    op time. Loops and calls are left out: their events contain the events of the ops they run."""
    known = instructions(hlo)
    rows: dict[str, dict[str, Any]] = {}
    for e in events:
        ins = known.get(e["name"])
        if ins is None or ins["op"] in ("while", "call", "conditional"):  # these contain other ops' events
            continue
        row = rows.setdefault(e["name"], {"op name": e["name"], **ins, "calls": 0, "total ms": 0.0})
        row["calls"] += 1
        row["total ms"] += e["dur"] / 1e3
    if not rows:
        raise ValueError("no event of the trace names an instruction of this program: "
                         "trace and HLO text must come from the same compiled program")
    total = sum(r["total ms"] for r in rows.values())
    out = sorted(rows.values(), key=lambda r: -r["total ms"])
    for r in out:
        r["share"] = r["total ms"] / total
    return out[:n] if n else out


def cost(compiled: Any) -> dict[str, float]:
    """``flops``, ``bytes accessed`` and ``transcendentals`` of a compiled program, from XLA's cost
    analysis (a dict in recent JAX, a list of one dict per program in older releases)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        if len(analysis) != 1:
            raise ValueError(f"expected the cost analysis of one program; got {len(analysis)}")
        analysis = analysis[0]
    if not analysis:
        raise ValueError("this backend gave no cost analysis")
    return {k: float(analysis.get(k, 0.0)) for k in ("flops", "bytes accessed", "transcendentals")}


def peak_flops(n: int = 2048, repeats: int = 5) -> float:
    """Measured float32 flop/s of one ``n×n`` matrix product (``2n³`` flops), median of ``repeats``."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    matmul = jax.jit(lambda x, y: x @ y)
    t = time_per_call(matmul, a, a, repeats=repeats, name="matmul")
    return 2 * n**3 / t.median


def peak_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Measured bytes/s of an in-place scaling of a ``mib`` MiB float32 array (read once, written
    once; the input is donated, so no new memory is touched), median of ``repeats``."""
    scale = jax.jit(lambda x: x * 1.0001, donate_argnums=0)
    box = [jnp.ones(mib * 2**20 // 4, jnp.float32)]

    def step():
        box[0] = scale(box[0])
        return box[0]

    t = time_per_call(step, repeats=repeats, name="scale")
    return 2 * box[0].nbytes / t.median


def roofline(flops: float, bytes_accessed: float, flops_per_s: float, bytes_per_s: float) -> dict[str, Any]:
    """The least time (s) a program with ``flops`` and ``bytes_accessed`` can take on a device with
    these peaks, which limit sets it, and its arithmetic intensity (flops per byte)."""
    if min(flops, bytes_accessed) < 0 or min(flops_per_s, bytes_per_s) <= 0:
        raise ValueError(f"need flops, bytes >= 0 and peaks > 0; got {flops}, {bytes_accessed}, "
                         f"{flops_per_s}, {bytes_per_s}")
    compute, memory = flops / flops_per_s, bytes_accessed / bytes_per_s
    return {"compute s": compute, "memory s": memory, "bound s": max(compute, memory),
            "limit": "compute" if compute >= memory else "memory",
            "intensity": flops / bytes_accessed if bytes_accessed else float("inf"),
            "ridge": flops_per_s / bytes_per_s}


def fraction_of_roofline(seconds: float, bound: dict[str, Any]) -> float:
    """How close a measured time is to its roofline bound: bound / measured (1 = at the roofline)."""
    if not np.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"measured seconds must be positive; got {seconds}")
    return bound["bound s"] / seconds
