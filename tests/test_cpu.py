"""fastjax.setup.cpu: the CPU model and the instruction set XLA generates code for, as the stamp shows them."""

from __future__ import annotations

import subprocess
import sys

from fastjax.setup import cpu
from fastjax.tools import timing


def test_max_isa_setting_reads_the_last_flag():
    assert cpu.max_isa_setting("") is None
    assert cpu.max_isa_setting("--xla_cpu_max_isa=AVX2") == "AVX2"
    assert cpu.max_isa_setting("--a=1 --xla_cpu_max_isa=AVX --xla_cpu_max_isa=SSE4_2 --b") == "SSE4_2"


def test_machine_isas_are_known_levels_lowest_first():
    known = [isa for isa, _ in cpu.XLA_ISAS]
    own = list(cpu.machine_isas())
    assert own == [isa for isa in known if isa in own]  # in XLA's order, no unknown names
    assert own[:1] in ([], ["SSE4_2"])  # a level implies the ones below it on every x86-64 CPU we know


def test_the_stamp_names_the_cpu_model_and_instruction_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX")
    s = timing.stamp()
    assert s["cpu_model"] == cpu.model() and s["cpu_model"]
    assert s["xla_isa"].startswith("AVX (capped")
    text = timing.stamp_text(s)
    assert cpu.model() in text and "XLA:CPU code AVX (capped" in text


def test_the_command_prints_the_levels_to_sweep():
    out = subprocess.run([sys.executable, "-m", "fastjax.setup.cpu"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "XLA:CPU code" in out.stdout and "levels to sweep:" in out.stdout
