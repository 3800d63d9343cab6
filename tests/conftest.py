"""Shared test setup: the quick size, the repository root, the chapters listed in _toc.yml."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("FASTJAX_SIZE", "quick")
ROOT = Path(__file__).resolve().parents[1]
# JAX's persistent compilation cache, for the tests only: a chapter executed twice (nbmake, then the
# book build) compiles once. Published builds do not set it, so the compile times they show are real.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / "_build" / "jax-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import pytest  # noqa: E402
import yaml  # noqa: E402


def toc_files() -> list[str]:
    """Every file named in _toc.yml, in order, without suffix (e.g. 'chapters/measuring')."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                out.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc.get("parts", []))
    return out


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
