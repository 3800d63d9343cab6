"""What the first-result page (chapters/floor/04-first-result.md) reads off a race of
``fastjax.pln.first_result.race``: the race's table, one contender by its kind, sentences whose figures
exist at this size, and the check that every fitting script ended at the same ELBO.

- ``table(res)``: the race as a Markdown table (wall time with quartiles, CPU, peak memory, ratios).
- ``row(res, kind, ..., chosen=...)``: the contender of a kind (first run, first run ever, quick compile).
- ``said(res, chosen, text, otherwise, **picks)``: ``text`` with the wall times of ``picks`` filled in, or
  the whole sentence ``otherwise`` where this size does not race one of them.
- ``against_pypln(r)``: a run against pyPLNmodels' script, in words made from the ratio.
- ``check_same_elbo(results, reference_kind)``: raises unless every fitting script's ELBO is within
  ``pln.TARGET_GAP`` of the reference's; returns one line per race.
"""

from __future__ import annotations

from typing import Any, Sequence

from fastjax import pln
from fastjax.tools import timing


def table(res: dict[str, Any]) -> str:
    """One race (``first_result.race``'s result) as a Markdown table, one row per contender."""
    rows = []
    for name, r in res["contenders"].items():
        rows.append({"process": name, "threads": r["threads"],
                     "wall (s)": f"{r['wall']:.2f} [{r['wall_quartiles'][0]:.2f}, {r['wall_quartiles'][1]:.2f}]",
                     "CPU (s)": f"{r['cpu']:.2f}", "peak (MiB)": f"{r['peak_mib']:.0f}",
                     "pyPLNmodels' ÷ this": r["speedup_ratio"].text("{:.2f}×") if "speedup" in r else "",
                     "this ÷ bare JAX": f"{r['over_jax_floor']:.2f}×" if "over_jax_floor" in r else ""})
    return timing.format_table(rows)


def row(res: dict[str, Any], kind: str, first: bool = False, first_ever: bool = False, quick_compile: bool = False,
        *, chosen: Sequence[Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The contender of ``kind`` in ``res`` (``chosen``: the contenders raced), or (None, None) where this
    size does not race it."""
    for name, r in res["contenders"].items():
        options = any(c.name == name and c.compile_options for c in chosen)
        if r["kind"] == kind and r["first"] == first and r["first_ever"] == first_ever and options == quick_compile:
            return name, r
    return None, None


def said(res: dict[str, Any], chosen: Sequence[Any], text: str, otherwise: str, **picks: tuple) -> str:
    """``text`` with the wall times of the contenders ``picks`` (each ``row``'s arguments) filled in, or the
    whole sentence ``otherwise`` where this size does not race one of them: no sentence reads with a figure
    missing."""
    found = {k: row(res, *pick, chosen=chosen)[1] for k, pick in picks.items()}
    if any(r is None for r in found.values()):
        return otherwise
    return text.format(**{k: f"{r['wall']:.2f} s" for k, r in found.items()})


def against_pypln(r: dict[str, Any]) -> str:
    """A run of the command against pyPLNmodels' script, in words made from the ratio, whichever way it goes."""
    if "speedup" not in r:
        return "was not raced against pyPLNmodels' script (no torch here)"
    s = r["speedup_ratio"]
    if not s.measured:  # the witness saw another process take CPU, or a wild median: no number
        return f"was not measured against pyPLNmodels' script: the machine was busy ({s.why})"
    return (f"ran {s.value:.1f}× as fast as pyPLNmodels' script" if s.value > 1
            else f"took {1 / s.value:.1f}× the time of pyPLNmodels' script")


def check_same_elbo(results: dict[int, dict[str, Any]], reference_kind: str) -> list[str]:
    """Every script that printed an ELBO ended within ``pln.TARGET_GAP`` (relative) of the first run of the
    contender of ``reference_kind`` (float32 fits of one model by one rule): raises AssertionError if not.
    One line per race, saying how close and after how many iterations."""
    lines = []
    for res in results.values():
        printed = {name: [run["printed"] for run in r["runs"]] for name, r in res["contenders"].items()
                   if "elbo" in r["runs"][0]["printed"]}
        reference = next(name for name, r in res["contenders"].items() if r["kind"] == reference_kind)
        ref_elbo = printed[reference][0]["elbo"]
        gaps = {name: max(abs(pln.relative_gap(p["elbo"], ref_elbo)) for p in runs) for name, runs in printed.items()}
        if not max(gaps.values()) < pln.TARGET_GAP:
            raise AssertionError(f"the scripts' ELBOs are not the same fit: {gaps}")
        iterations = sorted({p["iterations"] for runs in printed.values() for p in runs})
        lines.append(f"n = {res['n']:,}: {len(printed)} fitting scripts, ELBOs within {max(gaps.values()):.1e} "
                     f"(relative) of the ELBO of {reference}, after {', '.join(map(str, iterations))} iterations")
    return lines


def stage(staged: dict[str, list[tuple[str, float]]], label: str, start: str) -> float:
    """Seconds of the stages of ``staged[label]`` (``first_result.stages``) whose name starts with ``start``."""
    return sum(x for s, x in staged.get(label, []) if s.startswith(start))


def pypln_said(staged: dict[str, list[tuple[str, float]]], pypln: dict[str, Any] | None,
               label: str = "pyPLNmodels' script") -> str:
    """Where pyPLNmodels' script spends its time, in one sentence (or that it did not run: no torch)."""
    if pypln is None:
        return "pyPLNmodels' script did not run here (no torch)."
    dynamo = "imported" if all(r["printed"]["fit_imported_torch_dynamo"] for r in pypln["runs"]) else "did not import"
    return (f"On pyPLNmodels' side, imports take {stage(staged, label, 'import'):.2f} s (torch, then pyPLNmodels) "
            f"and the fit {stage(staged, label, 'fit'):.2f} s; its first fit in a process {dynamo} `torch._dynamo` "
            "(torch's optimizers import it on first use, a one-time cost that `python -m fastjax.pln.bench --cold 3` "
            "times apart).")


def imports_beyond(imports: Sequence[Any], already: set[str]) -> dict[str, float]:
    """Own import seconds per top-level package of the modules in ``imports`` (``first_result.import_times``)
    that are not in ``already``: each module counted once, so the seconds add up."""
    beyond: dict[str, float] = {}
    for r in imports:
        if r.name not in already:
            beyond[r.name.split(".")[0]] = beyond.get(r.name.split(".")[0], 0.0) + r.own
    return beyond
