"""How often each timed exercise's check rejects its starting program and accepts its reference solution.

Not a test: it runs every timed exercise's check ``-n`` times on the starting program and ``-n`` times on the
reference (each check a full one: structural counts and the race in turns) and prints, per exercise, how
many of those checks said what they should, with the witness that decided. Run it on the machine whose
verdicts you want to count (a quiet one, or a busy one with ``--busy``, which starts that many processes
that keep a core busy beside the checks; ``--busy cores``: one per core):

    .venv/bin/python scripts/count_exercise_verdicts.py -n 20
    .venv/bin/python scripts/count_exercise_verdicts.py -n 20 --busy cores
    .venv/bin/python scripts/count_exercise_verdicts.py -n 20 --busy 1 --only floor-2 tools-2
    .venv/bin/python scripts/count_exercise_verdicts.py -n 20 --devices 8 --only scale    # Part V as on its page

A check's verdict is one of PASSED, SLOW (RIGHT, BUT SLOW), CLOSE (right, and time decides, but the
answer's time is within 1.25x of its limit), CANNOT TELL (right, but time alone cannot tell the reference
from the starting program on this machine) and WRONG. The line of an exercise reads "start rejected k of
n" (SLOW) and "reference accepted k of n" (PASSED), with the other verdicts counted and what decided each
("counted: programs", or "time: slow"). The last lines are the table, one row per exercise.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
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
    if report.close:
        return "CLOSE"
    return "CANNOT TELL" if report.undecided else "PASSED"


def deciding(report) -> str:
    """What decided a right report: the witnesses counted too high, else those counted (time a second opinion),
    else time."""
    if report.structural_misses:
        return "counted: " + "+".join(report.structural_misses)
    if report.counted:
        return "counted: clean"
    return f"time: {report.by_time}"


def busy_count(value: str) -> int:
    """``--busy``: a number of spinning processes, or "cores" for one per core of this machine."""
    if value == "cores":
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--busy takes a number of processes or 'cores'; got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"--busy must be 0 or more; got {n}")
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=20, help="checks per program (default 20)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="exercise names or part prefixes (default: every timed exercise with a starting program)")
    parser.add_argument("--busy", type=busy_count, default=0,
                        help="processes that keep a core busy beside the checks: a number, or 'cores' for one per core")
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
                why = collections.Counter()
                for _ in range(args.n):
                    report = ex.check(e.name, program)
                    seen[verdict(report)] += 1
                    why[deciding(report)] += 1
                counts[who] = (seen, why)
            (s_seen, s_why), (r_seen, r_why) = counts["start"], counts["reference"]
            line = (f"{e.name:10s} witness {'+'.join(e.witness) or 'time':18s} start rejected {s_seen['SLOW']:2d} of "
                    f"{args.n} ({dict(s_seen)}; {dict(s_why)})   reference accepted {r_seen['PASSED']:2d} of {args.n} "
                    f"({dict(r_seen)}; {dict(r_why)})   {time.perf_counter() - t0:.0f} s")
            print(line, flush=True)
            rows.append((e.name, "+".join(e.witness) or "time", s_seen["SLOW"], r_seen["PASSED"],
                         s_seen["CANNOT TELL"] + r_seen["CANNOT TELL"] + s_seen["CLOSE"] + r_seen["CLOSE"]))
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    print(f"\n| exercise | witness | start rejected (of {args.n}) | reference accepted (of {args.n}) | "
          "close or cannot tell |\n|---|---|---|---|---|")
    for name, witness, rejected, accepted, unsure in rows:
        print(f"| {name} | {witness} | {rejected} | {accepted} | {unsure} |")
    short = [name for name, _, rejected, accepted, _ in rows if rejected < args.n or accepted < args.n]
    print(f"\n{len(rows) - len(short)} of {len(rows)} exercises at {args.n} of {args.n} both ways"
          + (f"; below: {', '.join(short)}" if short else ""))
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
