"""Part IV's helpers for one process with several devices: ask for simulated CPU devices, build a mesh
over the samples (or the batch), shard arrays along it, and count the collectives in compiled HLO.

``use_cpu_devices`` must run before JAX's backend starts (before the first JAX computation): XLA
creates the CPU devices once. ``import fastjax`` does not start the backend, so calling it right after
the imports works. Everything else here needs the backend and starts it.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from fastjax import checks

AXIS = "samples"  # the mesh axis the PLN samples (and the ResNet batch) are split over
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def backend_started() -> bool:
    """True once JAX has created its devices in this process (after the first JAX computation)."""
    if "jax" not in sys.modules:
        return False
    # private: JAX has no public "has the backend started" query
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def use_cpu_devices(n: int) -> int:
    """Ask JAX for ``n`` CPU devices (simulated: they share this machine's cores); returns ``n``.

    Must run before the first JAX computation. Afterwards it raises RuntimeError naming the fix, unless
    the CPU backend already has ``n`` devices. On a GPU machine the GPUs stay the default devices.
    """
    n = checks.check_positive_int(n, "n (CPU devices)")
    import jax

    if backend_started():
        have = len(jax.devices("cpu"))
        if have == n:
            return n
        raise RuntimeError(
            f"asked for {n} CPU devices, but JAX's backend already started with {have}: the device "
            "count is fixed when the first JAX computation runs. Restart the kernel (or the process) "
            f"and call fastjax.sharding.use_cpu_devices({n}) right after the imports, before any JAX "
            "computation.")
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
                         "For more CPU devices call fastjax.sharding.use_cpu_devices(n) before JAX starts.")
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.make_mesh((n_devices,), (axis,), axis_types=(kind,), devices=devices[:n_devices])


def shard_rows(tree: Any, mesh: Any, axis: str = AXIS) -> Any:
    """Every array of ``tree`` with a leading dimension put on ``mesh`` split by rows along ``axis``;
    scalars replicated. Refuses (ValueError) a row count that ``mesh`` cannot split evenly."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

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


def count_collectives(hlo: str) -> dict[str, int]:
    """How many instructions of each collective kind (all-reduce, all-gather, ...) the HLO text holds;
    an async pair (``all-reduce-start`` / ``-done``) counts once."""
    if not isinstance(hlo, str):
        raise TypeError(f"hlo must be the HLO text (compiled.as_text()); got {type(hlo).__name__}")
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in hlo.splitlines():
        _, eq, rhs = line.partition(" = ")  # "%name = shape op(operands), ..."
        for op in COLLECTIVES if eq else ():
            counts[op] += bool(re.match(rf"(?:\([^)]*\)|\S+)\s+{op}(?:-start)?\(", rhs.strip()))
    return counts
