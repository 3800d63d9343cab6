"""The workshop page's two plans (chapters/workshop.md), built from the exercise catalogue and checked.

A plan is a list of days, each a list of sessions ``(title, chapters read together, minutes to read them
(our estimate), exercises done)``. ``schedule`` lays a plan out on the clock: each day starts at 9:00, a
15-minute break follows every session and an hour's lunch the first session that ends at noon or later;
every session gets ``SLACK`` minutes over its estimate, but the capstone, which takes what is left of the
last day until 17:30 (at least ``CAPSTONE_AT_LEAST`` minutes). ``plan`` raises AssertionError when a plan
names an exercise that does not exist, runs past 17:30, or leaves part of a session other than the
capstone for home.
"""

from __future__ import annotations

import datetime

DAY_START, DAY_END = datetime.time(9, 0), datetime.time(17, 30)
BREAK, LUNCH, CAPSTONE_AT_LEAST = 15, 60, 60  # minutes
SLACK = 5  # minutes per session (not the capstone's): a verdict to read twice, a check to run again
REST_OF_DAY = None  # a session's length: what is left of the day

ONE_DAY = [[
    ("Measuring honestly", "measuring, cpu-bug", 30, ["method-1", "method-2", "method-3"]),
    ("Part I: the PLN ladder", "pln/00 to pln/03, pln/07", 45, ["pln-1", "pln-2"]),
    ("Part II: the ResNet ladder", "resnet/00, resnet/02, resnet/03, resnet/07", 30, ["resnet-1"]),
    ("Part III: the tools", "tools/01, tools/02", 25, ["tools-1"]),
    ("Part IV: many fits as one program", "many/00", 15, ["many-1"]),
    ("The capstone", "capstone", REST_OF_DAY, ["capstone"]),
]]
TWO_DAYS = [
    [("Measuring honestly", "measuring, cpu-bug", 30, ["method-1", "method-2", "method-3", "method-4"]),
     ("Part I: the PLN ladder to lax.scan", "pln/00 to pln/03", 35, ["pln-1", "pln-2"]),
     ("Part I: state and stopping", "pln/04 to pln/07", 25, ["pln-3", "pln-4"]),
     ("Part II: the ResNet ladder", "resnet/00 to resnet/07", 50, ["resnet-1", "resnet-2", "resnet-3", "resnet-4"])],
    [("Part III: the tools", "tools/01 to tools/04", 40, ["tools-1", "tools-2", "tools-3", "tools-4"]),
     ("Part IV: many fits as one program", "many/00 to many/02", 30, ["many-1", "many-3"]),
     ("Part V: scale out", "scale/01, scale/02", 25, ["scale-1", "scale-4"]),
     ("Part VI: past the floor", "floor/01, floor/03", 30, ["floor-1"]),
     ("The capstone", "capstone", REST_OF_DAY, ["capstone"])],
]
PLANS = {"one day": ONE_DAY, "two days": TWO_DAYS}


def schedule(days: list, by_name: dict, ran: dict) -> tuple[list[dict], list[datetime.time]]:
    """The plan ``days`` on the clock: one row per session, and the time each day ends. ``by_name`` maps an
    exercise's name to its catalogue entry (its ``minutes``), ``ran`` to its recorded seconds."""
    rows, ends = [], []
    for d, sessions in enumerate(days, start=1):
        clock = datetime.datetime.combine(datetime.date(2000, 1, 1), DAY_START)
        lunched = False
        for title, reading, read_minutes, names in sessions:
            estimate = (read_minutes or 0) + sum(by_name[n].minutes for n in names)
            if read_minutes is REST_OF_DAY:
                minutes = int((datetime.datetime.combine(clock.date(), DAY_END) - clock).total_seconds() // 60)
                if minutes < CAPSTONE_AT_LEAST:
                    raise AssertionError(f"day {d} leaves {minutes} minutes for {title}")
            else:
                minutes = estimate + SLACK
            busy = [ran.get(n, {}).get("solution") for n in names]
            end = clock + datetime.timedelta(minutes=minutes)
            rows.append({"day": d, "start": f"{clock:%H:%M}", "end": f"{end:%H:%M}", "session": title,
                         "read together": reading, "exercises": ", ".join(names),
                         "minutes planned": minutes, "our estimate, min": estimate,
                         "goes home, min": max(0, estimate - minutes),
                         "solutions run, s (measured)": "—" if None in busy else round(sum(busy), 1)})
            clock = end + datetime.timedelta(minutes=BREAK)
            if not lunched and end.time() >= datetime.time(12, 0):
                clock += datetime.timedelta(minutes=LUNCH - BREAK)
                lunched = True
        ends.append(end.time())
    return rows, ends


def plan(label: str, catalogue: list, ran: dict) -> dict:
    """The plan called ``label`` (a key of ``PLANS``), checked: its rows, the capstone's slot and what of it
    goes home (minutes), how many exercises it plans, and the ones it leaves for home (names, or 'none')."""
    days = PLANS[label]
    by_name = {e.name: e for e in catalogue}
    unknown = [n for s in days for *_, names in s for n in names if n not in by_name]
    if unknown:
        raise AssertionError(f"the plans name exercises that do not exist: {unknown}")
    rows, ends = schedule(days, by_name, ran)
    late = [f"day {d}: {t:%H:%M}" for d, t in enumerate(ends, start=1) if t > DAY_END]
    if late:
        raise AssertionError(f"the {label} plan runs past {DAY_END:%H:%M}: {late}")
    short = [r for r in rows if r["goes home, min"] > 0]
    if not all(r["exercises"] == "capstone" for r in short):
        raise AssertionError(f"the {label} plan does not fit: {short}")
    capstone_row = [r for r in rows if r["exercises"] == "capstone"][-1]
    planned = {n for s in days for *_, names in s for n in names}
    return {"rows": rows, "capstone_slot": int(capstone_row["minutes planned"]),
            "capstone_home": int(capstone_row["goes home, min"]), "count": len(planned),
            "home": ", ".join(e.name for e in catalogue if e.name not in planned) or "none"}


def counts(catalogue: list, ran: dict) -> dict:
    """The figures of the page's first sentence: exercises in all, in the practice pages and their parts,
    solutions measured, our minutes in all and the capstone's, and the machine's minutes (solutions and
    self-checks, as recorded)."""
    capstone_part = {e.name: e.part for e in catalogue}["capstone"]
    parts = sorted({e.part for e in catalogue if e.part != capstone_part}, key=[e.part for e in catalogue].index)
    return {"n_exercises": len(catalogue), "n_in_parts": len([e for e in catalogue if e.part in parts]),
            "n_parts": len(parts), "n_measured": len([e for e in catalogue if "solution" in ran.get(e.name, {})]),
            "total_minutes": sum(e.minutes for e in catalogue),
            "capstone_minutes": int({e.name: e.minutes for e in catalogue}["capstone"]),
            "machine_minutes": sum(sum(ran.get(e.name, {}).values()) for e in catalogue) / 60}


def catalogue_rows(catalogue: list, ran: dict) -> list[dict]:
    """One row per exercise: part, skill, our minutes, and the seconds its solution and self-check took
    as recorded (a dash where none was)."""
    def seconds(name, what):
        value = ran.get(name, {}).get(what)
        return "—" if value is None else round(value, 1)

    return [{"exercise": e.name, "part": e.part, "skill": e.skill, "minutes (our estimate)": e.minutes,
             "solution, s (measured)": seconds(e.name, "solution"), "self-check, s (measured)": seconds(e.name, "check")}
            for e in catalogue]
