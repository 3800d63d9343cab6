"""Reading what the profiler and the compiler report, and a roofline against measured peaks.

- ``computations`` / ``loop_computations`` / ``instructions``: the one HLO parser of the book: a
  compiled program's text split into its computations, those that run inside a ``while`` loop, and
  each instruction's opcode, place and convolution layout; ``array_types``: the array each
  instruction makes and the arrays it reads.
- ``find_trace`` / ``read_trace``: the timed events of a ``jax.profiler.trace`` run (the gzipped
  Chrome/Perfetto JSON it writes), in µs.
- ``top_ops``: those events joined with a compiled program's HLO text: total ms per HLO instruction;
  ``traced_ops`` traces one call of a compiled program and returns them; ``shares_by_kind`` groups them.
- ``fusions`` / ``unfused`` / ``fusion_summary``: what XLA fused in a compiled program, read from
  ``compiled.as_text()``;
  ``fusion_bytes``: what each of its fusions reads from and writes to memory.
- ``cost``: flops, bytes and transcendentals of a compiled program: XLA's cost analysis (``xla_cost``:
  one dict on every JAX version; older ones return a list) with its LAPACK calls counted in. XLA does
  not know what a ``custom-call`` computes and counts each as -1 flop and -1 byte; ``library_calls`` /
  ``library_cost`` count the LAPACK ones of a CPU program (Cholesky, LU, triangular solves) from their
  shapes. Other custom calls (on a GPU: cuSOLVER's) stay as XLA counts them.
- ``jax_log``: what JAX logs inside a block (``jax.log_compiles``, ``jax.explain_cache_misses``),
  collected in a buffer instead of printed.
- ``peak_flops`` / ``peak_bandwidth`` / ``roofline``: the device's measured peaks and the least time
  a program with given flops and bytes can take on it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from fastjax.tools.timing import block, time_per_call

# Instructions that compute nothing (they name, reshape in place, or bundle values): left out of counts.
BOOKKEEPING = {"parameter", "constant", "bitcast", "tuple", "get-tuple-element"}


@contextlib.contextmanager
def jax_log() -> Iterator[io.StringIO]:
    """Collect what JAX logs (the ``jax`` logger: compilations, cache-miss explanations) inside the
    block in a StringIO, instead of printing it."""
    buffer, logger = io.StringIO(), logging.getLogger("jax")
    handler, propagate = logging.StreamHandler(buffer), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


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
    start ``ts`` and duration ``dur`` in µs, and ``args`` (on XLA:CPU an HLO instruction's event names its
    ``hlo_module``, ``hlo_op`` and ``run_id``), ordered by start."""
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
               "ts": float(e["ts"]), "dur": float(e["dur"]), "args": e.get("args") or {}}
              for e in raw if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]
    if not events:
        raise ValueError(f"{path} holds no timed events (\"ph\": \"X\" with a \"dur\"): "
                         "was anything run inside the jax.profiler.trace block?")
    return sorted(events, key=lambda e: e["ts"])


def computations(hlo: str) -> dict[str, list[str]]:
    """The instruction lines of each computation of an HLO module's text, by name ('ENTRY' too)."""
    comps: dict[str, list[str]] = {}
    cur = None
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if m:
            cur = m.group(1)
            comps[cur] = []
        elif line.strip() == "}":
            cur = None
        elif cur:
            comps[cur].append(line)
    return comps


def loop_computations(hlo: str) -> set[str]:
    """Names of the computations that run inside a ``while`` loop (bodies and what they call)."""
    comps = computations(hlo)
    calls = {c: set(re.findall(r"(?:calls|body|condition|to_apply)=%?([\w.\-]+)", "\n".join(ls)))
             for c, ls in comps.items()}
    inside, todo = set(), re.findall(r"body=%?([\w.\-]+)", hlo)
    while todo:
        c = todo.pop()
        if c not in inside:
            inside.add(c)
            todo += list(calls.get(c, ()))
    return inside


def instructions(hlo: str) -> dict[str, dict[str, Any]]:
    """Each instruction of an optimised HLO module: its opcode, whether it runs inside a loop, and
    for convolutions their ``dim_labels`` (layout). A fusion wrapping one convolution (newer
    XLA:CPU names them ``wrapped_convolution``) counts as that convolution, with ``fused`` set."""
    comps, inside, out = computations(hlo), loop_computations(hlo), {}
    fusion_bodies = set(re.findall(r" fusion\(.*?calls=%?([\w.\-]+)", hlo))
    for comp, lines in comps.items():
        for line in lines:
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = .*? ([\w\-]+)\(", line)
            if not m:
                continue
            op, labels = m.group(2), re.search(r"dim_labels=([^,\s]+)", line)
            called = re.search(r"calls=%?([\w.\-]+)", line)
            body = comps.get(called.group(1), []) if op == "fusion" and called else []
            fused = [ln for ln in body if " convolution(" in ln]
            if fused:
                op, labels = "convolution", re.search(r"dim_labels=([^,\s]+)", fused[0])
            out[m.group(1)] = {"op": op, "in_loop": comp in inside, "fused": bool(fused),
                               "in_fusion": comp in fusion_bodies, "labels": labels.group(1) if labels else None}
    return out


# One instruction that returns one array: its name and result type (``f32[2320,2320]``, layout left out).
_ARRAY_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ([a-z]+\d*\[[\d,]*\])")


def array_types(hlo: str) -> dict[str, tuple[str, list[str]]]:
    """Each instruction of a compiled program's text that returns one array, by name: its result type
    (``f32[2320,2320]``, without the layout) and the types of the operands it reads, in order ("?" for an
    operand that returns a tuple). Instructions that return a tuple (some library calls) are left out."""
    lines = {m.group(1): (m.group(2), line) for line in hlo.splitlines() if (m := _ARRAY_DEFINITION.match(line))}
    out = {}
    for name, (result, line) in lines.items():
        call = line.split(" = ", 1)[1]
        operands = re.findall(r"%([\w.\-]+)", call.split("(", 1)[1].split(")", 1)[0]) if "(" in call else []
        out[name] = (result, [lines[o][0] if o in lines else "?" for o in operands])
    return out


def _kernels(hlo: str) -> dict[str, list[str]]:
    """The computations whose instructions run as kernels: the entry, loop bodies and conditions,
    called computations; not fusion bodies, nor the reducers and comparators given to ``to_apply``."""
    comps = computations(hlo)
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
    comps = computations(hlo)
    return [{"name": name, "kind": kind, "ops": _opcodes(comps.get(called, []))}
            for name, kind, called in _fusion_lines(hlo)]


_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def _array_bytes(types: str) -> int:
    """Bytes of the arrays named in an HLO type text such as ``f32[116,114]{1,0}`` or a tuple of them."""
    return sum(_BYTES[t] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
               for t, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", types) if t in _BYTES)


def fusion_bytes(hlo: str) -> list[dict[str, Any]]:
    """Each fusion that runs as a kernel in a compiled program, with the bytes it reads (its fused
    computation's parameters) and writes (its result): one pass over memory each, if nothing stays in
    cache. The sum over fusions is the fused part of the cost analysis' "bytes accessed"."""
    if "HloModule" not in hlo:
        raise ValueError("expected the text of a compiled HLO module (compiled.as_text()); it has no 'HloModule'")
    comps = computations(hlo)
    out = []
    for lines in _kernels(hlo).values():
        for line in lines:
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) fusion\(.*?kind=(k\w+).*?calls=%?([\w.\-]+)", line)
            if not m:
                continue
            name, result, kind, called = m.groups()
            params = [ln for ln in comps.get(called, []) if re.search(r" parameter\(\d+\)", ln)]
            read = sum(_array_bytes(ln.split("=", 1)[1].split(" parameter(")[0]) for ln in params)
            out.append({"name": name, "kind": kind, "read bytes": read, "written bytes": _array_bytes(result)})
    return out


def unfused(hlo: str) -> Counter:
    """Operations of a compiled program that run on their own, outside any fusion, counted by opcode
    (bookkeeping such as parameters, constants and bitcasts left out; loops and calls included)."""
    if "HloModule" not in hlo:
        raise ValueError("expected the text of a compiled HLO module (compiled.as_text()); it has no 'HloModule'")
    return Counter(op for lines in _kernels(hlo).values() for op in _opcodes(lines) if op != "fusion")


def fusion_summary(hlo: str, lowered: str) -> dict[str, Any]:
    """One table row on what XLA fused in a compiled program (``hlo``: ``compiled.as_text()``; ``lowered``:
    the StableHLO text of ``jax.jit(f).lower(...).as_text()``): StableHLO ops, fusions by kind, fusions of
    two or more ops, ops fused in all, and the ops left alone."""
    fused, alone = fusions(hlo), unfused(hlo)
    kinds = Counter(f["kind"] for f in fused)
    return {"StableHLO ops": sum(1 for line in lowered.splitlines() if " = stablehlo." in line),
            "fusions": len(fused), "kinds": ", ".join(f"{k} {v}" for k, v in kinds.most_common()),
            "fusions of ≥ 2 ops": sum(len(f["ops"]) >= 2 for f in fused),
            "ops fused in all": sum(len(f["ops"]) for f in fused),
            "ops left alone": ", ".join(f"{op} {k}" for op, k in alone.most_common())}

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


def traced_ops(compiled: Any, *args: Any) -> list[dict[str, Any]]:
    """:func:`top_ops` of one call of an AOT-compiled program on ``args`` (called once before, untraced)."""
    import tempfile

    block(compiled(*args))
    folder = tempfile.mkdtemp()
    with jax.profiler.trace(folder):
        block(compiled(*args))
    return top_ops(read_trace(find_trace(folder)), compiled.as_text())


def op_kind(row: dict[str, Any]) -> str:
    """What a row of :func:`top_ops` is: a library call (LAPACK on CPU), a matrix product or convolution
    (XLA's own ``dot``, or a product handed to a library: ``ynn_fusion`` on CPU), a layout copy, or the
    rest (elementwise work and reductions, fused)."""
    if row["op"] == "custom-call":
        return "library calls"
    if row["op"] in ("dot", "convolution") or row["op name"].startswith("ynn_fusion"):
        return "matrix products"
    if row["op"] in ("copy", "transpose"):
        return "copies and transposes"
    return "elementwise and reductions"


def shares_by_kind(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The share of a program's op time in each :func:`op_kind`, largest first."""
    out: dict[str, float] = {}
    for r in rows:
        out[op_kind(r)] = out.get(op_kind(r), 0.0) + r["share"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def xla_cost(compiled: Any) -> dict[str, float]:
    """``flops``, ``bytes accessed`` and ``transcendentals`` as XLA's cost analysis reports them (a dict in
    recent JAX, a list of one dict per program in older releases): each ``custom-call`` (a library call)
    counted as -1 flop and -1 byte, since XLA does not know what it computes. ``cost`` counts them in."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        if len(analysis) != 1:
            raise ValueError(f"expected the cost analysis of one program; got {len(analysis)}")
        analysis = analysis[0]
    if not analysis:
        raise ValueError("this backend gave no cost analysis")
    return {k: float(analysis.get(k, 0.0)) for k in ("flops", "bytes accessed", "transcendentals")}


# The LAPACK kernels jaxlib calls on CPU (custom_call_target="lapack_<s|d|c|z><name>_ffi") and their flops,
# from the shapes of their operands: Cholesky n³/3, LU mn² − n³/3 (2n³/3 square), a triangular solve
# m²·k for an m×m triangle and k right-hand sides (the textbook counts, as in LAPACK's dopla/dopbl3).
_LAPACK_TARGET = re.compile(r'custom_call_target="(lapack_[sdcz](\w+?)(?:_ffi)?)"')


def _instruction_types(lines: list[str]) -> dict[str, str]:
    """Name -> result type text (``f32[116,114]{1,0}``, or a tuple) of each instruction of a computation."""
    out = {}
    for line in lines:
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) [\w\-]+\(", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def _dims(types: str) -> list[list[int]]:
    """The dimensions of each array in an HLO type text, in order."""
    return [[int(d) for d in dims.split(",") if d] for _, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", types)]


def _lapack_flops(kernel: str, operands: list[list[int]]) -> float | None:
    """Textbook flops of one LAPACK call from its operands' dimensions (None: a kernel not in the table)."""
    if kernel == "potrf":
        n = operands[0][-1]
        return float(np.prod(operands[0][:-2] or [1])) * n**3 / 3
    if kernel == "getrf":
        rows, cols = operands[0][-2:]
        big, small = max(rows, cols), min(rows, cols)
        return float(np.prod(operands[0][:-2] or [1])) * (big * small**2 - small**3 / 3)
    if kernel == "trsm":  # operands: the m×m triangle, then the right-hand sides (m×k or k×m, batched)
        return float(operands[0][-1]) * float(np.prod(operands[1]))
    return None


def library_calls(hlo: str) -> list[dict[str, Any]]:
    """Each LAPACK call (``custom-call`` to ``lapack_*``) of a compiled CPU program's text: its name,
    target, kernel (``potrf``, ``getrf``, ``trsm``, ...), operands' and result's dimensions, whether it
    runs in a loop, its textbook flops (None for a kernel without a formula here) and the bytes it reads
    (its operands) and writes (its result), XLA's convention for any other instruction."""
    if "HloModule" not in hlo:
        raise ValueError("expected the text of a compiled HLO module (compiled.as_text()); it has no 'HloModule'")
    inside, out = loop_computations(hlo), []
    for comp, lines in _kernels(hlo).items():
        types = _instruction_types(lines)
        for line in lines:
            target = _LAPACK_TARGET.search(line)
            m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (.*?) custom-call\((.*?)\), custom_call_target", line)
            if not (target and m):
                continue
            name, result, operand_text = m.groups()
            constraints = re.search(r"operand_layout_constraints=\{(.*?)\}\}", line)
            if _dims(operand_text):  # operands printed with their types
                operand_types = operand_text
            elif constraints:
                operand_types = constraints.group(1)
            else:  # operands by name: their types are where they are defined
                operand_types = ", ".join(types.get(o.strip().lstrip("%"), "") for o in operand_text.split(","))
            operands = _dims(operand_types)
            out.append({"name": name, "target": target.group(1), "kernel": target.group(2),
                        "operands": operands, "result": _dims(result), "in_loop": comp in inside,
                        "flops": _lapack_flops(target.group(2), operands),
                        "read bytes": _array_bytes(operand_types), "written bytes": _array_bytes(result)})
    return out


def library_cost(hlo: str) -> dict[str, Any]:
    """The LAPACK calls of a compiled CPU program (``library_calls``) added up: ``flops``, ``bytes
    accessed`` (read and written), ``calls``, and ``uncounted``: the targets whose flops have no formula
    here (their bytes are counted). A call inside a loop counts once, as ``cost_analysis`` counts a loop body."""
    calls = library_calls(hlo)
    return {"flops": sum(c["flops"] for c in calls if c["flops"] is not None),
            "bytes accessed": float(sum(c["read bytes"] + c["written bytes"] for c in calls)),
            "calls": len(calls), "uncounted": sorted({c["target"] for c in calls if c["flops"] is None})}


def cost(compiled: Any) -> dict[str, float]:
    """``flops``, ``bytes accessed`` and ``transcendentals`` of a compiled program: XLA's cost analysis
    (``xla_cost``) with the LAPACK calls counted in (``library_cost``: their textbook flops, the bytes of
    their operands and results) in place of the -1 flop and -1 byte that XLA gives each. Also ``library
    flops``, ``library bytes`` and ``library calls``: the part that comes from those calls. Every other
    instruction is XLA's count; a loop body counts once."""
    xla = xla_cost(compiled)
    lib = library_cost(compiled.as_text())
    if lib["uncounted"]:
        raise ValueError(f"no flop count for the library calls {lib['uncounted']}: add their formula to "
                         "profiling._lapack_flops before building a roofline on this program")
    return {"flops": xla["flops"] + lib["calls"] + lib["flops"],  # + calls: XLA's -1 per call taken back
            "bytes accessed": xla["bytes accessed"] + lib["calls"] + lib["bytes accessed"],
            "transcendentals": xla["transcendentals"],
            "library flops": lib["flops"], "library bytes": lib["bytes accessed"], "library calls": float(lib["calls"])}


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
