"""Part V's helpers: the single-cell loader (pln.load_scrna_counts) and fastjax.scale.sharding's checks.

The device tests run in fresh subprocesses: the CPU device count is fixed when JAX's backend starts,
and this test process may already have started it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from importlib.util import find_spec

import numpy as np
import pytest

from fastjax import pln
from fastjax.scale import sharding

needs_pyplnmodels_data = pytest.mark.skipif(find_spec("pyPLNmodels") is None, reason="the data ships with pyPLNmodels")


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


# ----------------------------------------------------------------------------- the single-cell loader

@needs_pyplnmodels_data
def test_load_scrna_counts_reads_the_first_cells_and_genes():
    import pandas as pd

    data = pln.load_scrna_counts(30, 40)
    raw = pd.read_csv(pln.data_folder("scRT") / "counts.csv", nrows=30).to_numpy()[:, :40]
    keep = raw.sum(axis=0) > 0
    np.testing.assert_array_equal(data.counts, raw[:, keep])
    n, p, d = data.shape
    assert (n, d) == (30, 1) and p == keep.sum()
    np.testing.assert_array_equal(data.offsets, 0.0)
    np.testing.assert_array_equal(data.covariates, 1.0)
    assert data.log_factorial == pytest.approx(float(np.sum(pln.log_stirling(data.counts))))


@needs_pyplnmodels_data
@pytest.mark.parametrize("n, p, match", [(2001, 10, "n_samples must be at most 2000"),
                                         (10, 3001, "dim must be at most 3000"),
                                         (0, 10, "n_samples must be positive"),
                                         (10, -1, "dim must be positive")])
def test_load_scrna_counts_refuses_sizes_it_does_not_have(n, p, match):
    with pytest.raises(ValueError, match=match):
        pln.load_scrna_counts(n, p)


def test_load_scrna_counts_refuses_a_non_integer():
    with pytest.raises(TypeError, match="n_samples must be an integer"):
        pln.load_scrna_counts(10.5, 10)


@needs_pyplnmodels_data
def test_load_scrna_counts_matches_pyplnmodels_own_loader():
    pytest.importorskip("torch")
    import pyPLNmodels

    ours = pln.load_scrna_counts(50, 60)
    theirs = pyPLNmodels.load_scrna(n_samples=50, dim=60)["endog"].to_numpy()
    theirs = theirs[:, theirs.sum(axis=0) > 0]
    np.testing.assert_array_equal(ours.counts, theirs)


# ----------------------------------------------------------------------------- sharding checks

def test_check_divisible_names_both_numbers_and_the_fix():
    with pytest.raises(ValueError) as err:
        sharding.check_divisible(116, 8)
    text = str(err.value)
    assert "116" in text and "8 devices" in text and "[1, 2, 4]" in text and "first 112" in text
    sharding.check_divisible(112, 8)  # divisible: no error


@pytest.mark.parametrize("n, k", [(0, 2), (4, 0), (True, 2)])
def test_check_divisible_refuses_non_positive_counts(n, k):
    with pytest.raises((TypeError, ValueError)):
        sharding.check_divisible(n, k)


def test_count_collectives_counts_instructions_not_names():
    hlo = textwrap.dedent("""\
        %all-reduce.1 = f32[] all-reduce(f32[] %x), replica_groups={}, to_apply=%add
        %ar = (f32[4]{0}, f32[]) all-reduce(f32[4]{0} %a, f32[] %b), to_apply=%add
        %ags = f32[8]{0} all-gather-start(f32[1]{0} %y), dimensions={0}
        %agd = f32[8]{0} all-gather-done(f32[8]{0} %ags)
        %fusion = f32[] fusion(f32[] %all-reduce.1), kind=kLoop, calls=%fused
        ROOT %t = (f32[]) tuple(%fusion)""")
    got = sharding.count_collectives(hlo)
    assert got["all-reduce"] == 2 and got["all-gather"] == 1 and got["reduce-scatter"] == 0


def test_count_collectives_wants_text():
    with pytest.raises(TypeError, match="HLO text"):
        sharding.count_collectives(None)
    with pytest.raises(TypeError, match="HLO text"):
        sharding.collectives_per_call(b"HloModule m")


LOOP_HLO = textwrap.dedent("""\
    HloModule m

    %add (a: f32[], b: f32[]) -> f32[] {
      ROOT %s = f32[] add(f32[] %a, f32[] %b)
    }

    %inner_body (p: (s32[], f32[])) -> (s32[], f32[]) {
      %ags = (f32[1]{0}, f32[2]{0}) all-gather-start(f32[1]{0} %y), dimensions={0}
      %agd = f32[2]{0} all-gather-done((f32[1]{0}, f32[2]{0}) %ags)
      ROOT %t = (s32[], f32[]) tuple(%i, %x)
    }

    %inner_cond (p: (s32[], f32[])) -> pred[] {
      ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
    }

    %body (p: (s32[], f32[])) -> (s32[], f32[]) {
      %ar.1 = f32[] all-reduce(f32[] %x), replica_groups={}, to_apply=%add
      %ar.2 = (f32[4]{0}, f32[]) all-reduce(f32[4]{0} %a, f32[] %b), to_apply=%add
      %w = (s32[], f32[]) while((s32[], f32[]) %t0), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
      ROOT %t = (s32[], f32[]) tuple(%i, %x)
    }

    %cond (p: (s32[], f32[])) -> pred[] {
      ROOT %lt = pred[] compare(s32[] %i, s32[] %n), direction=LT
    }

    ENTRY %main (x: f32[]) -> (s32[], f32[]) {
      %ar.0 = f32[] all-reduce(f32[] %x), replica_groups={}, to_apply=%add
      ROOT %w = (s32[], f32[]) while((s32[], f32[]) %t0), condition=%cond, body=%body, metadata={op_name="jit(f)/while/body"}, backend_config={"known_induction_variable":{"tuple_index":"0"},"known_trip_count":{"n":"10"}}
    }
    """)


def test_collectives_per_call_counts_executions_not_instructions():
    """3 all-reduce and 1 all-gather instructions; one call runs 1 + 10 × 2 all-reduces and 10 × 3
    all-gathers (a loop of 3 trips inside a loop of 10)."""
    assert sharding.count_collectives(LOOP_HLO)["all-reduce"] == 3
    assert sharding.count_collectives(LOOP_HLO)["all-gather"] == 1
    executed = sharding.collectives_per_call(LOOP_HLO)
    assert executed["all-reduce"] == 21 and executed["all-gather"] == 30 and executed["reduce-scatter"] == 0


def test_collectives_per_call_refuses_what_the_text_does_not_tell():
    unknown = LOOP_HLO.replace(',"known_trip_count":{"n":"10"}', "")
    with pytest.raises(ValueError, match="does not know its trip count"):
        sharding.collectives_per_call(unknown)
    branchy = LOOP_HLO.replace(
        "  ROOT %w = (s32[], f32[]) while((s32[], f32[]) %t0), condition=%cond",
        "  %c = f32[] conditional(pred[] %p, f32[] %x, f32[] %x), true_computation=%body, false_computation=%add\n"
        "  ROOT %w = (s32[], f32[]) while((s32[], f32[]) %t0), condition=%cond")
    with pytest.raises(ValueError, match="conditional branch"):
        sharding.collectives_per_call(branchy)
    with pytest.raises(ValueError, match="no ENTRY"):
        sharding.collectives_per_call("%add (a: f32[]) -> f32[] {\n}\n")


def test_collectives_per_call_on_a_compiled_scan():
    """A real program: a scan of 7 steps over an array split over 2 devices, each step summing it.
    XLA compiles one all-reduce instruction into the loop's body; one call runs it 7 times."""
    out = run_python("""
        import fastjax
        from fastjax.scale import sharding
        sharding.use_cpu_devices(2)
        import jax, jax.numpy as jnp
        x = sharding.shard_rows(jnp.arange(8.0), sharding.sample_mesh(2, explicit=False))
        step = lambda c, _: (jnp.tanh(c + c.sum()), None)
        hlo = jax.jit(lambda v: jax.lax.scan(step, v, length=7)[0]).lower(x).compile().as_text()
        print(sharding.count_collectives(hlo)["all-reduce"], sharding.collectives_per_call(hlo)["all-reduce"])
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "7"]


def test_import_fastjax_does_not_start_the_backend():
    out = run_python("""
        import fastjax, fastjax.pln, fastjax.scale.sharding
        from fastjax.scale import sharding
        import jax
        print(sharding.backend_started())
        jax.config.update("jax_num_cpu_devices", 2)  # JAX refuses this once its backend has started
        print(len(jax.devices("cpu")))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["False", "2"]


def test_use_cpu_devices_before_the_backend_gives_that_many_devices():
    out = run_python("""
        import fastjax
        from fastjax.scale import sharding
        sharding.use_cpu_devices(4)
        import jax
        mesh = sharding.sample_mesh()
        x = sharding.shard_rows(jax.numpy.arange(8.0), mesh)
        print(len(jax.devices()), len(x.addressable_shards), sharding.use_cpu_devices(4))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "4", "4"]


THREADS = """
    import os
    import fastjax
    from fastjax.scale import sharding
    sharding.use_cpu_devices(4)
    import jax
    jax.numpy.ones(3).block_until_ready()
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(os.environ["PJRT_NPROC"], names.count("tf_XLAEigen"))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="counts threads by name under /proc (Linux)")
@pytest.mark.parametrize("preset, expected", [(None, ["8", "8"]), ("5", ["5", "5"])])
def test_use_cpu_devices_gives_xla_two_threads_per_device_unless_told_otherwise(monkeypatch, preset, expected):
    # one thread per device let an all-reduce wait forever (tests/test_exercises_scale.py); a PJRT_NPROC
    # the user set is kept. XLA makes max(PJRT_NPROC, devices) threads in its pool, named tf_XLAEigen.
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    if preset:
        monkeypatch.setenv("PJRT_NPROC", preset)
    out = run_python(THREADS)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == expected


@pytest.mark.parametrize("n", [sharding.MAX_CPU_DEVICES + 1, 10**6])
def test_use_cpu_devices_refuses_more_than_its_maximum(n):
    with pytest.raises(ValueError, match=rf"must be at most {sharding.MAX_CPU_DEVICES}; got {n:,}"):
        sharding.use_cpu_devices(n)  # refused before JAX is touched: safe in this process


def test_use_cpu_devices_after_the_backend_started_names_the_fix():
    out = run_python("""
        import fastjax, jax
        from fastjax.scale import sharding
        jax.numpy.ones(1).block_until_ready()
        try:
            sharding.use_cpu_devices(8)
        except RuntimeError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    assert "asked for 8 CPU devices" in out.stdout and "already started with 1" in out.stdout
    assert "Restart the kernel" in out.stdout and "before any JAX computation" in out.stdout


def test_shard_rows_refuses_rows_the_mesh_cannot_split():
    out = run_python("""
        import fastjax
        from fastjax.scale import sharding
        sharding.use_cpu_devices(4)
        import numpy as np
        mesh = sharding.sample_mesh(4)
        try:
            sharding.shard_rows(np.zeros((6, 2)), mesh)
        except ValueError as err:
            print(err)
        try:
            sharding.sample_mesh(5)
        except ValueError as err:
            print(err)
    """)
    assert out.returncode == 0, out.stderr
    assert "6 rows do not split evenly over 4 devices" in out.stdout
    assert "at most the 4 devices" in out.stdout


def test_shard_rows_with_an_axis_the_mesh_lacks_names_its_axes():
    mesh = sharding.sample_mesh(1)  # one device of whatever backend this process has
    with pytest.raises(ValueError, match=r"axis 'batch' is not an axis of the mesh; its axes are \('samples',\)"):
        sharding.shard_rows(np.zeros((4, 2)), mesh, axis="batch")


# ----------------------------------------------------------------------------- "the same fit"

def _fit(shift_m=0.0, shift_last=0.0, seed=0):
    rng = np.random.default_rng(seed)
    m, s = rng.normal(size=(20, 5)), rng.uniform(0.1, 1, size=(20, 5))
    elbos = -1000.0 + np.arange(10.0)
    elbos[-1] *= 1 + shift_last
    return m + shift_m, s, elbos


def test_check_same_fit_accepts_a_fit_within_the_yardstick():
    ref32, ref64 = _fit(), _fit(shift_m=1e-3, shift_last=1e-5)
    got, yard = sharding.check_same_fit(_fit(shift_m=2e-3, shift_last=-5e-5), ref32, ref64, final_gap=pln.TARGET_GAP)
    assert got["m"] == pytest.approx(2e-3) and yard["m"] == pytest.approx(1e-3)
    assert got["final"] == pytest.approx(5e-5) and got["first"] == 0


@pytest.mark.parametrize("fit, match", [(_fit(shift_m=1e-2), "^m: "), (_fit(shift_last=1e-3), "^final: ")])
def test_check_same_fit_names_the_gap_that_is_too_large(fit, match):
    with pytest.raises(AssertionError, match=match):
        sharding.check_same_fit(fit, _fit(), _fit(shift_m=1e-3, shift_last=1e-5), final_gap=pln.TARGET_GAP)


def test_check_same_fit_takes_the_final_gap_it_is_given():
    ref32, ref64 = _fit(), _fit(shift_m=1e-3, shift_last=1e-5)
    late = _fit(shift_last=1e-3)  # final ELBO 0.1 % off: past the book's 0.05 %, within 0.2 %
    with pytest.raises(AssertionError, match="^final: "):
        sharding.check_same_fit(late, ref32, ref64, final_gap=pln.TARGET_GAP)
    assert sharding.check_same_fit(late, ref32, ref64, final_gap=2e-3)[0]["final"] == pytest.approx(1e-3)


def test_fit_gaps_refuses_fits_of_different_shapes():
    m, s, e = _fit()
    with pytest.raises(ValueError, match="differ in shape"):
        sharding.fit_gaps((m[:10], s, e), _fit())
