"""Each core its share of the members: a program of many fits (``--bootstrap``, ``--ranks``) split across
the CPU's cores, one JAX device per core.

XLA:CPU runs one program's fits one after another on one core (``lax.map``), or batched (``vmap``), which
gains little when each member is a chain of small operations (chapters/many/02). JAX can present the CPU as
several devices (``jax_num_cpu_devices``); a program split over them with ``jax.shard_map`` runs each
device's share at the same time, each on a core. Each member's fit is the same program as before: the
results are those of one device, bit for bit (tests/test_fit_cores.py).

``use_every_core`` asks for one device per core that the members can use; it must run before JAX's first
operation, and the command (``cli``) calls it before it fits. In a process where JAX already runs (a
notebook, a test), the devices are what they are. ``over_cores`` splits a program's members over every
CPU device there is (a share each, the last member repeated to fill the last share): on one device, or on
a GPU, it is the program as written."""

from __future__ import annotations

import os
from typing import Any

MEMBERS = "members"  # the mesh axis of the split


def cores() -> int:
    """The cores this process may run on (its CPU affinity, where the system says; else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def devices_for(members: int, cores: int) -> int:
    """How many devices share ``members`` members on ``cores`` cores: as few as give each the fewest rounds
    (201 members on 2 cores: 2, 101 rounds each; 200 on 64: 50, 4 rounds each; 1 member: 1)."""
    rounds = -(-members // max(1, min(cores, members)))
    return -(-members // rounds)


def use_every_core(members: int) -> bool:
    """Ask JAX for one CPU device per core that ``members`` members can use (``devices_for``; Part V's
    ``sharding.use_cpu_devices``), before its backend starts: True when set. Left as is (False) for one
    member, where JAX already runs, or where the user chose the devices (``JAX_NUM_CPU_DEVICES``, or XLA's
    ``--xla_force_host_platform_device_count`` in ``XLA_FLAGS``)."""
    from fastjax.scale import sharding

    if "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        return False
    k = min(devices_for(members, cores()), sharding.MAX_CPU_DEVICES)
    if k == 1 or sharding.backend_started():  # its devices stay as they are
        return False
    sharding.use_cpu_devices(k)
    return True


def split() -> list[Any]:
    """The devices a program of many members runs on: every CPU device where JAX has several, else
    one (a GPU or TPU, or one CPU device: no split). Every one, not a subset: JAX loads a serialized program
    (the command's cache) onto all of a process's devices, and one compiled for fewer does not run there
    (jax 0.10.2 and 0.12: an error for one device, an abort for a subset of several)."""
    import jax

    devices = jax.local_devices()
    return devices if devices[0].platform == "cpu" else devices[:1]


def over_cores(function: Any, members: Any, *shared: Any) -> Any:
    """``function(members, *shared)``, with ``members`` (a pytree stacked on axis 0) split across the devices
    of ``split``: each device runs ``function`` on its share (the last member repeated to fill the last
    share), and the outputs, stacked on axis 0, are cut back to the members given. Call it inside
    ``jax.jit``; ``function``'s outputs must be stacked by member.

    Memory: where the members divide evenly, XLA gives each device its share of the input; where the last
    share is padded, it copies the whole input to every device (oaks samples on 2 devices: 0.43 MB each for
    8 members, 0.96 MB each, all of it, for 9). ``run.program_bytes`` counts that copy. Padding the members
    before the program, in NumPy, would keep the input split; not done yet."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec

    count = jax.tree.leaves(members)[0].shape[0]
    devices = split()
    k = len(devices)
    if k == 1:
        return function(members, *shared)
    pad = -count % k
    if pad:
        members = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[-1:], pad, axis=0)]), members)
    share = jax.shard_map(function, mesh=Mesh(np.array(devices), (MEMBERS,)),
                          in_specs=(PartitionSpec(MEMBERS),) + (PartitionSpec(),) * len(shared),
                          out_specs=PartitionSpec(MEMBERS), check_vma=False)
    return jax.tree.map(lambda a: a[:count], share(members, *shared))
