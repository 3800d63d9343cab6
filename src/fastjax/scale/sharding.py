"""Part V's helpers for one process with several devices: ask for simulated CPU devices, build a mesh
over the samples (or the batch), shard arrays along it, and count the collectives in compiled HLO
(the instructions, ``count_collectives``, or what one call executes, ``collectives_per_call``).
``fit_gaps`` and ``check_same_fit`` hold the rule by which a split PLN fit counts as the same fit.

``use_cpu_devices`` must run before JAX's backend starts (before the first JAX computation): XLA
creates the CPU devices once. ``import fastjax`` does not start the backend, so calling it right after
the imports works. Everything else here needs the backend and starts it.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from fastjax import checks
from fastjax.setup.workaround import backend_started  # True once JAX has created its devices

AXIS = "samples"  # the mesh axis the PLN samples (and the ResNet batch) are split over
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# The most simulated CPU devices use_cpu_devices asks for. They share this machine's cores; XLA makes
# each one at start-up. Measured on the book's 2-core CPU (jax 0.10.2, a fresh process up to its first
# computation): 1 device 217 MB peak, 1,024 devices 334 MB and about the same time; 4,096 devices 643 MB
# and 20 s more. A mesh for a lesson or a test needs far fewer; a typo (10**6) would stall the machine.
MAX_CPU_DEVICES = 1024


def use_cpu_devices(n: int) -> int:
    """Ask JAX for ``n`` CPU devices (simulated: they share this machine's cores); returns ``n``.

    Must run before the first JAX computation. Afterwards it raises RuntimeError naming the fix, unless
    the CPU backend already has ``n`` devices. On a GPU machine the GPUs stay the default devices.
    ``n`` above ``MAX_CPU_DEVICES`` is refused (ValueError). Sets ``PJRT_NPROC`` to ``2 * n`` unless it is
    set: XLA's CPU client then makes twice as many threads as devices (see the comment below).
    """
    n = checks.check_positive_int(n, "n (CPU devices)")
    if n > MAX_CPU_DEVICES:
        raise ValueError(f"n (CPU devices) must be at most {MAX_CPU_DEVICES}; got {n:,}. Simulated CPU devices "
                         "share this machine's cores and XLA creates every one when JAX starts (4,096 took "
                         "20 s and 640 MB here); a lesson's mesh needs a handful.")
    import jax

    if backend_started():
        have = len(jax.devices("cpu"))
        if have == n:
            return n
        raise RuntimeError(
            f"asked for {n} CPU devices, but JAX's backend already started with {have}: the device "
            "count is fixed when the first JAX computation runs. Restart the kernel (or the process) "
            f"and call fastjax.scale.sharding.use_cpu_devices({n}) right after the imports, before any JAX "
            "computation.")
    # XLA:CPU gives its client thread pool max(cores, devices) threads; PJRT_NPROC overrides the cores.
    # With exactly n threads for n devices, a program with an all-reduce sometimes never finished here:
    # XLA aborted it after 40 s, some devices never having reached it ("Expected 8 threads to join the
    # rendezvous"; which tasks held the threads was not found). Measured (tests/test_exercises_scale.py's checks, 2 cores, 2 busy
    # processes beside): 2 aborts in 9 processes with 8 threads, none in 14 with 2n threads.
    os.environ.setdefault("PJRT_NPROC", str(2 * n))
    jax.config.update("jax_num_cpu_devices", n)
    return n


def check_divisible(n_samples: int, n_devices: int, what: str = "samples") -> None:
    """Refuse a sample count that the devices cannot split evenly, naming both numbers and the fixes."""
    n_samples = checks.check_positive_int(n_samples, f"the number of {what}")
    n_devices = checks.check_positive_int(n_devices, "the number of devices")
    if n_samples % n_devices:
        divisors = [k for k in range(1, n_devices + 1) if n_samples % k == 0]
        keep = n_samples - n_samples % n_devices
        raise ValueError(
            f"{n_samples} {what} do not split evenly over {n_devices} devices ({n_samples} % {n_devices} = "
            f"{n_samples % n_devices}). Use a device count that divides {n_samples} (up to {n_devices}: "
            f"{divisors}), or keep the first {keep} {what}. Padding with made-up {what} would change "
            "the result.")


def sample_mesh(n_devices: int | None = None, explicit: bool = True, axis: str = AXIS) -> Any:
    """A 1-D mesh named ``axis`` over the first ``n_devices`` devices (all by default), with Explicit
    axis types (sharding part of each array's type) or Auto ones (the compiler propagates it)."""
    import jax
    from jax.sharding import AxisType

    devices = jax.devices()
    n_devices = len(devices) if n_devices is None else checks.check_positive_int(n_devices, "n_devices")
    if n_devices > len(devices):
        raise ValueError(f"n_devices must be at most the {len(devices)} devices JAX has; got {n_devices}. "
                         "For more CPU devices call fastjax.scale.sharding.use_cpu_devices(n) before JAX starts.")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh((n_devices,), (axis,), axis_types=(kind,), devices=devices[:n_devices])


def shard_rows(tree: Any, mesh: Any, axis: str = AXIS) -> Any:
    """Every array of ``tree`` with a leading dimension put on ``mesh`` split by rows along ``axis``;
    scalars replicated. Refuses (ValueError) a row count that ``mesh`` cannot split evenly."""
    import jax
    from jax.sharding import NamedSharding

    if axis not in mesh.shape:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh; its axes are {tuple(mesh.axis_names)}")
    k = mesh.shape[axis]

    def put(a: Any) -> Any:
        a = a if hasattr(a, "ndim") else np.asarray(a)
        if a.ndim == 0:
            return jax.device_put(a, NamedSharding(mesh, jax.P()))
        check_divisible(a.shape[0], k, "rows")
        return jax.device_put(a, NamedSharding(mesh, jax.P(axis)))

    return jax.tree.map(put, tree)


def replicate(tree: Any, mesh: Any) -> Any:
    """Every array of ``tree`` copied whole onto each device of ``mesh``."""
    import jax
    from jax.sharding import NamedSharding

    return jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, jax.P())), tree)


def _opcode(line: str) -> str | None:
    """The opcode of one HLO instruction line (``%name = shape opcode(operands), attributes``), or None.
    The shape is skipped whole: a tuple shape nests parentheses, a TPU layout holds ``T(8,128)``."""
    _, eq, rhs = line.partition(" = ")
    rhs = rhs.strip()
    if not eq or not rhs:
        return None
    if rhs.startswith("("):  # a tuple shape: up to its matching parenthesis
        depth = 0
        for end, ch in enumerate(rhs):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        rest = rhs[end + 1:]
    else:
        rest = rhs.split(" ", 1)[1] if " " in rhs else ""
    m = re.match(r"\s*([\w\-]+)\(", rest)
    return m.group(1) if m else None


def _collective(op: str | None) -> str | None:
    """The collective kind an opcode is (an async pair counts at its ``-start``), or None."""
    for kind in COLLECTIVES:
        if op in (kind, f"{kind}-start"):
            return kind
    return None


def _check_hlo(hlo: Any) -> None:
    if not isinstance(hlo, str):
        raise TypeError(f"hlo must be the HLO text (compiled.as_text()); got {type(hlo).__name__}")


def count_collectives(hlo: str) -> dict[str, int]:
    """How many *instructions* of each collective kind (all-reduce, all-gather, ...) the HLO text holds,
    wherever they sit; an async pair (``all-reduce-start`` / ``-done``) counts once. An instruction in
    a loop's body runs once per trip: ``collectives_per_call`` counts executions."""
    _check_hlo(hlo)
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo.splitlines():
        kind = _collective(_opcode(line))
        if kind:
            counts[kind] += 1
    return counts


def collectives_per_call(hlo: str) -> dict[str, int]:
    """How many collectives of each kind one call of a compiled program *executes*: each computation's
    collectives times how often it runs, from ENTRY down (a ``while`` loop's body its
    ``known_trip_count`` times, its condition once more; nested loops multiply; called and fused
    computations once per call of them). Raises ValueError where the text does not tell: a loop whose
    trip count XLA does not know, or a collective inside a branch of a ``conditional``."""
    from fastjax.tools.profiling import computations

    _check_hlo(hlo)
    comps = computations(hlo)
    entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, flags=re.M)
    if entry is None:
        raise ValueError("hlo has no ENTRY computation: pass the whole module's text (compiled.as_text())")
    memo: dict[str, dict[str, int]] = {}

    def add(into: dict[str, int], counts: dict[str, int], times: int) -> None:
        for kind, k in counts.items():
            into[kind] += k * times

    def executed(name: str) -> dict[str, int]:
        if name not in memo:
            memo[name] = dict.fromkeys(COLLECTIVES, 0)  # a computation calling itself adds nothing
            out = dict.fromkeys(COLLECTIVES, 0)
            for line in comps.get(name, []):
                op = _opcode(line)
                kind = _collective(op)
                if kind:
                    out[kind] += 1
                if op == "while":
                    body = re.search(r"\bbody=%?([\w.\-]+)", line).group(1)
                    cond = re.search(r"\bcondition=%?([\w.\-]+)", line).group(1)
                    trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
                    inner = executed(body)
                    if trips is None:
                        if any(inner.values()) or any(executed(cond).values()):
                            raise ValueError(f"a while loop ({line.split('=')[0].strip()}) holds collectives "
                                             "but XLA does not know its trip count: executions cannot be counted "
                                             "from the text")
                        continue
                    add(out, inner, int(trips.group(1)))
                    add(out, executed(cond), int(trips.group(1)) + 1)
                elif op == "conditional":
                    group = re.search(r"branch_computations=\{([^}]*)\}", line)
                    branches = re.findall(r"%?([\w.\-]+)", group.group(1)) if group else []
                    branches += re.findall(r"\b(?:true|false)_computation=%?([\w.\-]+)", line)
                    if any(any(executed(b).values()) for b in branches):
                        raise ValueError("a conditional branch holds collectives: how often it runs is not in the text")
                else:
                    for callee in re.findall(r"\b(?:calls|to_apply)=%?([\w.\-]+)", line):
                        add(out, executed(callee), 1)
            memo[name] = out
        return memo[name]

    return executed(entry.group(1))


def fit_gaps(fit: Any, ref: Any) -> dict[str, float]:
    """How far a PLN fit ``(M, S, ELBOs)`` is from a reference fit of the same data and iterations:
    relative gap of the first and of the last ELBO, median and largest ``|ΔM|`` and ``|ΔS|``."""
    (m, s, e), (m0, s0, e0) = ([np.asarray(a, np.float64) for a in f] for f in (fit, ref))
    if m.shape != m0.shape or s.shape != s0.shape or e.shape != e0.shape:
        raise ValueError(f"the fits differ in shape: M {m.shape} vs {m0.shape}, S {s.shape} vs {s0.shape}, "
                         f"ELBOs {e.shape} vs {e0.shape}")
    dm, ds = np.abs(m - m0), np.abs(s - s0)
    return {"first": float(abs(e[0] - e0[0]) / abs(e0[0])), "final": float(abs(e[-1] - e0[-1]) / abs(e0[-1])),
            "m": float(np.median(dm)), "s": float(np.median(ds)), "m_max": float(dm.max()), "s_max": float(ds.max())}


def check_same_fit(fit: Any, ref32: Any, ref64: Any, *,
                   final_gap: float) -> tuple[dict[str, float], dict[str, float]]:
    """Assert that ``fit`` (``(M, S, ELBOs)``, float32, its sums over samples split) is the single-process
    float32 fit ``ref32`` up to float32 rounding, with the float32-to-float64 gap (``ref64``) as yardstick.
    Returns (gaps of ``fit`` to ``ref32``, gaps of ``ref32`` to ``ref64``); raises AssertionError naming
    the gap that is too large.

    - First ELBO (one evaluation at the same start, only the order of the float32 sums differs): a few
      float32 epsilons (6e-8) relative; 1e-6 is ample.
    - After the fit, Rprop steps by the sign of each gradient entry, so a rounding change flips an entry's
      step once its gradient nears zero and its path parts. Median ``|ΔM|`` and ``|ΔS|`` must be within 3×
      the float32-to-float64 medians (plus 1e-6); measured ratios 0.9-1.15 (oaks data, 2 and 4 processes,
      jax 0.10.2 and 0.12). The final ELBO must be within ``final_gap`` (relative; the book passes
      ``pln.TARGET_GAP``, 0.05 %, what it calls the same fit). Not a multiple of the float32-to-float64
      final gap: that one number can be tiny by chance (5.6e-8 in one run, where the split fit ended
      7.5e-6 away and its median |ΔM| was 1.06× the yardstick's).
    """
    got, yard = fit_gaps(fit, ref32), fit_gaps(ref32, ref64)
    limits = {"first": 1e-6, "final": final_gap, "m": 3 * yard["m"] + 1e-6, "s": 3 * yard["s"] + 1e-6}
    for key, limit in limits.items():
        if not got[key] <= limit:  # raised, not asserted: a bare assert vanishes under python -O
            raise AssertionError(f"{key}: the split fit is {got[key]:.2e} from the float32 fit, more than the "
                                 f"{limit:.2e} allowed (float32 vs float64: {yard[key]:.2e})")
    return got, yard
