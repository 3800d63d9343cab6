"""The numerical checks hold whatever instruction set XLA:CPU generates code for.

A float32 result changes with the vector width (AVX2 and AVX-512 code sum in other orders), so a
tolerance tuned on one machine can fail on a newer one. The suite runs at this machine's own level;
this test runs every test marked ``isa`` (numerical comparisons of differently compiled programs, and
the premises their derived bounds rest on: fastjax.resnet.ladder's ROUNDING_GROWTH) again in a fresh
process for each lower level of ``--xla_cpu_max_isa`` this CPU has. It cannot reach above the
machine's own level: there the derived bounds are the guard.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from fastjax.setup import cpu

LEVELS = cpu.machine_isas()[:-1]  # the machine's own level is the ordinary run's


def _marked_files() -> list[str]:
    """The test files that hold a test marked ``isa``."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.isa" in p.read_text() and p.name != "test_isa.py")


def test_some_tests_are_marked_isa_and_the_levels_are_known():
    assert len(_marked_files()) >= 3, _marked_files()
    assert [isa for isa, _ in cpu.XLA_ISAS] == ["SSE4_2", "AVX", "AVX2", "AVX512"]


@pytest.mark.pinned  # one leg is enough: the instruction set, not the JAX version, is what changes here
@pytest.mark.skipif(not LEVELS, reason="no lower --xla_cpu_max_isa level on this CPU (not x86, or SSE4.2 only)")
@pytest.mark.parametrize("isa", LEVELS or ["none"])
def test_numerical_checks_hold_under_a_lower_instruction_set(isa):
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(cpu.MAX_ISA_FLAG + "=")]
    env = {**os.environ, "XLA_FLAGS": " ".join([*flags, f"{cpu.MAX_ISA_FLAG}={isa}"]), "FASTJAX_SIZE": "quick"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "isa",
           *_marked_files()]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"under {cpu.MAX_ISA_FLAG}={isa}:\n{tail}"
    assert re.search(r"\d+ passed", done.stdout), tail
