"""Measure both ladders outside the notebooks and write them as JSON; keep what a build measured.

Usage: ``python -m fastjax.bench [--out results/bench.json] [--part pln|resnet|many|all] [--figures]``
(``many``: Part VI's races, chapters/many, which need torch and pyPLNmodels).
``--figures`` also saves each part's ladder chart as ``images/ladder-<part>.png`` (for the README).
The size follows ``FASTJAX_SIZE``.

Inside a book build each ladder is measured once, by its part's last chapter, which hands its
result to ``save_part``; the Results page reads it back with ``load_part`` instead of measuring
again. The files live in ``_build/measurements/`` of the checkout (``FASTJAX_MEASUREMENTS`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import fastjax  # noqa: F401  (the CPU workaround, before JAX starts)
from fastjax import sizes
from fastjax.tools import timing
from fastjax.tools.timing import from_plain, to_plain

PARTS = ("pln", "resnet")  # the ladders; "many" (Part VI's races) is asked for by name: --part many
# Part VI's races (chapters/many), each saved by its page for the Results page: {saved as: what it races}
MANY = {"many-pca": "the PLN-PCA collection (one fit per rank) on oaks",
        "many-bootstrap": "the bootstrap's refits of Part I's PLN on oaks",
        "many-sweep": "one train step of each member of a sweep of ResNets"}


_MANY_SIZES = {
    "many-pca": dict(quick=dict(ranks=list(range(1, 5)), scrna=(100, 50), scrna_ranks=[1, 2, 3], repeats=3),
                     full=dict(ranks=list(range(1, 11)), scrna=(400, 100), scrna_ranks=list(range(1, 11)), repeats=5)),
    "many-bootstrap": dict(quick=dict(n_boot=8, repeats=3, n_plnm=1), full=dict(n_boot=200, repeats=5, n_plnm=5)),
    "many-sweep": dict(quick=dict(members=8, repeats=5, check_steps=3), full=dict(members=8, repeats=9, check_steps=3)),
}


def many_settings(race: str) -> Any:
    """The sizes of Part VI's race ``race`` (a key of ``MANY``) at the size in force: its page and
    ``python -m fastjax.bench --part many`` run the same."""
    return sizes.choose(**_MANY_SIZES[race])


def many_races() -> dict[str, Any]:
    """Part VI's three races (chapters/many) at the size in force, each as its page runs it: ``{saved as:
    {"timings": {name: Timing}, "one": the one program's name}}``. Needs torch and pyPLNmodels."""
    from fastjax import pln
    from fastjax.pln import collection as col, many
    from fastjax.resnet import ladder as resnet_ladder, sweep

    oaks, out = pln.load_oaks_counts(), {}
    s = many_settings("many-pca")
    pca = many.pca_race(oaks, s.ranks, s.repeats)
    out["many-pca"] = {"timings": pca["timings"], "one": pca["one"]}
    s = many_settings("many-bootstrap")
    samples, rows = col.bootstrap_samples(oaks, s.n_boot, seed=0)
    out["many-bootstrap"] = many.bootstrap_race(oaks, samples, rows, s.repeats, s.n_plnm)
    s, net = many_settings("many-sweep"), resnet_ladder.settings()
    xs, ys = resnet_ladder.training_batches(1, net.batch)
    ways = sweep.sweep_ways(net.config, tuple(range(s.members)), xs[0], ys[0])
    threads = {n: timing.torch_threads() if n in (sweep.TORCH_FUNC, sweep.TORCH_LOOP) else timing.xla_threads()
               for n in ways}  # each PyTorch way at its faster thread count, as the page races them
    out["many-sweep"] = {"timings": timing.time_interleaved(ways, repeats=s.repeats, threads=threads), "one": sweep.ONE_PROGRAM}
    return out


def many_table(result: dict[str, Any]) -> str:
    """A Part VI race (``{"timings": {name: Timing}, "one": name of the one program}``) as a Markdown table:
    each way's thread setting, median and its time over the one program's (> 1: the one program is faster;
    "not measured" where the witness saw a busy machine)."""
    t, one = result["timings"], result["timings"][result["one"]]
    return timing.format_table([{"way": n, "threads": v.extra.get("threads", ""), "median (s)": v.median, "q1": v.q1,
                                 "q3": v.q3, "÷ the one program": timing.ratio(v, one).text("{:.3g}")}
                                for n, v in t.items()])


def measure_part(part: str) -> dict[str, Any]:
    """Measure one part's ladder (``"pln"`` with its race against pyPLNmodels, or ``"resnet"``) and the seconds it took."""
    if part == "pln":
        from fastjax.pln import bench as ladder
    elif part == "resnet":
        from fastjax.resnet import bench as ladder
    elif part == "many":
        from importlib.util import find_spec

        if find_spec("torch") is None or find_spec("pyPLNmodels") is None:
            why = "Part VI's races are skipped: they race pyPLNmodels and PyTorch, which are not installed"
            print(why)
            return {"skipped": why}
        t0 = time.perf_counter()
        return {**many_races(), "seconds": time.perf_counter() - t0}
    else:
        raise ValueError(f"part must be one of {(*PARTS, 'many')}; got {part!r}")
    t0 = time.perf_counter()
    out = ladder.measure_ladder()
    if part == "pln":
        out["race"] = ladder.race()  # the race against pyPLNmodels, with its speed-ups
    else:
        out["torch_race"] = torch_race()  # the race against the PyTorch twin (chapters/resnet/08-pytorch.md)
    out["seconds"] = time.perf_counter() - t0
    return out


def torch_race() -> dict[str, Any]:
    """The ResNet's race against its PyTorch twin (``fastjax.resnet.race.race``), or ``{"skipped": why}``
    where torch is not installed (the newest leg), with the reason printed."""
    from importlib.util import find_spec

    if find_spec("torch") is None:
        why = "the race against PyTorch is skipped: torch is not installed (the CPU build: pip install torch)"
        print(why)
        return {"skipped": why}
    from fastjax.resnet import race

    return race.race()


def measurements_dir() -> Path:
    """Where a build's measurements are kept: ``$FASTJAX_MEASUREMENTS``, else ``<book>/_build/measurements``."""
    env = os.environ.get("FASTJAX_MEASUREMENTS")
    if env:
        return Path(env)
    from fastjax.setup.colab import find_root

    try:
        return find_root() / "_build" / "measurements"
    except FileNotFoundError:  # outside a checkout (Colab): next to the notebook
        return Path.cwd() / "measurements"


def save_part(part: str, result: dict[str, Any]) -> Path:
    """Keep one part's ladder result (Timings and plain data) with the stamp, as JSON; return the path."""
    path = measurements_dir() / f"{part}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_plain({"stamp": timing.stamp(), "result": result}), indent=2, default=float))
    return path


def load_part(part: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The (result, stamp) that ``save_part`` kept for ``part`` at the size in force, or None if none was kept."""
    path = measurements_dir() / f"{part}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data["stamp"].get("size") != sizes.current_size():
        return None  # measured at the other size: not this build's numbers
    return from_plain(data["result"]), data["stamp"]


def run(parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Measure the ladders of ``parts`` in this process, one after the other; return plain data and Timings."""
    return {"stamp": timing.stamp(), "parts": {part: measure_part(part) for part in parts}}


def summary(results: dict[str, Any]) -> str:
    """A Markdown table per part: median per unit of work and ratio to that part's floor."""
    lines = []
    for part, res in results["parts"].items():
        if part == "many":
            lines += [res["skipped"], ""] if "skipped" in res else [
                line for saved_as, what in MANY.items() for line in (f"### {what}", "", many_table(res[saved_as]), "")]
            continue
        extra_floors = [res[k] for k in ("floor_fast", "dispatch_floor") if res.get(k)]
        rungs = list(res["rungs"]) + [res["floor"]] + extra_floors
        lines += [f"### {part}", "", timing.format_table(timing.table(rungs, floor=res["floor"])), ""]
        race = res.get("torch_race")
        if race and "step" in race:
            t = race["step"]["timings"]
            lines += ["against PyTorch, per train step (the race's own run; × its floor):", "",
                      timing.format_table([{"contender": n, "threads": v.extra.get("threads", ""), "median (µs)": v.median_us,
                                            "× floor": timing.ratio(v, t["floor"]).text("{:.3g}")} for n, v in t.items()]), ""]
        elif race:
            lines += [race["skipped"], ""]
    lines.append(timing.stamp_text(results["stamp"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure the book's ladders and write them as JSON.")
    parser.add_argument("--out", type=Path, default=Path("results/bench.json"), help="JSON file to write")
    parser.add_argument("--part", choices=[*PARTS, "many", "all"], default="all",
                        help="a ladder, Part VI's races (many), or all of them")
    parser.add_argument("--figures", action="store_true", help="save the ladder charts to images/")
    args = parser.parse_args(argv)
    parts = (*PARTS, "many") if args.part == "all" else (args.part,)
    results = run(parts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(to_plain(results), indent=2, default=float))
    print(summary(results))
    print(f"wrote {args.out}")
    if args.figures:
        for path in save_figures(results):
            print(f"saved {path}")


def save_figures(results: dict[str, Any]) -> list[Path]:
    """Save each part's ladder chart, stamped, as ``images/ladder-<part>.png``; return the paths."""
    from fastjax.tools import plots

    paths = []
    for part, res in results["parts"].items():
        if part not in PARTS:  # Part VI's races have no ladder to draw
            continue
        unit = "ms" if res["floor"].median > 1e-3 else "µs"
        race = (res.get("torch_race") or {}).get("step")
        others = [t for n, t in race["timings"].items() if n.startswith(("PyTorch", "torch"))] if race else []
        fig = plots.plot_ladder(res["rungs"], floor=res["floor"], dispatch_floor=res.get("dispatch_floor"),
                                unit=unit, title=f"{part}: time per {'iteration' if part == 'pln' else 'train step'}",
                                caption=timing.stamp_text(results["stamp"]), others=others,
                                others_floor=race["timings"]["floor"] if race else None)
        paths.append(plots.save_figure(fig, f"ladder-{part}.png"))
    return paths


if __name__ == "__main__":
    main()
