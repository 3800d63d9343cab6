"""Shared test setup: the quick size, the repository root, the chapters listed in _toc.yml."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("FASTJAX_SIZE", "quick")
ROOT = Path(__file__).resolve().parents[1]
# Chapters executed by tests/test_chapters.py (phase 1), read back by tests/test_site.py (phase 2).
EXECUTED = ROOT / "_build" / "executed"
# What the part chapters measured, read back by the Results page (fastjax.bench.save_part/load_part).
os.environ.setdefault("FASTJAX_MEASUREMENTS", str(ROOT / "_build" / "measurements"))

import pytest  # noqa: E402

from fastjax.setup.colab import toc_files as _toc_files  # noqa: E402


def toc_files() -> list[str]:
    """Every page named in _toc.yml, in order, without suffix (e.g. 'chapters/measuring')."""
    return _toc_files(ROOT)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def pyplnmodels_fit():
    """The unit tests' one pyPLNmodels fit: oaks, its defaults (float32, 400 iterations at most), as
    ``fastjax.pln.bench.fit_pyplnmodels`` returns it: (model, seconds, ELBO per iteration, cumulative
    seconds). Tests that use it carry ``xdist_group("pyplnmodels")``, so that one worker fits once."""
    pytest.importorskip("torch", reason="pyPLNmodels needs torch, which the newest leg does not install")
    from fastjax import pln
    from fastjax.pln import bench as bench_pln

    return bench_pln.fit_pyplnmodels(pln.load_oaks_counts())
