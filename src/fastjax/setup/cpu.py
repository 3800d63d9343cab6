"""The host CPU as a measurement depends on it: its model, and the instruction set that XLA:CPU (and
oneDNN, where PyTorch is loaded) generate code for.

Float32 results and timings both change with the vector width: the same jitted program rounds
differently with AVX2 and AVX-512 code (``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` holds XLA to AVX2 on a
newer CPU, never above the CPU's own). ``python -m fastjax.setup.cpu`` prints the levels this machine
can sweep (tests/test_isa.py runs the numerical checks under each).
"""

from __future__ import annotations

import os
import platform
import sys

from fastjax.setup import workaround

# The values of XLA's --xla_cpu_max_isa this module knows (xla/debug_options_flags.cc lists more, finer
# AVX-512 and AMX levels), lowest first, each with the /proc/cpuinfo flag it needs.
XLA_ISAS = (("SSE4_2", "sse4_2"), ("AVX", "avx"), ("AVX2", "avx2"), ("AVX512", "avx512f"))
MAX_ISA_FLAG = "--xla_cpu_max_isa"


def model() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``, else ``platform.processor()``), or "unknown CPU"."""
    try:
        with open("/proc/cpuinfo", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_isas() -> tuple[str, ...]:
    """The ``--xla_cpu_max_isa`` levels of ``XLA_ISAS`` this CPU has, lowest first (empty off x86)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "i386"):
        return ()
    flags = set(workaround.instruction_set_flags() or ())
    return tuple(isa for isa, flag in XLA_ISAS if flag in flags)


def max_isa_setting(xla_flags: str | None = None) -> str | None:
    """The value of ``--xla_cpu_max_isa`` in ``xla_flags`` (default: this process's ``XLA_FLAGS``), or None."""
    xla_flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
    found = None
    for word in xla_flags.split():
        if word.startswith(MAX_ISA_FLAG + "="):
            found = word.split("=", 1)[1]  # the last one wins, as in XLA's flag parser
    return found


def xla_isa() -> str:
    """The instruction set XLA:CPU generates code for in this process, in words: the CPU's best level of
    ``XLA_ISAS`` (XLA may use finer extensions of it), or the ``--xla_cpu_max_isa`` cap when one is set."""
    own = machine_isas()
    best = own[-1] if own else platform.machine() or "unknown"
    cap = max_isa_setting()
    if cap is None:
        return best
    return f"{cap} (capped by {MAX_ISA_FLAG}; the CPU has {best})"


def onednn_isa() -> str | None:
    """The instruction set PyTorch's CPU kernels (oneDNN) use, where torch is already imported; else None
    (importing torch takes seconds, so a stamp never does it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):
        return None


def describe() -> str:
    """One line: the CPU model, the cores, and the instruction sets XLA (and oneDNN, when loaded) use."""
    text = f"{model()} ({os.cpu_count()} cores) · XLA:CPU code {xla_isa()}"
    torch_isa = onednn_isa()
    return text + (f" · PyTorch {torch_isa}" if torch_isa else "")


if __name__ == "__main__":
    print(describe())
    print("levels to sweep:", " ".join(machine_isas()) or "none (not an x86 CPU)")
