"""The race against PyTorch (fastjax.resnet.race, chapters/resnet/08-pytorch.md): contenders that restart from
the same weights without compiling again and train the same way, the per-step race with a contender that cannot
compile left out and named, the training run's ratios, the profiles of each side, the first call in a fresh
process with JAX's persistent cache, and the ratios the issue asks for."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import fastjax  # noqa: F401  (before JAX)

torch = pytest.importorskip("torch", reason="the race needs torch, which the newest leg does not install")

from fastjax.resnet import ladder, race as B, resnet_nnx, rungs as R, torch_twin as T, twin_check as C  # noqa: E402
from fastjax.resnet.resnet_nnx import ResNetConfig  # noqa: E402

pytestmark = pytest.mark.pinned

CONFIG = ResNetConfig(width=4, stages=2, blocks=1)
# Eight channels at least: torch 2.13's oneDNN corrupts the heap (the process aborts: "corrupted double-linked
# list") computing the kernel gradient of a 1×1, stride-2 convolution in channels_last, float32, on one thread,
# with 4 or 6 input channels on an 8×8 image, on an AVX2 CPU (AMD EPYC; 8 or 16 channels, or 2 threads, run
# fine). CONFIG's strided shortcut takes 4 channels, so the tests that run PyTorch in channels_last in float32
# (the tuned contender, oneDNN's kernels alone) use a network whose shortcut takes 8 (the book's sizes do).
CL_CONFIG = ResNetConfig(width=8, stages=2, blocks=1)
BATCH = 16


@pytest.fixture(scope="module")
def batches():
    return ladder.training_batches(6, BATCH)


@pytest.fixture(scope="module")
def floor_losses(batches):
    xs, ys = batches
    return ladder.trajectory(ladder.build("floor", CONFIG), xs, ys)


@pytest.fixture(scope="module")
def race():
    return B.contenders((B.TORCH_EAGER, "floor", B.FASTER_FLOOR), CONFIG)

def test_contenders_train_the_same_and_restart(race, batches, floor_losses):
    xs, ys = batches
    eager = B.train_losses(race[B.TORCH_EAGER], xs, ys)
    twin = T.from_weights(resnet_nnx.weights(resnet_nnx.make_model(CONFIG, seed=0)), CONFIG)
    opt = torch.optim.Adam(twin.parameters(), lr=R.LEARNING_RATE)  # the twin that tests/test_torch_twin.py checks
    np.testing.assert_array_equal(eager, [float(T.torch_train_step(twin, opt, *T.to_torch(x, y))) for x, y in zip(xs, ys)])
    np.testing.assert_array_equal(B.train_losses(race["floor"], xs, ys), floor_losses)  # the same program
    np.testing.assert_array_equal(B.train_losses(race[B.TORCH_EAGER], xs, ys), eager)  # reset: the same start
    assert race["floor"].first_call > 0 and race[B.TORCH_EAGER].first_call > 0


@pytest.fixture(scope="module")
def floor64():
    return C.jax_float64_run(CONFIG, *ladder.training_batches(C.CHECK_STEPS, BATCH))  # Part II's floor in float64


@pytest.mark.parametrize("name", [n for n, (_, _, mode) in B.TORCH_WAYS.items() if mode is None])
def test_each_pytorch_way_trains_as_the_floor_in_float64(name, floor64):
    # each tuning (channels_last, fused or foreach Adam, both) passes the same float64 check as the twin first written
    gaps = B.check_torch_way(name, CONFIG, BATCH, floor64)
    assert set(gaps) == {"logits", "first gradient", "weights", "running means", "running variances"}


def test_the_whole_step_under_torch_compile_trains_as_the_floor_in_float64():
    # the full race's torch.compile of the tuned step, Adam included (its first call compiles: seconds)
    name = B.WHOLE_STEP["default"]
    assert set(B.race_settings().torch_ways) <= set(B.TORCH_WAYS)
    gaps = B.check_torch_way(name, ResNetConfig(width=2, stages=1, blocks=1), 8)
    assert set(gaps) == {"logits", "first gradient", "weights", "running means", "running variances"}


def test_the_tuned_contender_runs_channels_last_with_fused_adam(batches):
    xs, ys = batches
    c = B.contenders((B.TORCH_TUNED,), CL_CONFIG)[B.TORCH_TUNED]
    losses = B.train_losses(c, xs, ys)
    model, opt = c.extra["model"], c.extra["optimizer"]()
    assert model.stem.weight.is_contiguous(memory_format=torch.channels_last)
    assert opt.defaults["fused"] is True and np.all(np.isfinite(losses))
    with pytest.raises(ValueError, match="unknown PyTorch contender"):
        B.torch_way("PyTorch fast")


def test_waited_each_step_times_both_ways_and_restarts(race, batches, floor_losses):
    out = B.waited_each_step(race, ("floor",), BATCH, repeats=2)
    assert set(out) == {"floor"} and out["floor"]["async"].median > 0 and out["floor"]["each"].median > 0
    xs, ys = batches
    np.testing.assert_array_equal(B.train_losses(race["floor"], xs, ys), floor_losses)  # reset afterwards


def test_race_step_times_every_contender_and_reports_threads(race):
    out = B.race_step(race, BATCH, repeats=2)
    assert set(out["timings"]) == set(race) and out["failed"] == {}
    assert all(out["compile"][n] >= 0 for n in race)
    assert out["threads"]["torch"] == torch.get_num_threads() and out["threads"]["cpus"] >= 1


def test_a_contender_that_cannot_compile_is_reported_and_left_out(race):
    def broken(x, y):
        raise RuntimeError("InductorError: no C++ compiler found\nmore text")

    c = B.Contender("torch.compile", lambda: None, broken, T.to_torch, lambda i, l: 0.0)
    out = B.race_step({**race, "torch.compile": c}, BATCH, repeats=1)
    assert out["failed"] == {"torch.compile": "RuntimeError: InductorError: no C++ compiler found"}
    assert "torch.compile" not in out["timings"] and set(out["timings"]) == set(race)


def test_race_run_reports_time_to_target_and_ratios(race):
    out = B.race_run(race, BATCH, steps=4, every=2, target=0.0, rounds=2, compile_seconds={B.TORCH_EAGER: 0.1})
    assert out["checks"] == [2, 4] and all(k == 2 for k in out["steps_to_target"].values())
    eager = out["contenders"][B.TORCH_EAGER]
    assert eager["x_eager_run"]["median"] == 1.0 and len(eager["run_seconds"]) == 2
    assert eager["threads"].startswith("PyTorch") and "why" in eager["x_eager_run_compile_included"]
    assert eager["run_compile_included"]["median"] == pytest.approx(eager["run"]["median"] + 0.1)
    assert all(len(a) == 2 for a in out["accuracy"].values())
    with pytest.raises(ValueError, match="multiple of every"):
        B.race_run(race, BATCH, steps=5, every=2, target=0.0, rounds=1, compile_seconds={})


def test_profiles_split_each_side_by_kind(race, batches):
    xs, ys = batches
    pt = B.profile_torch(race[B.TORCH_EAGER], xs[0], ys[0], steps=2)
    assert {k for k, _ in B.TORCH_KINDS} <= set(pt) and pt["convolutions, forward"] > 0
    assert pt["step, profiled"] >= sum(v for k, v in pt.items() if k != "step, profiled") * (1 - 1e-9)
    pj = B.profile_jax(race["floor"], xs[0], ys[0], steps=2)
    assert pj["convolutions, forward"] > 0 and pj["convolutions, backward"] > 0
    with pytest.raises(ValueError, match="floor-type contender"):
        B.profile_jax(race[B.TORCH_EAGER], xs[0], ys[0])



def test_unknown_contenders_are_refused():
    with pytest.raises(ValueError, match="unknown JAX contender"):
        B.contenders(("nnx.vmap",), CONFIG)


def test_race_sweep_times_each_width_against_eager():
    out = B.race_sweep((2, 4), (B.TORCH_EAGER, "floor"), repeats=1)
    assert out["widths"] == [2, 4] and [len(v) for v in out["seconds"].values()] == [2, 2]
    assert out["x_eager"][B.TORCH_EAGER] == [1.0, 1.0]
    assert [r.slow for r in out["ratios"]["floor"]] == [B.TORCH_EAGER] * 2


def test_the_step_race_gives_pytorch_its_faster_thread_setting(race):
    from fastjax.tools import timing

    out = B.race_step(race, BATCH, repeats=2)
    eager = out["timings"][B.TORCH_EAGER]
    assert set(eager.extra["threads_tried"]) == {f"PyTorch {n} thread{'s' if n > 1 else ''}" for n in timing.thread_settings()}
    assert eager.extra["threads"] in eager.extra["threads_tried"]
    assert out["timings"]["floor"].extra["threads"].startswith("XLA ")


def test_cached_first_call_runs_two_fresh_processes():
    out = B.cached_first_call("floor", ResNetConfig(width=2, stages=1, blocks=1), BATCH)
    assert set(out) == {"cold_cache_seconds", "cold_cache_cpu_seconds", "warm_cache_seconds", "warm_cache_cpu_seconds"}
    assert all(v > 0 for v in out.values())
    with pytest.raises(RuntimeError, match="fresh process for 'nnx.vmap' failed"):
        B.cached_first_call("nnx.vmap", ResNetConfig(width=2, stages=1, blocks=1), BATCH)


def race_result(load=0.0):
    from fastjax.tools.timing import Ratio, Timing

    t = {B.TORCH_EAGER: Timing(B.TORCH_EAGER, [4e-3] * 3, load=load), "torch.compile": Timing("torch.compile", [3e-3] * 3),
         B.TORCH_TUNED: Timing(B.TORCH_TUNED, [2.5e-3] * 3), "nnx.jit": Timing("nnx.jit", [5e-3] * 3), "floor": Timing("floor", [2e-3] * 3)}
    runs = {B.TORCH_EAGER: {"run_seconds": [4.0, 4.0], "compile_seconds": 0.0},
            "floor": {"run_seconds": [2.0, 2.0], "compile_seconds": 2.0,
                      "x_eager_run_compile_included": {"median": 1.0, "why": "busy" if load else ""}}}
    return {"step": {"timings": t}, "best_jax": "floor", "run": {"steps": 600, "contenders": runs},
            "cached_first_call": {"warm_cache_seconds": 0.002},
            "sweep": {"widths": [2], "ratios": {"floor": [Ratio(B.TORCH_EAGER, "floor", 3.0)]}}}


def test_race_ratios_reads_the_figures_of_a_quiet_race():
    from fastjax.tools.timing import Timing

    result = race_result()
    r = {k: v.value for k, v in B.race_ratios(result).items()}
    assert r["floor / PyTorch eager, per step"] == 2.0 and r["floor / torch.compile, per step"] == 1.5
    assert r["floor / PyTorch tuned (the fastest PyTorch contender), per step"] == 1.25
    assert r["floor / PyTorch eager, 600-step run, compile included"] == 1.0
    assert r["floor / PyTorch eager, 600-step run, compile from the persistent cache"] == 2.0  # warm: no compile left
    assert r["nnx.jit / PyTorch eager, per step"] == 0.8 and r["floor / PyTorch eager, per step, width 2"] == 3.0
    result["kernels_alone"] = {"timings": {B.KERNELS_ALONE_XLA: Timing(B.KERNELS_ALONE_XLA, [1e-3] * 3)}}
    assert B.race_ratios(result)["PyTorch tuned / the patches products alone (the ceiling of a step built on them)"].value == 2.5


def test_race_ratios_of_a_busy_race_are_not_measured():
    r = B.race_ratios(race_result(load=1.8))
    for key in ("floor / PyTorch eager, per step", "nnx.jit / PyTorch eager, per step",
                "floor / PyTorch eager, 600-step run, compile included",
                "floor / PyTorch eager, 600-step run, compile from the persistent cache"):
        assert r[key].value is None and r[key].text().startswith("not measured"), key
    assert r["floor / torch.compile, per step"].value == 1.5  # neither side of that one was busy


def test_conv_kernels_times_each_stage_on_each_side():
    t = B.conv_kernels(CONFIG, BATCH, repeats=1)
    assert len(t) == 2 * 4 * 2  # stages × sides × directions
    assert "PyTorch backward, stage 1 (4×4, 8 channels)" in t and "Part VI patches forward, stage 0 (8×8, 4 channels)" in t
    assert "PyTorch channels_last forward, stage 1 (4×4, 8 channels)" in t


def test_jitted_accuracies_match_the_eager_ones():
    from fastjax.resnet import digits, resnet_eqx, resnet_nnx

    sp = digits.split()
    model = resnet_nnx.make_model(CONFIG, seed=0)
    assert B.nnx_accuracy(model, sp.test_images, sp.test_labels) == resnet_nnx.accuracy(model, sp.test_images, sp.test_labels)
    twin, state = resnet_eqx.from_nnx(model)
    assert B.eqx_accuracy(twin, state, sp.test_images, sp.test_labels) == resnet_eqx.accuracy(twin, state, sp.test_images,
                                                                                               sp.test_labels)


ONEDNN_3_LOG = """onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with Intel DL Boost and bfloat16 support
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcd::f0 dst:f32:p:blocked:Acdb16a::f0,attr-scratchpad:user,,8x1x3x3,0.0039
onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx512_core,forward_training,src:f32:a:blocked:abcd::f0 wei:f32:ap:blocked:Acdb16a::f0 bia:undef::undef::: dst:f32:ap:blocked:aBcd16b::f0,attr-scratchpad:user,alg:convolution_direct,mb32_ic1oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,0.019
onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32:p:blocked:aBcd16b::f0 dst:f32::blocked:abcd::f0,attr-scratchpad:user,,32x8x8x8,0.0068
onednn_verbose,v1,primitive,exec,cpu,convolution,jit:avx2,backward_weights,src:f32:a:blocked:aBcd8b::f0 wei:f32:ap:blocked:ABcd8b8a::f0 bia:undef::undef::: dst:f32:ap:blocked:aBcd8b::f0,attr-scratchpad:user,alg:convolution_direct,mb32_ic8oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,0.02
"""
ONEDNN_2_LOG = """onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:abcd:f0 wei_f32::blocked:Acdb8a:f0 bia_undef::undef::f0 dst_f32::blocked:aBcd8b:f0,,alg:convolution_direct,mb32_ic1oc8_ih8oh8kh3sh1dh0ph1_iw8ow8kw3sw1dw0pw1,0.02
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:aBcd8b:f0 dst_f32::blocked:abcd:f0,,,32x8x8x8,0.007
"""


def test_parse_onednn_log_reads_kernels_layouts_and_reorders():
    new = B.parse_onednn_log(ONEDNN_3_LOG)
    assert new["implementations"] == ["jit:avx2", "jit:avx512_core"] and new["channel_blocks"] == [16, 8]
    assert new["layouts"] == ["aBcd16b", "aBcd8b", "abcd"] and new["convolutions"] == 2
    assert (new["activation reorders"], new["weight reorders"]) == (1, 1)
    old = B.parse_onednn_log(ONEDNN_2_LOG)
    assert old["implementations"] == ["jit:avx2"] and old["channel_blocks"] == [8] and old["activation reorders"] == 1
    assert B.parse_onednn_log("no log here")["convolutions"] == 0 and B.parse_onednn_log("")["channel_blocks"] == []


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")
def test_onednn_convolutions_reads_one_step_of_the_twin(race, batches, capfd):
    xs, ys = batches
    out = B.onednn_convolutions(race[B.TORCH_EAGER], xs[0], ys[0])
    assert out["isa"] == torch.backends.cpu.get_cpu_capability()
    assert out["convolutions"] > 6  # six convolutions forward (stem, two per block, one shortcut), more backward
    assert "onednn_verbose" not in capfd.readouterr().out  # the log went to the file, not to the page


def test_threads_sets_both_sides_before_jax_starts(tmp_path):
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "fastjax.resnet.race", "--threads", "1", "--first-call", "floor", "--cache-dir",
           str(tmp_path), "--config", "2", "1", "1", "--batch", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    threads = json.loads(done.stdout.strip().splitlines()[-1])["threads"]
    assert threads["torch"] == 1 and threads["xla"] in (1, None)  # None: no /proc to count XLA's threads in
    bad = subprocess.run(cmd[:4] + ["0"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--threads must be at least 1" in bad.stderr


def test_the_race_checks_the_faster_floor_in_float64(floor64):
    # chapters/resnet/08-pytorch.md checks Part VI's floor this way before it races
    assert B.check_faster_floor(CONFIG, BATCH, floor64) < ladder.WEIGHT_ATOL_F64


def test_the_float64_check_fails_a_faster_floor_that_drifts(floor64, monkeypatch):
    # a step that adds 1e-6 to one weight each step: far below float32's drift, far above float64's rounding
    real = B.FL.faster_floor_step

    def drifting(graphdef, treedef):
        step = real(graphdef, treedef)

        def run(leaves, x, y):
            leaves, loss = step(leaves, x, y)
            return [leaves[0] + 1e-6, *leaves[1:]], loss
        return run

    monkeypatch.setattr(B.FL, "faster_floor_step", drifting)
    with pytest.raises(AssertionError, match="Not equal to tolerance"):
        B.check_faster_floor(CONFIG, BATCH, floor64)


def test_network_convs_reads_every_convolution_of_the_network():
    convs = B.network_convs(CONFIG, BATCH)
    model = resnet_nnx.make_model(CONFIG)
    kernels = [m.kernel[...].shape for _, m in nnx.iter_modules(model) if isinstance(m, nnx.Conv)]
    assert sorted(c["kernel"] for c in convs) == sorted(kernels)
    assert convs[0]["input"] == (BATCH, 8, 8, 1)
    assert [c["output"][1] for c in convs] == [c["input"][1] // c["strides"][0] for c in convs]


def test_conv_products_are_three_per_convolution_but_the_images_gradient():
    convs, rows = B.network_convs(CONFIG, BATCH), B.conv_products(CONFIG, BATCH)
    assert len(rows) == 3 * len(convs) - 1
    first = [r["product"] for r in rows if r["conv"] == 0]
    assert first == ["forward", "kernel gradient"]
    for r in rows:  # every product of one convolution does the forward's flops
        c = convs[r["conv"]]
        kh, kw, c_in, c_out = c["kernel"]
        assert r["flops"] == 2 * np.prod(c["output"][:3]) * kh * kw * c_in * c_out




def test_kernels_alone_times_both_sides():
    out = B.kernels_alone(CL_CONFIG, BATCH, repeats=1)
    assert set(out["timings"]) == {B.KERNELS_ALONE_XLA, B.KERNELS_ALONE_ONEDNN}
    assert out["products"] == len(B.conv_products(CL_CONFIG, BATCH))
    assert out["flops"] == sum(r["flops"] for r in B.conv_products(CL_CONFIG, BATCH))
    assert all(t.median > 0 for t in out["timings"].values())


def test_a_whole_step_contender_raises_dynamos_recompile_limit():
    torch._dynamo.config.recompile_limit = 8
    B.torch_way(B.WHOLE_STEP["default"])
    assert torch._dynamo.config.recompile_limit == B.TORCH_RECOMPILE_LIMIT
