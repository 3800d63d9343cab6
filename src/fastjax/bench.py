"""Measure both ladders outside the notebooks and write them as JSON; keep what a build measured.

Usage: ``python -m fastjax.bench [--out results/bench.json] [--part pln|resnet|all] [--figures]``.
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

PARTS = ("pln", "resnet")


def measure_part(part: str) -> dict[str, Any]:
    """Measure one part's ladder (``"pln"`` with its race against pyPLNmodels, or ``"resnet"``) and the seconds it took."""
    if part == "pln":
        from fastjax.pln import bench as ladder
    elif part == "resnet":
        from fastjax.resnet import bench as ladder
    else:
        raise ValueError(f"part must be one of {PARTS}; got {part!r}")
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
        extra_floors = [res[k] for k in ("floor_fast", "dispatch_floor") if res.get(k)]
        rungs = list(res["rungs"]) + [res["floor"]] + extra_floors
        lines += [f"### {part}", "", timing.format_table(timing.table(rungs, floor=res["floor"])), ""]
        race = res.get("torch_race")
        if race and "step" in race:
            t = race["step"]["timings"]
            lines += ["against PyTorch, per train step (the race's own run; × its floor):", "",
                      timing.format_table(timing.table(list(t.values()), floor=t["floor"])), ""]
        elif race:
            lines += [race["skipped"], ""]
    lines.append(timing.stamp_text(results["stamp"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure the book's ladders and write them as JSON.")
    parser.add_argument("--out", type=Path, default=Path("results/bench.json"), help="JSON file to write")
    parser.add_argument("--part", choices=[*PARTS, "all"], default="all")
    parser.add_argument("--figures", action="store_true", help="save the ladder charts to images/")
    args = parser.parse_args(argv)
    parts = PARTS if args.part == "all" else (args.part,)
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
