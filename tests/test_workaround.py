"""The jaxlib CPU miscompile and its workaround, each in a fresh process (XLA reads flags once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fastjax import _workaround

PROBE = r"""
import json, sys
import fastjax
import jax, jax.numpy as jnp, numpy as np
y = np.random.default_rng(0).uniform(0.1, 20.0, size=(116, 114)).astype(np.float32)
stirling = lambda y, xp: xp.sum(y * xp.log(y) - y + 0.5 * xp.log(2 * np.pi * y))
jitted = float(jax.jit(lambda y: stirling(y, jnp))(y))
exact = float(stirling(y.astype(np.float64), np))
print(json.dumps({"rel": abs(jitted - exact) / abs(exact), "active": fastjax.workaround_active(),
                  "device": jax.devices()[0].platform}))
"""


def probe(disable: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if disable:
        env[_workaround.DISABLE_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_jitted_reduction_matches_float64_numpy():
    result = probe(disable=False)
    assert result["rel"] < 1e-6, f"jitted float32 sum is off by {result['rel']:.2e} relative"
    assert result["active"] == _workaround.needs_workaround()


def test_the_check_fails_without_the_workaround():
    """Proof that the test above can fail: the same probe without the flag, on an affected jaxlib."""
    if not _workaround.needs_workaround():
        pytest.skip(f"jaxlib {_workaround.jaxlib_version()} is not known to need the workaround")
    result = probe(disable=True)
    assert not result["active"]
    assert result["rel"] > 1e-4, "the miscompile no longer shows: the workaround may be obsolete"


def test_needs_workaround_by_version():
    assert _workaround.needs_workaround("0.10.2")
    assert not _workaround.needs_workaround("0.9.0")


def test_flag_is_added_once_and_keeps_other_flags(monkeypatch):
    monkeypatch.setattr(_workaround, "needs_workaround", lambda version=None: True)
    monkeypatch.setattr(_workaround, "_backend_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.delenv(_workaround.DISABLE_ENV, raising=False)
    assert _workaround.apply_cpu_workaround()
    assert _workaround.apply_cpu_workaround()
    flags = os.environ["XLA_FLAGS"].split()
    assert flags.count(_workaround.WORKAROUND_FLAG) == 1 and "--xla_dump_to=/tmp/x" in flags


def test_warns_when_jax_already_started(monkeypatch):
    monkeypatch.setattr(_workaround, "needs_workaround", lambda version=None: True)
    monkeypatch.setattr(_workaround, "_backend_started", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.delenv(_workaround.DISABLE_ENV, raising=False)
    with pytest.warns(RuntimeWarning, match="Restart the kernel"):
        assert not _workaround.apply_cpu_workaround()
