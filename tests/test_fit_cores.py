"""The command's programs of many fits split over the CPU's cores (``fastjax.pln.fit.cores``): one JAX device
per core, each running its share of the members, with the bits of the same program on one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import fastjax  # noqa: F401
import jax
import numpy as np
import pytest

from fastjax.pln.fit import cores as fitcores

RNG = np.random.default_rng(5)
COUNTS = RNG.poisson(np.exp(1.0 + RNG.normal(scale=0.5, size=(30, 6))))
MAXITER = 60  # a short fit: the split, not convergence


@pytest.mark.parametrize("members, cores, used", [
    (201, 2, 2),  # --bootstrap 200 on two cores: 101 rounds each
    (200, 64, 50),  # 4 rounds each on 64 cores: 50 devices give that without 56 padded refits
    (3, 8, 3),  # fewer members than cores: one each
    (10, 4, 4),  # 3 rounds each: the last device has one padded member
    (1, 8, 1),  # one member: no split
    (201, 1, 1),
])
def test_the_command_asks_for_the_devices_that_give_the_fewest_rounds(members, cores, used):
    assert fitcores.devices_for(members, cores) == used
    assert -(-members // used) == -(-members // min(cores, members))  # as few rounds as the cores allow


@pytest.mark.parametrize("platform, devices, used", [("cpu", 4, 4), ("cpu", 1, 1), ("gpu", 4, 1)])
def test_a_program_splits_over_every_cpu_device_or_none(monkeypatch, platform, devices, used):
    """Every CPU device, never a subset: a cached program must run on all of a process's devices."""
    fake = [SimpleNamespace(platform=platform, id=i) for i in range(devices)]
    monkeypatch.setattr(jax, "local_devices", lambda: fake)
    assert fitcores.split() == fake[:used]


def run_json(tmp_path, *args, devices=None, cache=None):
    env = dict(os.environ)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    if devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(devices)
    path = tmp_path / "counts.csv"
    np.savetxt(path, COUNTS, delimiter=",", fmt="%d")
    proc = subprocess.run([sys.executable, "-m", "fastjax.pln.fit", str(path), *args, "--maxiter", str(MAXITER),
                           *(("--cache", str(cache)) if cache else ("--no-cache",)), "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("mode, outputs", [
    # 5 members on 2 devices (one padded): the float32 refits, then their convergence, each split
    (("--bootstrap", "4", "--converge"), ("B", "low", "high", "iterations", "converged", "converge_iterations")),
    # 3 members (one padded): the collection, then its convergence
    (("--ranks", "1-3", "--converge"), ("ELBO", "BIC", "ICL", "iterations", "converged", "converge_iterations")),
])
def test_the_members_split_over_two_cores_give_the_bits_of_one(tmp_path, mode, outputs):
    one = run_json(tmp_path, *mode, devices=1)
    two = run_json(tmp_path, *mode, devices=2, cache=tmp_path / "cache")
    again = run_json(tmp_path, *mode, devices=2, cache=tmp_path / "cache")  # both programs loaded, and run
    assert "cores at once" not in one["program"]
    assert two["program"].count("saved to the cache, on 2 cores at once") == 2, two["program"]
    assert again["program"].count("loaded from the cache, on 2 cores at once") == 2, again["program"]
    for key in outputs:
        assert two[key] == one[key] and again[key] == one[key], key


def in_fresh_python(code, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    environ.update(env)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=environ)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_the_command_asks_for_one_device_per_core_and_leaves_a_running_jax_alone():
    ask = ("import jax; from fastjax.pln.fit import cores; "
           "print(cores.use_every_core(MEMBERS), jax.device_count(), cores.cores())")
    took, count, there = in_fresh_python(ask.replace("MEMBERS", "201"))
    assert count == str(fitcores.devices_for(201, int(there))) and took == str(int(there) > 1)
    assert in_fresh_python(ask.replace("MEMBERS", "1"))[:2] == ["False", "1"]  # one member: one device
    assert in_fresh_python("import jax; jax.devices(); " + ask.replace("MEMBERS", "201").split("; ", 1)[1])[:2] == \
        ["False", "1"]
    assert in_fresh_python(ask.replace("MEMBERS", "201"), XLA_FLAGS="--xla_force_host_platform_device_count=3")[:2] == \
        ["False", "3"]
    assert in_fresh_python(ask.replace("MEMBERS", "201"), JAX_NUM_CPU_DEVICES="1")[:2] == ["False", "1"]


def test_a_plain_fit_stays_on_one_device(tmp_path):
    """The plain fit has one member: the command asks for no devices, and its program is not split."""
    assert "cores" not in run_json(tmp_path)["program"]


def test_the_command_called_in_a_process_that_goes_on_leaves_its_devices_alone(tmp_path):
    """``main`` in a notebook or a test changes no device of that process; only the command as a process
    (``run``) asks for one device per core."""
    path = tmp_path / "counts.csv"
    np.savetxt(path, COUNTS, delimiter=",", fmt="%d")
    code = ("import contextlib, io, jax; from fastjax.pln.fit import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    status = cli.main(['{path}', '--bootstrap', '3', '--maxiter', '5', '--no-cache'])\n"
            "print(status, jax.device_count())")
    assert in_fresh_python(code) == ["0", "1"]
