"""The first result: PLN fits raced as whole processes (``python script.py``), measured from outside.

Each contender is a script run in a new process; ``race`` runs them in turns, round after round, and
takes from the operating system each process's wall time, CPU time (user + system) and peak memory
(``os.wait4``, the per-child form of ``resource.getrusage(RUSAGE_CHILDREN)``, in a small launcher:
``LAUNCHER`` says why). pyPLNmodels' script and
the book's read the same data from one ``.npz`` file, fit to convergence by the same rule and print the
ELBO. ``phases`` and ``import_times`` say where a process's time goes. chapters/floor/04-first-result.md
shows the race; ``python -m fastjax.pln.bench --whole`` runs it from the command line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks, pln

# Each script stamps its stages (time.perf_counter) and prints them with its result as one JSON line;
# what the stamps do not cover (interpreter start-up and exit) is the wall time less their sum.
PYPLNMODELS = """\
import time
t = [("start", time.perf_counter())]
import contextlib, io, json, sys, warnings
import numpy as np
import torch
t.append(("import torch", time.perf_counter()))
with warnings.catch_warnings():  # pyPLNmodels imports pkg_resources, which announces its own deprecation
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    from pyPLNmodels import Pln
t.append(("import pyPLNmodels", time.perf_counter()))
with np.load(sys.argv[1]) as f:
    counts, offsets, covariates = f["counts"], f["offsets"], f["covariates"]
model = Pln(counts, offsets=offsets, exog=covariates, add_const=False)
t.append(("read the data, build the model", time.perf_counter()))
dynamo_before = "torch._dynamo" in sys.modules
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    model.fit(maxiter={maxiter}, tol={tol})
t.append(("fit (the first in a process)", time.perf_counter()))
elbos = model._elbo_criterion_monitor.elbo_list
print(json.dumps({{"elbo": float(elbos[-1]), "iterations": len(elbos),
                  "fit_imported_torch_dynamo": not dynamo_before and "torch._dynamo" in sys.modules,
                  "stages": [[name, b - a] for (_, a), (name, b) in zip(t, t[1:])]}}))
"""

# The book's script as a reader writes it after Part V, with Part V's fit; its stages written out
# (``trace``, ``lower``, ``compile``: what ``F.fit_fast(...)`` does on its first call, in that order).
# CACHE: the lines that set a persistent compilation cache, for the contenders that have one.
BOOK = """\
import time
t = [("start", time.perf_counter())]
import json, math, sys
import fastjax  # before jax: the CPU workaround
t.append(("import fastjax", time.perf_counter()))
import numpy as np
import jax
{cache}t.append(("import jax", time.perf_counter()))
from fastjax import pln
from fastjax.pln import floor as F
t.append(("import the fit's modules", time.perf_counter()))
with np.load(sys.argv[1]) as f:
    data = pln.check_pln_data(f["counts"], f["offsets"], f["covariates"])
t.append(("read and check the data", time.perf_counter()))
data = pln.to_jax(data)
args = (jax.block_until_ready(pln.start(data)), data, np.float32({tol}), np.float32(math.inf))
t.append(("start the backend; data to JAX, (M, S) at the start", time.perf_counter()))
traced = F.fit_fast.trace(*args, maxiter={maxiter})
t.append(("trace the fit", time.perf_counter()))
lowered = traced.lower()
t.append(("lower it", time.perf_counter()))
compiled = lowered.compile()
t.append(("compile it{cached}", time.perf_counter()))
(m, s), elbos, crit = jax.block_until_ready(compiled(*args))
pln.check_fit(elbos, crit)
t.append(("the fit itself", time.perf_counter()))
print(json.dumps({{"elbo": float(elbos[int(crit.count) - 1]), "iterations": int(crit.count),
                  "stages": [[name, b - a] for (_, a), (name, b) in zip(t, t[1:])]}}))
"""

PERSISTENT_CACHE = """\
jax.config.update("jax_compilation_cache_dir", sys.argv[2])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # default 1 s: small programs never kept
"""

# The fit exported once (``export_fit``): a new process deserializes it and calls it, with no tracing
# or lowering of the fit and without importing the fit's modules; XLA still compiles it, unless the
# persistent cache (CACHE) holds it.
EXPORTED = """\
import time
t = [("start", time.perf_counter())]
import json, sys
import fastjax  # before jax: the CPU workaround
t.append(("import fastjax", time.perf_counter()))
import numpy as np
import jax
{cache}from jax import export
t.append(("import jax", time.perf_counter()))
from fastjax import pln
from fastjax.pln.fit import register_for_export
register_for_export()  # the fit's pytrees (PlnData, Criterion) by name
with np.load(sys.argv[1]) as f:
    data = pln.check_pln_data(f["counts"], f["offsets"], f["covariates"])
args = (pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.float32(data.log_factorial)),
        np.float32({tol}), np.float32(np.inf))
t.append(("read and check the data", time.perf_counter()))
with open(sys.argv[3], "rb") as f:
    fit = export.deserialize(bytearray(f.read()))
t.append(("deserialize the exported fit", time.perf_counter()))
(m, s), elbos, crit = jax.block_until_ready(fit.call(*args))
pln.check_fit(elbos, crit)
t.append(("call it: compile{cached} and fit", time.perf_counter()))
print(json.dumps({{"elbo": float(elbos[int(crit.count) - 1]), "iterations": int(crit.count),
                  "stages": [[name, b - a] for (_, a), (name, b) in zip(t, t[1:])]}}))
"""

JAX_FLOOR = """\
import json
import jax, jax.numpy as jnp
print(json.dumps({"one_op": float(jnp.ones(3).sum())}))
"""

# The floor of a JAX process that runs LAPACK on CPU, as the fit does (Cholesky, triangular solves): jaxlib
# takes its CPU LAPACK kernels from SciPy, and loads them (importing scipy.linalg) when a process first
# lowers a program that calls one.
JAX_LAPACK_FLOOR = """\
import json
import jax, jax.numpy as jnp
import scipy.linalg.cython_blas, scipy.linalg.cython_lapack  # what jaxlib loads for its CPU LAPACK kernels
print(json.dumps({"one_op": float(jnp.ones(3).sum())}))
"""

NUMPY_FLOOR = """\
import json
import numpy as np
print(json.dumps({"one_op": float(np.ones(3).sum())}))
"""


@dataclass
class Contender:
    """A script to race: its ``kind`` ("pyplnmodels", "book", "persistent", "exported", "exported+persistent",
    "command", "jax", "numpy"), whether each run starts with empty caches (``first``), and whether even
    fastjax's CPU probe is not cached (``first_ever``)."""

    name: str
    kind: str
    first: bool = False
    first_ever: bool = False
    compile_options: dict[str, Any] = field(default_factory=dict)

    @property
    def threads_env(self) -> str | None:
        """The environment variable that sets this script's compute threads: ``OMP_NUM_THREADS`` for
        pyPLNmodels (torch reads it when imported), ``PJRT_NPROC`` for a script that fits with JAX (XLA reads
        it when its backend starts); None for the floors, which compute nothing to speak of."""
        return {"pyplnmodels": "OMP_NUM_THREADS"}.get(self.kind, None if self.kind in ("jax", "jax+lapack", "numpy")
                                                      else "PJRT_NPROC")


def contenders(quick: bool = False) -> list[Contender]:
    """The race's contenders; ``quick``: fewer (pyPLNmodels, the book's script with no cache, the command's
    first and later runs and its first run with ``--quick-compile``, the JAX floor)."""
    out = [Contender("pyPLNmodels' script", "pyplnmodels"),
           Contender("book's script, no cache", "book"),
           Contender("book's script, persistent cache, first run", "persistent", first=True),
           Contender("book's script, persistent cache, later run", "persistent"),
           Contender("jax.export'ed fit, no cache", "exported"),
           Contender("jax.export'ed fit + persistent cache, later run", "exported+persistent"),
           Contender("the command, first run (nothing of the fit cached)", "command", first=True),
           Contender("the command, first run ever (fastjax's CPU probe too)", "command", first=True, first_ever=True),
           Contender("the command, later run", "command"),
           Contender("the command --quick-compile, first run", "command", first=True, compile_options={"quick": True}),
           Contender("the command --quick-compile, later run", "command", compile_options={"quick": True}),
           Contender("bare `import jax` + one op", "jax"),
           Contender("bare `import jax` + SciPy's LAPACK + one op", "jax+lapack"),
           Contender("bare `import numpy` + one op", "numpy")]
    if quick:
        out = [c for c in out if c.kind in ("pyplnmodels", "book", "command", "jax", "jax+lapack") and not c.first_ever
               and not (c.compile_options and not c.first)]
    return out


def write_data(folder: Path, repeat: int = 1) -> Path:
    """The oaks data stacked ``repeat`` times, intercept only, saved as ``folder/data.npz``."""
    data = pln.load_oaks_counts(checks.check_positive_int(repeat, "repeat"))
    path = Path(folder) / "data.npz"
    np.savez(path, counts=data.counts, offsets=data.offsets, covariates=data.covariates)
    return path


def export_fit(data_file: Path, out: Path, maxiter: int = pln.MAXITER) -> float:
    """Export ``fastjax.pln.fit.fit_program`` for the shapes of ``data_file`` (float32) with ``jax.export``
    and write it, serialized, to ``out``; run in a new process. Returns the bytes written."""
    script = f"""\
import sys, functools
import fastjax, jax, numpy as np
from jax import export
from fastjax import pln
from fastjax.pln import fit
fit.register_for_export()
with np.load(sys.argv[1]) as f:
    data = pln.check_pln_data(f["counts"], f["offsets"], f["covariates"])
args = (pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.float32(data.log_factorial)),
        np.float32(0), np.float32(0))
exported = export.export(jax.jit(functools.partial(fit.fit_program, maxiter={maxiter})))(*args)
open(sys.argv[2], "wb").write(exported.serialize())
"""
    subprocess.run([sys.executable, "-c", script, str(data_file), str(out)], check=True, capture_output=True, timeout=600)
    return float(Path(out).stat().st_size)


@dataclass
class Run:
    """One process: wall, CPU (user + system) seconds, peak resident memory (MiB), what it printed (JSON)."""

    wall: float
    cpu: float
    peak_mib: float
    printed: dict[str, Any]


# Linux keeps a process's peak memory across exec: a child forked from a large process (a Jupyter kernel
# that imported JAX) reports at least its parent's peak. So each contender is started by this small
# launcher (Python without site packages, about 10 MiB), which forks it, waits for it with os.wait4 and
# writes its wall time and the kernel's count of its CPU time and peak memory to a file.
LAUNCHER = """\
import json, os, sys, time
t0 = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_kib": usage.ru_maxrss,
               "exit": os.waitstatus_to_exitcode(status)}, f)
"""


def fresh_env() -> dict[str, str]:
    """This process's environment as a new shell would have it: without the XLA flag that ``import
    fastjax`` added here (a child that inherited it would skip fastjax's CPU check, which a reader's
    script runs: it reads the kept answer, or probes on the first run ever)."""
    from fastjax.setup.workaround import WORKAROUND_FLAG

    env = os.environ.copy()
    flags = [f for f in env.get("XLA_FLAGS", "").split() if f != WORKAROUND_FLAG]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:
        env.pop("XLA_FLAGS", None)
    return env


def run_process(args: list[str], env: dict[str, str] | None = None, timeout: float = 600.0) -> Run:
    """Run ``args`` (``args[0]`` a full path) in a new process (environment ``env``, default
    ``fresh_env()``) and measure it from outside (``LAUNCHER``); RuntimeError with its stderr if it fails."""
    env = fresh_env() if env is None else env
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "usage.json"
        launcher = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(report), *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            stdout, stderr = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)  # the launcher and the contender: one session
            launcher.communicate()
            raise RuntimeError(f"{' '.join(args[:4])} took over {timeout:.0f} s") from None
        proc = subprocess.CompletedProcess(args, launcher.returncode, stdout, stderr)
        if not report.is_file():
            raise RuntimeError(f"the launcher of {' '.join(args[:4])} failed: {proc.stderr.strip()[-800:]}")
        usage = json.loads(report.read_text())
    if usage["exit"] != 0:
        raise RuntimeError(f"{' '.join(args[:4])} exited {usage['exit']}: {proc.stderr.strip()[-800:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    printed = json.loads(lines[-1]) if lines else {"stdout": proc.stdout.strip()[-300:]}
    return Run(usage["wall"], usage["cpu"], usage["peak_kib"] / 1024, printed)


class Race:
    """The files a race needs (data, scripts, caches) in one temporary folder; ``command(c, round)`` is
    what runs contender ``c`` in that round."""

    def __init__(self, folder: Path, repeat: int, maxiter: int = pln.MAXITER, tol: float = pln.TOL):
        self.folder, self.maxiter, self.tol = Path(folder), maxiter, tol
        self.data = write_data(self.folder, repeat)
        cache_line = PERSISTENT_CACHE
        scripts = {
            "pyplnmodels": PYPLNMODELS.format(maxiter=maxiter, tol=tol),
            "book": BOOK.format(cache="", cached="", maxiter=maxiter, tol=tol),
            "persistent": BOOK.format(cache=cache_line, cached=" (or read it from the cache)", maxiter=maxiter, tol=tol),
            "exported": EXPORTED.format(cache="", cached="", tol=tol),
            "exported+persistent": EXPORTED.format(cache=cache_line, cached=" (or read from the cache)", tol=tol),
            "jax": JAX_FLOOR, "jax+lapack": JAX_LAPACK_FLOOR, "numpy": NUMPY_FLOOR,
        }
        self.scripts = {}
        for kind, text in scripts.items():
            path = self.folder / f"script_{kind.replace('+', '_')}.py"  # not numpy.py: it would shadow numpy
            path.write_text(text)
            self.scripts[kind] = path
        self.exported = self.folder / "fit.exported"
        self.export_bytes: float | None = None

    def command(self, c: Contender, round_: int, threads: int | None = None) -> tuple[list[str], dict[str, str]]:
        """The argument list and environment that run ``c`` in round ``round_`` (with ``threads`` compute
        threads, through ``c.threads_env``; None: the library's default)."""
        env = fresh_env()
        if threads is not None and c.threads_env:
            env[c.threads_env] = str(threads)
        cache = self.folder / "cache" / (c.name if not c.first else f"{c.name} {round_} {threads}")  # first: empty
        if c.first_ever:
            env["XDG_CACHE_HOME"] = str(cache / "home")  # fastjax's CPU probe answer is kept there
        if c.kind == "command":  # the data file's covariates hold the intercept already
            return [sys.executable, "-m", "fastjax.pln.fit", str(self.data), "--cache", str(cache), "--json", "--no-intercept",
                    "--maxiter", str(self.maxiter), "--tol", repr(self.tol),
                    *(["--quick-compile"] if c.compile_options.get("quick") else [])], env
        if c.kind.startswith("exported") and self.export_bytes is None:
            self.export_bytes = export_fit(self.data, self.exported, self.maxiter)
        return [sys.executable, str(self.scripts[c.kind]), str(self.data), str(cache), str(self.exported)], env


def _summary(runs: list[Run]) -> dict[str, Any]:
    walls = [r.wall for r in runs]
    return dict(wall=float(np.median(walls)), wall_quartiles=[float(np.percentile(walls, 25)), float(np.percentile(walls, 75))],
                cpu=float(np.median([r.cpu for r in runs])), peak_mib=float(np.median([r.peak_mib for r in runs])),
                runs=[asdict(r) for r in runs])


SAVED_AS = "pln-first-result"  # the name the chapter's race is kept under (fastjax.bench.save_part)
CACHED_KINDS = ("persistent", "exported+persistent", "command")  # contenders whose later runs read a cache


def race(repeat: int = 1, rounds: int = 3, quick: bool = False, maxiter: int = pln.MAXITER,
         chosen: list[Contender] | None = None, settings: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Race ``contenders(quick)`` (or ``chosen``) as whole processes on oaks stacked ``repeat`` times:
    one untimed round first (it fills the caches of the "later run" contenders and warms the disk; with
    ``quick``, only the runs that fill a cache), then ``rounds`` rounds in turns. Each contender that computes
    runs at every thread count of ``settings`` (default ``timing.thread_settings()``: 1 and one per core; set
    through ``Contender.threads_env``; with ``quick``, pyPLNmodels only, the JAX scripts at XLA's default), in
    turns too, and keeps its faster one (``threads``); a setting over
    3× the contender's fastest in the first round is not run again. Per contender: median wall seconds with
    quartiles, CPU seconds, peak MiB, the CPU cores other processes kept busy while it ran (``load``); per-round
    ratios of pyPLNmodels' wall to each one's (``speedup``; ``speedup_ratio``, a ``timing.Ratio``, is "not
    measured" where the witness saw a busy machine) and of each one's to the bare JAX process's
    (``over_jax_floor``) and to the bare JAX process that loads SciPy's LAPACK as the fit must
    (``over_lapack_floor``), as medians with quartiles. Also the disk the caches hold."""
    from fastjax.tools import timing

    rounds = checks.check_positive_int(rounds, "rounds")
    chosen = contenders(quick) if chosen is None else chosen
    settings = tuple(settings or timing.thread_settings())
    # quick: only pyPLNmodels tries every count (torch's threads are the ones that wait on a busy core); each
    # JAX script runs at XLA's default, as its users run it, which halves the quick race's processes
    tried = lambda c: settings if c.threads_env and not (quick and c.kind != "pyplnmodels") else (None,)  # noqa: E731
    plan = [(c, n) for c in chosen for n in tried(c)]
    runs: dict[tuple[str, int | None], list[Run]] = {(c.name, n): [] for c, n in plan}
    witness = timing.Witness()
    with tempfile.TemporaryDirectory() as folder:
        setup = Race(Path(folder), repeat, maxiter)
        for round_ in range(-1, rounds):  # round -1: warm-up, untimed
            for c, n in plan:
                fills_cache = c.kind in CACHED_KINDS and not c.first  # its later runs read what this run leaves
                if round_ < 0 and not fills_cache and (quick or n not in (None, settings[0])):
                    continue
                args, env = setup.command(c, round_, n)
                with witness.measure((c.name, n)):
                    run = run_process(args, env)
                if round_ >= 0:
                    runs[(c.name, n)].append(run)
            if round_ == 0 and len(plan) > len(chosen):  # drop the settings far slower than the contender's best
                best = {c.name: min(runs[(c.name, m)][0].wall for cc, m in plan if cc.name == c.name) for c in chosen}
                plan = [(c, n) for c, n in plan if n is None or runs[(c.name, n)][0].wall <= 3 * best[c.name]]
        disk = {c.name: _folder_bytes(Path(folder) / "cache" / c.name) for c in chosen if not c.first}
        disk["jax.export file"] = setup.export_bytes
        n_rows, p = np.load(setup.data)["counts"].shape
    picked = {}  # each contender's fastest setting that ran every round
    for c in chosen:
        full = [(n, runs[(c.name, n)]) for cc, n in plan if cc.name == c.name]
        picked[c.name] = min(full, key=lambda nr: float(np.median([r.wall for r in nr[1]])))
    out: dict[str, Any] = dict(n=int(n_rows), p=int(p), rounds=rounds, contenders={}, disk_bytes=disk)
    walls = {c.name: timing.Timing(c.name, [r.wall for r in picked[c.name][1]], load=witness.load((c.name, picked[c.name][0])))
             for c in chosen}
    kinds = {c.kind: c.name for c in chosen if not c.first}
    for c in chosen:
        n, chosen_runs = picked[c.name]
        row = _summary(chosen_runs)
        row.update(kind=c.kind, first=c.first, first_ever=c.first_ever, load=walls[c.name].load,
                   threads=f"{c.threads_env}={n}" if n is not None else "default",
                   threads_tried={f"{c.threads_env}={m}": float(np.median([r.wall for r in runs[(c.name, m)]]))
                                  for m in settings if c.threads_env and runs.get((c.name, m))})
        for key, other, forward in (("speedup", kinds.get("pyplnmodels"), True),
                                    ("over_jax_floor", kinds.get("jax"), False),
                                    ("over_lapack_floor", kinds.get("jax+lapack"), False)):
            if other is None:
                continue
            ratios = [(a.wall / b.wall if forward else b.wall / a.wall) for a, b in zip(picked[other][1], chosen_runs)]
            row[key] = float(np.median(ratios))
            row[key + "_quartiles"] = [float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75))]
            if key == "speedup":
                r = timing.ratio(walls[other], walls[c.name])
                r.value = row[key] if r.measured else None  # the median of per-round ratios, as the other keys
                r.threads = {other: out["contenders"].get(other, {}).get("threads"), c.name: row["threads"]}
                row["speedup_ratio"] = r
        out["contenders"][c.name] = row
    return out


def _folder_bytes(folder: Path) -> float:
    return float(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())) if folder.is_dir() else 0.0


# ----------------------------------------------------------------------------- where the time goes

def stages(result: dict[str, Any], name: str) -> list[tuple[str, float]]:
    """Where contender ``name``'s processes in ``result`` (of ``race``) spent their time: each stage its
    script stamped, median seconds over the rounds, and "interpreter start-up and exit" (the wall time
    less the stages). Empty for a script without stamps."""
    runs = result["contenders"][name]["runs"]
    rows = [r["printed"].get("stages") for r in runs]
    if not rows or rows[0] is None:
        return []
    out = [(stage, float(np.median([r[i][1] for r in rows]))) for i, (stage, _) in enumerate(rows[0])]
    rest = float(np.median([run["wall"] - sum(x for _, x in r) for run, r in zip(runs, rows)]))
    return [("interpreter start-up and exit (the rest)", rest), *out]


_IMPORTTIME = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")


class ImportTime(NamedTuple):
    """One module in ``python -X importtime``'s report: seconds including the modules it imported first,
    its nesting depth (0: imported at top level), and seconds of its own."""

    name: str
    seconds: float
    depth: int
    own: float


def import_times(args: list[str], env: dict[str, str] | None = None) -> list[ImportTime]:
    """``python -X importtime ARGS`` in a new process (environment ``env``, default ``fresh_env()``; e.g.
    ``["-c", "import jax"]``): every module it imported, in the order Python reports them (a module after
    the modules it imported)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=600,
                          env=fresh_env() if env is None else env)
    if proc.returncode != 0:
        raise RuntimeError(f"python -X importtime {' '.join(args[:3])} failed: {proc.stderr.strip()[-500:]}")
    rows = []
    for line in proc.stderr.splitlines():
        match = _IMPORTTIME.match(line)
        if match:
            rows.append(ImportTime(match.group(4), int(match.group(2)) / 1e6, (len(match.group(3)) - 1) // 2,
                                   int(match.group(1)) / 1e6))
    return rows
