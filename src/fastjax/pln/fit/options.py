"""Checks of the command's options (``--tol``, ``--maxiter``, ``--ranks``, ``--bootstrap``, ``--seed``,
``--out``), each a ValueError (or TypeError) naming the option and what it takes."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np

from fastjax import checks, pln
from fastjax.pln.fit.cache import short as _short

MAXITER_LIMIT = 10**6  # the program keeps one float32 ELBO per iteration: 4 MB at this cap
RANK_LIMIT = 100_000  # --ranks: above any number of count columns this command can fit (checked against p after)
BOOTSTRAP_LIMIT = 10_000  # --bootstrap: the program holds every sample and every refit's outputs at once (oaks:
# 0.11 MB per refit as XLA plans it, memory_analysis at B = 50 and 1,000); run.check_memory compares the plan with free memory
RANKS_SPEC_LIMIT = 200  # --ranks: characters (a list of ranges is short; expanding a long one takes long)
SEED_DIGITS = 40  # --seed: NumPy takes any whole number; more digits than this are a mistake
LEVEL = 0.95  # --bootstrap's percentile intervals


def check_tol(tol: Any) -> float:
    """``tol``, the stopping criterion: a number in (0, 1); else ValueError."""
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.floating)) or not 0 < tol < 1:
        raise ValueError(f"--tol must be a number in (0, 1), such as {pln.TOL} (pyPLNmodels' default); got {tol!r}")
    return float(tol)


def check_maxiter(maxiter: Any) -> int:
    """``maxiter``: a positive integer up to ``MAXITER_LIMIT``; else TypeError or ValueError."""
    maxiter = checks.check_positive_int(maxiter, "--maxiter")
    if maxiter > MAXITER_LIMIT:
        raise ValueError(f"--maxiter must be at most {MAXITER_LIMIT:,} (the fit keeps one ELBO per iteration); "
                         f"got {maxiter:,}")
    return maxiter


def parse_ranks(spec: str) -> list[int]:
    """``--ranks``: ``1-10``, ``2,4,6``, ``3`` or a mix (``1-3,5``) as sorted ranks, each once; else ValueError
    naming the part that is wrong."""
    if len(str(spec)) > RANKS_SPEC_LIMIT:
        raise ValueError(f"--ranks {_short(spec)}: too long a list; give ranges, such as 1-10 or 1-5,8,10")
    parts = [part.strip() for part in str(spec).split(",")]
    if not any(parts):
        raise ValueError(f"--ranks needs ranks, such as 1-10, 2,4,6 or 3; got {spec!r}")
    ranges = []
    for part in parts:
        low, dash, high = part.partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise ValueError(f"--ranks {spec}: {part!r} is neither a rank (a whole number, such as 3) nor a range of "
                             "them (such as 1-10)") from None
        if first < 1:
            raise ValueError(f"--ranks {spec}: ranks start at 1 (a rank-q model has q latent dimensions); got {first}")
        if last < first:
            raise ValueError(f"--ranks {spec}: the range {part} runs backwards; write {last}-{first}")
        if last > RANK_LIMIT:
            raise ValueError(f"--ranks {spec}: rank {last} is above {RANK_LIMIT:,}; a rank is at most the number of "
                             "count columns")
        ranges.append(range(first, last + 1))
    return sorted(set(itertools.chain.from_iterable(ranges)))


def ranks_text(ranks: list[int]) -> str:
    """``ranks`` as ``1-10`` where they follow one another, else ``2, 4, 6``."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def check_bootstrap(value: Any) -> int:
    """``--bootstrap``: a whole number of refits from 2 to ``BOOTSTRAP_LIMIT``; else ValueError."""
    try:
        n_boot = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--bootstrap must be a whole number of refits, such as 200; got {_short(repr(value))}") from None
    if n_boot < 2:
        raise ValueError(f"--bootstrap must be at least 2 (the number of refits on resampled rows: 200 is usual); "
                         f"got {n_boot}")
    if n_boot > BOOTSTRAP_LIMIT:
        raise ValueError(f"--bootstrap must be at most {BOOTSTRAP_LIMIT:,} (all refits are held in memory at once); "
                         f"got {n_boot:,}")
    return n_boot


def check_seed(value: Any) -> int:
    """``--seed``: a whole number, 0 or more; else ValueError."""
    if len(str(value).strip()) > SEED_DIGITS:
        raise ValueError(f"--seed must have at most {SEED_DIGITS} digits; got {_short(str(value).strip())}")
    try:
        seed = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--seed must be a whole number, such as 0; got {_short(repr(value))}") from None
    if seed < 0:
        raise ValueError(f"--seed must be 0 or more (NumPy's generators take no negative seed); got {seed}")
    return seed



def check_out(out: str, inputs: dict[str, str | None] | None = None) -> Path:
    """``--out``: a new or existing ``.npz`` file in a folder that exists and can be written, not a symbolic
    link (the command replaces the file it names, through a rename: replacing a link would cut it, writing
    through it would change a file named elsewhere; so it asks for the file's own name), and none of the
    ``inputs`` (their role, such as "counts", and path: the result would replace the data); else ValueError."""
    path = Path(out)
    if path.suffix.lower() != ".npz":
        raise ValueError(f"--out {_short(out)}: the result is a NumPy .npz archive; give a name that ends in .npz "
                         f"(such as {path.with_suffix('.npz').name})")
    if path.is_symlink():
        raise ValueError(f"--out {out} is a symbolic link (to {os.readlink(path)}): the command replaces the file it "
                         "names; give the name of the file itself, or another name")
    if path.is_dir():
        raise ValueError(f"--out {out} is a folder; name a file in it")
    if not path.resolve().parent.is_dir():
        raise ValueError(f"--out: the folder of {out} does not exist")
    if not os.access(path.resolve().parent, os.W_OK):
        raise ValueError(f"--out: the folder of {out} cannot be written: choose another folder")
    for role, given in (inputs or {}).items():
        try:
            same = given is not None and path.exists() and os.path.samefile(path, given)
        except OSError:
            same = False
        if same:
            raise ValueError(f"--out {out} is the {role} file: the result would replace your data; name another file")
    return path
