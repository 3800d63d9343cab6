"""The persistent compilation cache, measured in fresh processes (chapters/tools/02-compile-time).

``fresh_process(cache_dir, min_seconds)`` runs ``PROBE`` in a new Python process: it points JAX's persistent
cache at ``cache_dir`` (with ``jax_persistent_cache_min_compile_time_secs`` set to ``min_seconds``, or left at
its default for ``"default"``), compiles the PLN step and the ResNet floor step ahead of time, timing tracing
and compiling apart, notes whether JAX read each one from the cache (the ``/jax/compilation_cache/cache_hits``
event that ``compile_or_get_cached`` in jax/_src/compiler.py records through ``jax.monitoring``), and lists
the programs the cache folder holds at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

PROBE = r'''
import json, os, sys, time
import fastjax  # the CPU fix, before JAX starts
import jax
import jax.numpy as jnp
from flax import nnx
from fastjax import pln
from fastjax.pln import rungs as P
from fastjax.resnet import ladder as resnet_ladder, resnet_nnx, rungs as R
from fastjax.tools import timing

cache_dir, min_seconds = sys.argv[1], sys.argv[2]
jax.config.update("jax_compilation_cache_dir", cache_dir)
if min_seconds != "default":
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_seconds))

data = pln.to_jax(pln.load_oaks_counts())
params = pln.start(data)
state = P.PlnState(*params, pln.optimizer().init(params))
S = resnet_ladder.settings()
model = resnet_nnx.make_model(S.config, seed=0)
graphdef, treedef, leaves = R.floor_start(model, nnx.Optimizer(model, R.TX, wrt=nnx.Param))
x, y = (jnp.asarray(a[0]) for a in resnet_ladder.training_batches(1, S.batch))
hits = []  # JAX records an event for each program it reads back from the persistent cache
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
out = {}
for name, jitted, args in (("PLN step", jax.jit(P.namedtuple_step), (state, data)),
                           ("ResNet step", jax.jit(R.floor_step(graphdef, treedef)), (leaves, x, y))):
    before = len(hits)
    c = timing.compile_time(jitted, *args)
    timing.block(c.compiled(*args))
    out[name] = {"lower": c.lower_seconds, "compile": c.compile_seconds, "cache hit": len(hits) > before}
out["entries"] = sorted(f.split("-")[0] for f in os.listdir(cache_dir) if f.endswith("-cache"))
print(json.dumps(out))
'''


def fresh_process(cache_dir: str, min_seconds: float | str) -> dict[str, Any]:
    """Run ``PROBE`` in a new Python process (this interpreter); its JSON result: per step, trace + lower and
    compile seconds and whether it was a cache hit, and ``entries``, the programs in the cache folder."""
    done = subprocess.run([sys.executable, "-c", PROBE, cache_dir, str(min_seconds)], capture_output=True,
                          text=True, env=os.environ.copy(), timeout=600)
    if done.returncode:
        raise RuntimeError(f"the probe failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def runs_table(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run of ``fresh_process``: compile and trace + lower seconds of both steps, what was read
    from the cache, and the programs the cache held after it."""
    return [{"run": run, "PLN compile (s)": r["PLN step"]["compile"], "ResNet compile (s)": r["ResNet step"]["compile"],
             "PLN trace + lower (s)": r["PLN step"]["lower"], "ResNet trace + lower (s)": r["ResNet step"]["lower"],
             "read from the cache": ", ".join(k for k in ("PLN step", "ResNet step") if r[k]["cache hit"]) or "nothing",
             "programs in the cache after": ", ".join(sorted(set(r["entries"])))}
            for run, r in runs.items()]
