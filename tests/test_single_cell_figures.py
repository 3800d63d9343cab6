"""Part V's single-cell page's race figures (fastjax.scale.single_cell.race_figures), on a made-up race."""

from __future__ import annotations

import pytest

from fastjax.scale import single_cell


def test_the_figures_are_the_race_per_iteration_and_to_the_target():
    result = {"pyplnmodels_iterations": 100, "pyplnmodels_seconds": 10.0, "pyplnmodels_iters_to_target": 50,
              "pyplnmodels_seconds_to_target": 5.0, "jax_iterations": 100, "jax_seconds": 1.0,
              "jax_iters_to_target": 40, "jax_seconds_to_target": 0.4, "jax_compile_seconds": 0.6,
              "jax_part1_seconds": 2.0}
    race, rows = single_cell.race_figures(result)
    assert race["speedup_iter"] == pytest.approx(10.0)
    assert race["speedup_part1_iter"] == pytest.approx(5.0)
    assert race["speedup_target"] == pytest.approx(12.5)
    assert race["speedup_target_compile"] == pytest.approx(5.0)
    assert [r[""] for r in rows] == ["pyPLNmodels (torch)", "JAX, Part I's fit", "JAX, Part VI's fit"]
