"""Helpers that build a page's evidence from its measurements (moved out of chapters/pln and
chapters/resnet pages): what they check and say, on small inputs. The pages run them on real ones."""

import numpy as np
import pytest

from fastjax.pln import bench as bench_pln
from fastjax.resnet import bench as bench_resnet, ladder, multisteps


def test_multisteps_moves_once_where_k_steps_move_k_times():
    moves, w_multi, w_k = multisteps.against_k_steps(4)
    assert moves == 1 and abs(w_k - 3) < abs(w_multi - 3)


def test_trend_says_which_way_a_ratio_went():
    over = {116: {"2 jit": 3.0}, 1160: {"2 jit": 1.5}}
    assert bench_pln.trend(over, "2 jit", ".1f") == "3.0× at n = 116 and 1.5× at n = 1,160 (fell)"
    over[1160]["2 jit"] = 3.1
    assert bench_pln.trend(over, "2 jit", ".1f").endswith("(changed by less than 10 %)")


def test_return_rows_pair_each_width_with_return_and_result():
    sweep = {"widths": [8, 16], "return_seconds": {"floor": [0.001, 0.002]}, "result_seconds": {"floor": [0.002, 0.004]}}
    rows, share = bench_resnet.return_rows(sweep)
    assert rows == [{"width": 8, "floor: return / result (ms)": "1 / 2"}, {"width": 16, "floor: return / result (ms)": "2 / 4"}]
    assert share == {"floor": 0.5}


def test_assert_same_step_fails_a_weight_off_by_more_than_its_bound():
    w = {"a": np.ones(3, np.float32), "b.bias": np.zeros(2, np.float32)}
    losses = np.array([2.0, 1.5], np.float32)
    ladder.assert_same_step(losses, w, losses, w, "same")
    with pytest.raises(AssertionError):
        ladder.assert_same_step(losses, {**w, "a": w["a"] * (1 + 10 * ladder.SAME_STEP_RTOL)}, losses, w, "off")
    with pytest.raises(AssertionError):
        ladder.assert_same_step(losses * (1 + 10 * ladder.SAME_STEP_RTOL), w, losses, w, "losses off")
    assert ladder.weight_drift({**w, "a": w["a"] + 0.5}, w) == pytest.approx(0.5)


def quiet_race():
    from fastjax.resnet import race as B
    from fastjax.tools.timing import Ratio, Timing

    t = {B.TORCH_EAGER: Timing(B.TORCH_EAGER, [4e-3] * 3), B.TORCH_TUNED: Timing(B.TORCH_TUNED, [2.5e-3] * 3),
         "nnx.jit": Timing("nnx.jit", [5e-3] * 3), "floor": Timing("floor", [2e-3] * 3)}
    runs = {B.TORCH_EAGER: {"run_seconds": [4.0, 4.0], "compile_seconds": 0.0},
            "floor": {"run_seconds": [2.0, 2.0], "compile_seconds": 2.0,
                      "x_eager_run_compile_included": {"median": 1.0, "why": ""}}}
    sweep = {"widths": [2, 8], "ratios": {"floor": [Ratio(B.TORCH_EAGER, "floor", 3.0), Ratio(B.TORCH_EAGER, "floor", 1.5)]}}
    return B, t, {"steps": 600, "contenders": runs}, sweep


def test_the_pytorch_pages_answer_reads_a_quiet_race():
    B, t, run, sweep = quiet_race()
    cached = B.cached_run_ratio(run, t, "floor", {"warm_cache_seconds": 0.002})
    assert cached.value == 2.0  # a warm cache leaves no compile: 4 s against 2 s
    rows, per_step, rest = B.answer(t, run, "floor", cached)
    assert [r["measured"] for r in rows] == ["1.25", "2.00", "1.00", "2.00", "0.80"]
    assert per_step == ("Against the fastest PyTorch contender, PyTorch tuned, the fastest JAX step (floor) runs at "
                        "1.25× its speed per step.")
    assert "PyTorch tuned alone runs at 1.60×" in rest and "torch.compile races at the full size only" in rest
    assert B.sweep_said(sweep) == "The floor runs at 3.00× PyTorch eager's speed at width 2 and 1.50× at width 8."


def test_the_pytorch_pages_answer_says_why_a_busy_race_has_no_ratio():
    B, t, run, _ = quiet_race()
    run["contenders"]["floor"]["x_eager_run_compile_included"]["why"] = "busy"
    cached = B.cached_run_ratio(run, t, "floor", {"warm_cache_seconds": 0.002})
    assert cached.value is None
    _, per_step, rest = B.answer(t, run, "floor", cached)
    assert "no ratio is given" in per_step and rest == "The tables on this page give the medians each side measured."


def test_the_pln_race_sentence_gives_the_ratios_of_a_quiet_race_and_why_not_of_a_busy_one():
    from fastjax.tools.timing import Ratio

    keys = ("converge_compile_excluded", "part1_converge_compile_excluded", "converge_compile_included",
            "converge_cache_warm")
    race = {"ratios": {k: Ratio("pyPLNmodels", "JAX", v) for k, v in zip(keys, (12.0, 6.0, 0.75, 2.5))}}
    said = bench_pln.race_sentence(race)
    assert "converges 12.0× faster with compile time apart (Part I's own fit: 6.0×), 0.75× with it" in said
    race["ratios"]["converge_cache_warm"] = Ratio("pyPLNmodels", "JAX", None, "busy")
    assert "no ratio is given" in bench_pln.race_sentence(race)
