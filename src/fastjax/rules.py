"""The book's rules and the gain each bought on this machine, for the Results page (chapters/results.md).

Nothing is timed again here: each part's chapter saved its measurements (``fastjax.bench.save_part``), and
``load`` reads them back; a ladder that no chapter of this build saved (the page opened on its own, in
Colab say) is measured now with the same code as ``python -m fastjax.bench``. ``gains`` turns them into
the gain of each rule in words, or why this build has no figure.
"""

from __future__ import annotations

from fastjax import bench
from fastjax.tools import timing

NOT_MEASURED = "not measured by this build"


def load() -> tuple[dict, dict, list[str], dict]:
    """``(results, stamps, where, saved)``: each ladder's results and stamp, one line per ladder saying
    where its figures come from, and the other parts' saved races (``None`` where a page did not run)."""
    from fastjax.pln import first_result
    from fastjax.resnet import race as resnet_race

    results, stamps, where = {}, {}, []
    for part in bench.PARTS:
        kept = bench.load_part(part)
        if kept is None:
            where.append(f"{part}: no measurement saved by this build's chapter, so this page measured it now")
            fresh = bench.run((part,))
            results[part], stamps[part] = fresh["parts"][part], fresh["stamp"]
        else:
            results[part], stamps[part] = kept
            where.append(f"{part}: measured by its chapter at {kept[1]['utc']} UTC")
    names = (*bench.MANY, first_result.SAVED_AS, resnet_race.TORCH_RACE_SAVED_AS)
    return results, stamps, where, {name: bench.load_part(name) for name in names}


def median(res: dict, name: str) -> float | None:
    """The median seconds of the timing called ``name`` in a ladder (its rungs and floors), or None."""
    found = [t for t in (*res["rungs"], res["floor"], res.get("floor_fast"), res.get("dispatch_floor"))
             if t is not None and t.name == name]
    return found[0].median if found else None


def gain(slow: float | None, fast: float | None, per: str) -> str:
    """``slow`` over ``fast`` (seconds) as 'N× per ...', or why this build has no figure."""
    if slow is None or fast is None:
        return NOT_MEASURED
    return f"{slow / fast:.1f}× {per}"


def _one_program(saved: dict, name: str, slow: str, what: str) -> str:
    """The one program of many race ``name`` against its way ``slow`` (``what``), as a gain, or why there is none."""
    if saved.get(name) is None:
        return NOT_MEASURED
    t = saved[name][0]["timings"]
    return gain(t[slow].median, t[saved[name][0]["one"]].median, f"over {what}")


def _whole(saved: dict, kind: str, first: bool) -> float | None:
    """The wall seconds of the whole-process race's contender of ``kind`` (a first or a later run), or None."""
    from fastjax.pln import first_result

    if saved.get(first_result.SAVED_AS) is None:
        return None
    res = next(iter(saved[first_result.SAVED_AS][0].values()))
    return next((r["wall"] for r in res["contenders"].values() if r["kind"] == kind and r["first"] == first
                 and not r["first_ever"]), None)


def _against_pyplnmodels(pln: dict) -> str:
    """The race against pyPLNmodels (Part I's): the ratio in words, or why it was not measured."""
    ratio = ((pln.get("race") or {}).get("ratios") or {}).get("converge_compile_excluded")
    if ratio is None:
        return NOT_MEASURED
    return ratio.text("{:.1f}× per fit")  # "not measured (the machine was busy)" where the race's witness said so


def _against_pytorch(saved: dict) -> str:
    """The fastest JAX step against the fastest PyTorch step, in words, or why there is no figure."""
    from fastjax.resnet import race as resnet_race

    if saved.get(resnet_race.TORCH_RACE_SAVED_AS) is None:
        return f"{NOT_MEASURED} (PyTorch is not installed, or its page did not run)"
    t = saved[resnet_race.TORCH_RACE_SAVED_AS][0]["step"]["timings"]
    torch_best = min((v for n, v in t.items() if n.startswith(("PyTorch", "torch"))), key=lambda v: v.median)
    jax_best = min((v for n, v in t.items() if not n.startswith(("PyTorch", "torch"))), key=lambda v: v.median)
    r = timing.ratio(torch_best, jax_best)  # the race's witness decides, as on its page
    return (f"the fastest JAX step ({jax_best.name}) runs at {r.value:.2f}× the speed of the fastest PyTorch step "
            f"({torch_best.name})" if r.measured else "not measured (the machine was busy)")


def gains(results: dict, saved: dict) -> dict[str, str]:
    """The gain each rule of the book bought on this machine, in words (or why this build has no figure),
    by the rule's key, in the order the Results page lists them (it glues each as ``rule_<key>``)."""
    pln, resnet = results["pln"], results["resnet"]
    pln_fast = pln["floor_fast"].median if pln.get("floor_fast") else None
    resnet_fast = resnet["floor_fast"].median if resnet.get("floor_fast") else None
    boot = _one_program(saved, "many-bootstrap", "JAX, loop of compiled fits", "a loop of compiled fits")
    sweep = _one_program(saved, "many-sweep", "JAX: K runs, one after another", "a loop of steps")
    return {
        "jit": gain(median(pln, "1 no-jit"), median(pln, "2 jit"), "per PLN iteration"),
        "scan": gain(median(pln, "2 jit"), median(pln, "3 scan"), "per PLN iteration"),
        "step": gain(median(resnet, "no-jit"), median(resnet, "nnx.jit"), "per ResNet step"),
        "split": gain(median(resnet, "nnx.jit"), median(resnet, "split/merge"), "per ResNet step"),
        "vmap": f"bootstrap refits: {boot}; a sweep of ResNets: {sweep}",
        "work": gain(pln["floor"].median, pln_fast, "per PLN iteration over the compiled floor"),
        "conv": gain(resnet["floor"].median, resnet_fast, "per ResNet step over the compiled floor"),
        "cache": gain(_whole(saved, "command", True), _whole(saved, "command", False),
                      "for a whole fitting process: its first run over a later one"),
        "pyplnmodels": _against_pyplnmodels(pln),
        "pytorch": _against_pytorch(saved),
    }


# ----------------------------------------------------------------------------- the dashboards' tables


def floors_table(results: dict) -> tuple[list[dict], list[str]]:
    """Each ladder's old floor beside the new one of Part VI (rows), and a note for each ladder saved
    without a new floor."""
    rows, notes = [], []
    for title, res in (("Part I: PLN, per iteration", results["pln"]), ("Part II: ResNet, per train step", results["resnet"])):
        if res.get("floor_fast") is None:
            notes.append(f"{title}: no new floor in this measurement (saved before Part VI)")
            continue
        old, new = res["floor"], res["floor_fast"]
        rows.append({"part": title, "old floor": old.name, "old (ms)": 1e3 * old.median,
                     "new floor": new.name, "new (ms)": 1e3 * new.median, "speed-up": old.median / new.median})
    return rows, notes


def pyplnmodels_race_text(pln: dict) -> str:
    """Part I's race against pyPLNmodels with both JAX fits, in one line (each ratio 'not measured' where
    the race's witness saw a busy machine)."""
    race = pln.get("race")
    if race is None or "ratios" not in race:
        return "no race with both JAX fits in this measurement"
    r = race["ratios"]
    return (f"n = {race['n']:,}: pyPLNmodels {race['pyplnmodels_seconds']:.3f} s to converge; "
            f"Part I's fit {race['jax_part1_seconds']:.3f} s ({r['part1_converge_compile_excluded'].text()}), "
            f"Part VI's fit {race['jax_seconds']:.3f} s ({r['converge_compile_excluded'].text()}), compile apart; "
            f"medians of {race['repeats']} rounds; threads: " + "; ".join(f"{k}: {v}" for k, v in race["threads"].items()))


def whole_process_table(whole: dict) -> list[dict]:
    """The whole-process race of chapters/floor/04-first-result.md (as saved), one row per process."""
    rows = []
    for res in whole.values():
        for name, r in res["contenders"].items():
            rows.append({"n": f"{res['n']:,}", "process": name, "threads": r.get("threads", ""),
                         "wall (s), median": f"{r['wall']:.2f}", "peak (MiB)": f"{r['peak_mib']:.0f}",
                         "pyPLNmodels' ÷ this": r["speedup_ratio"].text() if "speedup_ratio" in r else "",
                         "this ÷ bare JAX": f"{r['over_jax_floor']:.2f}×" if "over_jax_floor" in r else ""})
    return rows


def torch_table(timings: dict, eager: str) -> list[dict]:
    """The race against PyTorch (as saved): per train step, each way against PyTorch eager (``eager``)."""
    return [{"per train step": n, "threads": v.extra.get("threads", ""), "ms": 1e3 * v.median,
             "q1": 1e3 * v.q1, "q3": 1e3 * v.q3, "× PyTorch eager": timing.ratio(timings[eager], v).text("{:.2f}")}
            for n, v in timings.items()]
