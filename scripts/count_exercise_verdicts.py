"""How often each timed exercise's check rejects its starting program and accepts its reference solution.

Not a test: it runs every timed exercise's check ``-n`` times on the starting program and ``-n`` times on the
reference (each check a full one: structural counts and the race in turns) and prints, per exercise, how
many of those checks said what they should, with the witness that decided. Run it on the machine whose
verdicts you want to count (a quiet one, or a busy one with ``--busy``, which starts that many processes
that keep a core busy beside the checks):

    .venv/bin/python scripts/count_exercise_verdicts.py -n 20
    .venv/bin/python scripts/count_exercise_verdicts.py -n 20 --busy 1 --only floor-2 tools-2
    .venv/bin/python scripts/count_exercise_verdicts.py -n 20 --devices 8 --only scale    # Part V as on its page

A check's verdict is one of PASSED, SLOW (RIGHT, BUT SLOW), CANNOT TELL (right, but time alone cannot
tell the reference from the starting program on this machine) and WRONG. The line of an exercise reads
"start rejected k of n" (SLOW) and "reference accepted k of n" (PASSED), with the other verdicts counted.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import sys
import time


def _spin(stop) -> None:  # one busy core, until told to stop
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def verdict(report) -> str:
    if not report.right:
        return "WRONG"
    if report.slow:
        return "SLOW"
    return "CANNOT TELL" if report.undecided else "PASSED"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="checks per program (default 20)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="exercise names or part prefixes (default: every timed exercise with a starting program)")
    parser.add_argument("--busy", type=int, default=0, help="processes that keep a core busy beside the checks")
    parser.add_argument("--devices", type=int, default=0, help="simulated CPU devices (Part V's pages use 8)")
    args = parser.parse_args()

    import fastjax  # noqa: F401  (before JAX starts)

    if args.devices:  # as Part V's pages ask for them (two XLA threads per device: see use_cpu_devices)
        from fastjax.scale import sharding

        sharding.use_cpu_devices(args.devices)
    from fastjax import exercises as ex

    chosen = [e for e in ex.all_exercises() if e.timed and e.start is not None]
    if args.only:
        chosen = [e for e in chosen if e.name in args.only or e.name.split("-")[0] in args.only]
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for b in burners:
        b.start()
    print(f"{args.n} checks of each program; {args.busy} busy process(es) beside; devices: "
          f"{args.devices or 'as JAX starts'}", flush=True)
    rows = []
    try:
        for e in chosen:
            t0 = time.perf_counter()
            counts = {}
            for who, program in (("start", e.start), ("reference", e.reference)):
                seen = collections.Counter()
                deciding = collections.Counter()
                for _ in range(args.n):
                    report = ex.check(e.name, program)
                    seen[verdict(report)] += 1
                    deciding["counted: " + "+".join(report.structural_misses) if report.structural_misses
                             else f"time: {report.by_time}"] += 1
                counts[who] = (seen, deciding)
            (s_seen, s_why), (r_seen, r_why) = counts["start"], counts["reference"]
            line = (f"{e.name:10s} witness {'+'.join(e.witness) or 'time':18s} start rejected {s_seen['SLOW']:2d} of "
                    f"{args.n} ({dict(s_seen)}; {dict(s_why)})   reference accepted {r_seen['PASSED']:2d} of {args.n} "
                    f"({dict(r_seen)}; {dict(r_why)})   {time.perf_counter() - t0:.0f} s")
            print(line, flush=True)
            rows.append(line)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
