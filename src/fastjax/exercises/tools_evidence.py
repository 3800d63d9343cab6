"""The measurements of Part III's practice page (chapters/tools/05-practice.md): for each exercise, its starting
program against its solution, as the page's hidden "measurements" cells run them. Each function takes the page's
programs, checks that they compute the same thing (raising AssertionError when they do not), prints its tables,
and returns the figures the page glues, by glue name; the seconds it took are recorded as the exercise's
"solution" time (``exercises.record``, for the workshop page)."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastjax import exercises, pln
from fastjax.exercises.racing import factor_and_word
from fastjax.tools import memory, profiling, timing

# tools-2: the criterion path, lax.scan against the unrolled loop, float32: the same operations rolled or unrolled,
# measured identical bits; room for another compiler's rounding (the criterion is a difference of normalized ELBOs)
CRITERION_PATH_RTOL = 1e-6


def _recorded(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record the seconds each call of the decorated measurement takes as exercise ``name``'s "solution" time."""
    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            exercises.record(name, "solution", time.perf_counter() - start)
            return out
        return run
    return wrap


def hot_operations(compiled: Any, params: Any, data: Any, top: int = 4) -> tuple[str, float, float]:
    """A profile of tools-1's starting program, ``compiled`` (its value_and_grad), in one traced call on
    ``(params, data)``: a table of the ``top`` slowest HLO instructions with the array types each makes and
    reads; the share of the traced time of the operations that make or read an n × n array (the hat matrix);
    and that of the LAPACK solves (custom calls) that touch a d × n array ((XᵀX)⁻¹Xᵀ, a column per sample)."""
    rows = profiling.traced_ops(compiled, params, data)
    types = profiling.array_types(compiled.as_text())  # name -> (result type, its operands' types)
    touches = {r["op name"]: [t[0], *t[1]] for r in rows for t in [types.get(r["op name"], ("?", []))]}
    table = timing.format_table([{"instruction": r["op name"], "op": r["op"], "result": touches[r["op name"]][0],
                                  "reads": " ".join(touches[r["op name"]][1:]), "ms": r["total ms"],
                                  "share": r["share"]} for r in rows[:top]])
    n, d = data.covariates.shape
    big = sum(r["share"] for r in rows if any(t.endswith(f"[{n},{n}]") for t in touches[r["op name"]]))
    solves = sum(r["share"] for r in rows if r["op"] == "custom-call"
                 and any(t.endswith(f"[{d},{n}]") for t in touches[r["op name"]]))
    return table, big, solves


@_recorded("tools-1")
def hat_matrix(start: Callable[..., Any], solution: Callable[..., Any], data: pln.PlnData, runs: int) -> dict:
    """tools-1: the profile of ``value_and_grad(start)`` (the hat-matrix loss), its value and gradients against
    the ``solution``'s (tools-1's check, its bounds), and the two timed in turns."""
    from fastjax.exercises import tools as tools_exercises

    params = pln.start(data)
    # the jitted value and gradients the check made: compiling them again reads JAX's caches
    compiled = {name: tools_exercises.value_and_grad_of(fn).lower(params, data).compile()
                for name, fn in (("hat matrix", start), ("coefficients", solution))}
    table, big, wide_solve = hot_operations(compiled["hat matrix"], params, data)
    print("slowest operations of value_and_grad(loss_with_hat_matrix), one traced call:", table, sep="\n")
    exercises.get("tools-1").same(compiled["hat matrix"](params, data), compiled["coefficients"](params, data))
    race = timing.time_interleaved({name: (lambda c=c: c(params, data)) for name, c in compiled.items()},
                                   repeats=runs, min_repeat_seconds=0)
    speedup, word = factor_and_word(race["hat matrix"].median / race["coefficients"].median)
    print(timing.format_table(timing.table(race.values(), floor=race["coefficients"], unit="ms")))
    n_rows = data.covariates.shape[0]
    print(f"operations that make or read the n × n hat matrix ({n_rows} × {n_rows}): {big:.0%} of the traced time; "
          f"LAPACK solves with {n_rows} right-hand sides: {wide_solve:.0%}; value and gradients {speedup:.1f}× "
          f"{word} without them")
    return dict(t1_share=100 * big, t1_solve_share=100 * wide_solve, t1_speedup=speedup, t1_word=word, t1_n=n_rows)


@_recorded("tools-2")
def compile_growth(unrolled: Callable[..., Any], scan_all: Callable[..., Any], scan_path: Callable[..., Any],
                   elbos: Any, counts: Sequence[int]) -> dict:
    """tools-2: the trace and compile time of the ``unrolled`` criterion loop at each count, and of the scan
    over all the ELBOs (``scan_all``) once; ``scan_path(elbos, k)`` must give the unrolled loop's values."""
    unrolled_s = {k: timing.compile_time(unrolled, elbos, count=k).total_seconds for k in counts}
    scan_s = timing.compile_time(scan_all, elbos).total_seconds
    for k in counts:
        np.testing.assert_allclose(scan_path(elbos, k), np.asarray(unrolled(elbos, k)), rtol=CRITERION_PATH_RTOL)
    print(timing.format_table([{"count": k, "unrolled loop: trace + compile (s)": unrolled_s[k],
                                "lax.scan, any count (s)": scan_s} for k in counts]))
    k_small, k_big = counts[0], counts[-1]
    growth, grew = factor_and_word(unrolled_s[k_big] / unrolled_s[k_small], above="grew", below="shrank")
    print(f"from {k_small} to {k_big} ELBOs ({k_big // k_small}× as many) the unrolled loop's compile {grew} "
          f"{growth:.1f}×; the scan compiled once in {scan_s:.2f} s")
    return dict(t2_small=k_small, t2_big=k_big, t2_big_s=unrolled_s[k_big], t2_growth=growth, t2_grew=grew,
                t2_scan_s=scan_s)


@_recorded("tools-3")
def donation(write_row: Callable[..., Any], record_row: Callable[..., Any], record_in_place: Callable[..., Any],
             fill_history: Callable[..., Any], rows: list, shape: tuple, runs: int) -> dict:
    """tools-3: the memory analysis of ``write_row`` jitted with and without donation (the donated program
    aliases the whole history), the two filled histories (equal), the donated buffer given up, and the two
    timed in turns, per row written."""
    history0 = jnp.zeros(shape)
    stats = {name: memory.memory_stats(jax.jit(write_row, donate_argnums=d).lower(history0, 0, rows[0]).compile())
             for name, d in (("copy", ()), ("donated", 0))}
    history_bytes = memory.tree_bytes(history0)
    if not (stats["copy"]["alias"] == 0 and stats["donated"]["alias"] == history_bytes):
        raise AssertionError(f"the donated program must write in place: aliased bytes {stats}, history {history_bytes}")
    exercises.get("tools-3").same(fill_history(record_in_place, rows), fill_history(record_row, rows))  # exact
    before = jnp.zeros(shape)
    after = record_in_place(before, 0, rows[0])
    if not (before.is_deleted() and not after.is_deleted()):
        raise AssertionError("the donated history must be given to the call (deleted), the result kept")
    race = timing.time_interleaved({"copied each call": lambda: fill_history(record_row, rows),
                                    "donated": lambda: fill_history(record_in_place, rows)},
                                   repeats=runs, per={"copied each call": len(rows), "donated": len(rows)},
                                   min_repeat_seconds=0)
    speedup, word = factor_and_word(race["copied each call"].median / race["donated"].median)
    print(f"history {history_bytes / 2**20:.1f} MiB; aliased into the donated input: "
          f"{stats['donated']['alias'] / 2**20:.1f} MiB, in the plain program: {stats['copy']['alias']} bytes")
    print(timing.format_table(timing.table(race.values(), floor=race["donated"])))
    print(f"per row written: {race['copied each call'].median_us:.0f} µs copied, {race['donated'].median_us:.0f} µs "
          f"donated ({speedup:.1f}× {word})")
    return dict(t3_mib=history_bytes / 2**20, t3_copy_us=race["copied each call"].median_us,
                t3_donated_us=race["donated"].median_us, t3_speedup=speedup, t3_word=word)


@_recorded("tools-4")
def callback_cost(fit_logged: Callable[..., Any], fit_on_device: Callable[..., Any], data: pln.PlnData,
                  n_iter: int, runs: int) -> dict:
    """tools-4: the fit that calls back to Python at every iteration against the one that keeps its ELBOs on
    the device: the same fit (tools-4's check, its bounds), timed in turns, per iteration."""
    exercises.get("tools-4").same(fit_logged(data, n_iter), fit_on_device(data, n_iter))
    race = timing.time_interleaved({"callback every iteration": lambda: fit_logged(data, n_iter),
                                    "ELBOs on the device": lambda: fit_on_device(data, n_iter)},
                                   repeats=runs, per={"callback every iteration": n_iter,
                                                      "ELBOs on the device": n_iter}, min_repeat_seconds=0)
    slow, fast = race["callback every iteration"], race["ELBOs on the device"]
    print(timing.format_table(timing.table(race.values(), floor=fast)))
    speedup, word = factor_and_word(slow.median / fast.median)
    difference = abs(slow.median_us - fast.median_us)
    more = "more" if slow.median > fast.median else "less"
    print(f"per iteration: {slow.median_us:.0f} µs with the callback, {fast.median_us:.0f} µs without "
          f"(without it {speedup:.1f}× {word}): {difference:.0f} µs {more} with the callback")
    return dict(t4_speedup=speedup, t4_word=word, t4_callback_us=difference, t4_more=more,
                t4_iteration_us=fast.median_us)
