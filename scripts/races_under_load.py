"""Run the book's races against other libraries and print each ratio with the witness's verdict.

Usage: .venv/bin/python scripts/races_under_load.py [--spin N] [--out FILE.json]
--spin N starts N busy processes (``yes > /dev/null``) beside the races, for the whole run, and stops them
at the end: the way to check that a loaded machine publishes no ratio that a quiet one would contradict.
The races, at the size of FASTJAX_SIZE (quick by default here): Part I's fit against pyPLNmodels
(chapters/pln/07-results), the whole processes of chapters/floor/04-first-result, the ResNet's step against
PyTorch (chapters/resnet/08-pytorch) and Part VI's PLN-PCA collection (chapters/many/01-pca-collection).
Each line gives the ratio of the medians as measured ("raw", whatever the witness says), the published
text (the number, or "not measured"), and the thread setting each side ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time

os.environ.setdefault("FASTJAX_SIZE", "quick")

import fastjax  # noqa: E402,F401  (the CPU fix, before JAX)
from fastjax import pln  # noqa: E402
from fastjax.tools import timing  # noqa: E402


def line(race: str, what: str, r: timing.Ratio, raw: float) -> dict:
    row = {"race": race, "ratio": what, "raw": raw, "published": r.text(), "threads": r.threads}
    print(f"{race:22s} {what:58s} raw {raw:7.2f}  published: {r.text()[:70]}  threads: {r.threads}", flush=True)
    return row


def part1() -> list[dict]:
    from fastjax.pln import bench as bench_pln

    out = bench_pln.race(fresh_process=False)
    rows = []
    for key, raw_key in (("converge_compile_excluded", "speedup_converge_compile_excluded"),
                         ("part1_converge_compile_excluded", "speedup_part1_converge_compile_excluded")):
        raw = out["pyplnmodels_seconds"] / (out["jax_seconds"] if key.startswith("converge") else out["jax_part1_seconds"])
        rows.append(line("Part I vs pyPLNmodels", key, out["ratios"][key], raw))
    return rows


def whole_process() -> list[dict]:
    from fastjax.pln import first_result

    chosen = [c for c in first_result.contenders(quick=True) if c.kind in ("pyplnmodels", "book", "command") and not c.first]
    out = first_result.race(rounds=2, quick=True, chosen=chosen)
    rows = []
    for name, row in out["contenders"].items():
        if "speedup_ratio" in row and row["kind"] != "pyplnmodels":
            rows.append(line("whole process", name, row["speedup_ratio"], row["speedup"]))
    return rows


def pytorch() -> list[dict]:
    from fastjax.resnet import race as R
    from fastjax.resnet.ladder import settings

    s = settings()
    race = R.contenders((R.TORCH_EAGER, R.TORCH_TUNED, "floor", R.FASTER_FLOOR), s.config)
    t = R.race_step(race, s.batch, R.race_settings().repeats)["timings"]
    best = min(("floor", R.FASTER_FLOOR), key=lambda n: t[n].median)
    return [line("ResNet vs PyTorch", f"{best} / {other}, per step", timing.ratio(t[other], t[best]),
                 t[other].median / t[best].median) for other in (R.TORCH_EAGER, R.TORCH_TUNED)]


def pca() -> list[dict]:
    from fastjax import bench
    from fastjax.pln import many

    s = bench.many_settings("many-pca")
    out = many.pca_race(pln.load_oaks_counts(), s.ranks, s.repeats)
    t = list(out["timings"].values())
    return [line("PLN-PCA collection", "one program / pyPLNmodels' collection", timing.ratio(t[0], t[1]),
                 t[0].median / t[1].median)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spin", type=int, default=0, help="busy processes (yes > /dev/null) beside the races")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    spinners = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.spin)]
    rows, t0 = [], time.perf_counter()
    try:
        time.sleep(0.5 if spinners else 0)
        for race in (part1, whole_process, pytorch, pca):
            rows += race()
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    print(f"{len(rows)} ratios in {time.perf_counter() - t0:.0f} s, {args.spin} busy processes beside")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"spin": args.spin, "rows": rows}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
