"""Part V's practice exercises (fastjax.exercises.scale): for each one, a right answer passes the check and
does not compile again, a plausible wrong answer is named wrong with a message, and a slow answer is named
slow by a margin that load cannot flip (10x and more, or a retrace, which the check counts).

The checks run where the page runs them, on eight simulated CPU devices, in one fresh process (the device
count is fixed when JAX starts, and this process may have started it with one); the process waits for
each call it times. One test runs a check here, with the devices this process has."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import fastjax  # noqa: F401

pytestmark = pytest.mark.xdist_group("exercises-scale")

NAMES = ("scale-1", "scale-2", "scale-3", "scale-4")

SCRIPT = textwrap.dedent('''
    import json
    import fastjax
    from fastjax.scale import sharding
    sharding.use_cpu_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from fastjax import exercises as ex
    from fastjax.exercises import scale as practice, scale_code as code

    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: compiles.__setitem__(0, compiles[0] + (event == "/jax/core/compile/backend_compile_duration")))
    out = {"devices": len(jax.devices()), "mesh": dict(practice.mesh().shape)}

    def record(key, report):
        out[key] = {"right": report.right, "slow": report.slow, "retraces": report.retraces, "ratio": report.ratio,
                    "problem": report.problem, "text": report.text()}

    def second_run_compiles(name, answer):
        e = ex.get(name)
        jax.block_until_ready(e.run(answer, e.arguments()))
        before = compiles[0]
        jax.block_until_ready(e.run(answer, e.arguments()))
        return compiles[0] - before

    REFS = {"scale-1": code.entropies, "scale-2": code.gene_covariance, "scale-3": code.fit_one_call,
            "scale-4": code.fit_one_call}
    STARTS = {"scale-1": code.entropies_loop, "scale-2": code.gene_covariance_start, "scale-3": code.fit_host,
              "scale-4": code.fit_copied}
    for name in REFS:
        record(f"{name} reference", ex.check(name, REFS[name], time_it=False))
        out[f"{name} reference compiles"] = second_run_compiles(name, REFS[name])
        record(f"{name} start", ex.check(name, STARTS[name], time_it=False))

    # ---- wrong answers
    @jax.jit
    def entropy_of_all(counts):  # each cell divided by the total of all cells
        q = counts / jnp.sum(counts)
        return -jnp.sum(jnp.where(q > 0, q * jnp.log(jnp.where(q > 0, q, 1.0)), 0.0), axis=1)
    record("scale-1 wrong", ex.check("scale-1", entropy_of_all, time_it=False))

    @jax.jit
    def covariance_over_n(x):  # divided by n, not n - 1
        centred = x - jnp.mean(x, axis=0)
        return jnp.matmul(centred.T, centred, out_sharding=jax.P()) / x.shape[0]
    record("scale-2 wrong", ex.check("scale-2", covariance_over_n, time_it=False))

    def loss_after_the_step(mesh, covariates, counts):  # each loss read after its step, not before
        x, y = sharding.shard_rows((jnp.asarray(covariates), jnp.asarray(counts)), mesh)
        coef = sharding.replicate(jnp.zeros((covariates.shape[1], counts.shape[1]), jnp.float32), mesh)
        losses = []
        for _ in range(code.STEPS):
            coef, _ = code.gradient_step(coef, x, y)
            losses.append(code.poisson_loss(coef, x, y))
        return coef, jnp.stack(losses)
    record("scale-3 wrong step", ex.check("scale-3", loss_after_the_step, time_it=False))
    record("scale-3 on devices", ex.check("scale-3", code.fit_on_devices, time_it=False))

    @jax.jit
    def steps_from_zero(coef, x, y):  # the scan does not carry the coefficients
        return jax.lax.scan(lambda c, _: (code.gradient_step(coef, x, y)[0], code.gradient_step(coef, x, y)[1]),
                            coef, None, length=code.STEPS)
    def fit_not_carried(mesh, covariates, counts):
        x, y = sharding.shard_rows((jnp.asarray(covariates), jnp.asarray(counts)), mesh)
        coef = sharding.replicate(jnp.zeros((covariates.shape[1], counts.shape[1]), jnp.float32), mesh)
        return steps_from_zero(coef, x, y)
    record("scale-3 wrong", ex.check("scale-3", fit_not_carried, time_it=False))

    def everything_split(mesh, covariates, counts):  # the coefficients split too: 2 rows over 8 devices
        x, y = sharding.shard_rows((jnp.asarray(covariates), jnp.asarray(counts)), mesh)
        coef = sharding.shard_rows(jnp.zeros((covariates.shape[1], counts.shape[1]), jnp.float32), mesh)
        return code.all_steps(coef, x, y)
    record("scale-4 raises", ex.check("scale-4", everything_split, time_it=False))
    record("scale-3 not a pair", ex.check("scale-3", lambda *a: code.fit_on_devices(*a)[1], time_it=False))

    # ---- slow answers: the starting program where it is 100x slower, else a jit made inside the call
    record("scale-1 slow", ex.check("scale-1", code.entropies_loop, repeats=2))
    RETRACING = {
        "scale-2": lambda x: jax.jit(lambda y: code.gene_covariance(y))(x),
        "scale-3": lambda *a: (lambda c, l: (c, jax.jit(lambda v: v + 0.0)(l)))(*code.fit_one_call(*a)),
        "scale-4": lambda *a: (lambda c, l: (c, jax.jit(lambda v: v + 0.0)(l)))(*code.fit_one_call(*a)),
    }
    for name, answer in RETRACING.items():
        record(f"{name} slow", ex.check(name, answer, repeats=1))

    # ---- scale-4's witness, the data placed per device: the start, a copy placed by hand, a split by hand
    record("scale-4 start slow", ex.check("scale-4", code.fit_copied, repeats=1))
    from jax.sharding import NamedSharding

    def fit_copied_by_hand(mesh, covariates, counts):  # every row on every device, with jax.device_put itself
        everywhere = NamedSharding(mesh, jax.P())
        x, y = jax.device_put((jnp.asarray(covariates), jnp.asarray(counts)), everywhere)
        return code.all_steps(jax.device_put(jnp.zeros((x.shape[1], y.shape[1]), jnp.float32), everywhere), x, y)
    record("scale-4 copied by hand", ex.check("scale-4", fit_copied_by_hand, repeats=1))

    def fit_split_by_hand(mesh, covariates, counts):  # right, written another way: each array its own sharding
        rows, everywhere = NamedSharding(mesh, jax.P("samples")), NamedSharding(mesh, jax.P())
        x, y = jax.device_put((covariates, counts), (rows, rows))
        return code.all_steps(jax.device_put(np.zeros((x.shape[1], y.shape[1]), np.float32), everywhere), x, y)
    record("scale-4 split by hand", ex.check("scale-4", fit_split_by_hand, repeats=1))
    print("RESULT " + json.dumps(out))
''')


# XLA:CPU aborts a process whose eight simulated devices do not all reach an all-reduce within 40 s
# ("Expected 8 threads to join the rendezvous"). XLA's CPU client makes max(cores, devices) threads, 8 on
# a 2-core machine, and the abort came with exactly that many: 3 of 3 processes in one CI run, 1 of 8
# quiet processes here, 2 of 9 with two busy processes beside. sharding.use_cpu_devices now asks for
# twice as many (PJRT_NPROC): 14 of 14 passed with the busy processes beside. Which tasks held the other
# threads was not found, so such an abort, and only it, still gets up to two more processes.
RENDEZVOUS_ABORT = "threads to join the rendezvous"


@pytest.fixture(scope="module")
def results():
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=400)
        if done.returncode == 0 or RENDEZVOUS_ABORT not in done.stderr:
            break
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        pytest.fail(f"the checks' process failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def test_the_checks_run_on_eight_devices(results):
    assert results["devices"] == 8 and results["mesh"] == {"samples": 8}


@pytest.mark.parametrize("name", NAMES)
def test_the_reference_is_right_and_does_not_compile_again(results, name):
    assert results[f"{name} reference"]["right"], results[f"{name} reference"]["text"]
    assert results[f"{name} reference compiles"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_the_starting_program_is_right(results, name):
    assert results[f"{name} start"]["right"], results[f"{name} start"]["text"]


@pytest.mark.parametrize("name, message, hint", [
    ("scale-1", "the entropies", "that cell's total"),
    ("scale-2", "the covariance", "n − 1"),
    ("scale-3", "the losses of the fit", "carry the"),
    ("scale-3 wrong step", "the losses of the fit", "the loss before each step"),
])
def test_a_wrong_answer_is_named_with_what_to_look_at(results, name, message, hint):
    report = results[name if " " in name else f"{name} wrong"]
    assert not report["right"] and message in report["problem"] and hint in report["text"], report["text"]


def test_scale_3_the_first_step_of_the_solution_is_right(results):
    assert results["scale-3 on devices"]["right"], results["scale-3 on devices"]["text"]


def test_scale_4_coefficients_split_over_more_devices_than_rows_get_a_clear_error(results):
    report = results["scale-4 raises"]
    assert not report["right"] and report["problem"].startswith("Your answer raised ValueError")
    assert "do not split evenly over 8 devices" in report["problem"]


def test_a_fit_that_returns_only_the_losses_is_named(results):
    report = results["scale-3 not a pair"]
    assert not report["right"] and "returns (coef, losses)" in report["problem"]


def test_the_loop_over_cells_is_slow_by_far(results):
    report = results["scale-1 slow"]
    assert report["right"] and report["slow"] and report["ratio"] > 10, report["text"]


@pytest.mark.parametrize("name", ["scale-2", "scale-3", "scale-4"])
def test_an_answer_that_compiles_on_every_call_is_slow(results, name):
    report = results[f"{name} slow"]
    assert report["right"] and report["retraces"] and report["slow"], report["text"]


@pytest.mark.parametrize("name", ["scale-4 start slow", "scale-4 copied by hand"])
def test_scale_4_data_copied_to_every_device_is_named_by_what_each_device_holds(results, name):
    report = results[name]
    assert report["right"] and report["slow"] and not report["retraces"], report["text"]
    assert "MiB of data placed on one device" in report["text"] and "repeats the same arithmetic" in report["text"]


def test_scale_4_data_split_by_hand_passes(results):
    report = results["scale-4 split by hand"]
    assert report["right"] and not report["slow"], report["text"]
    assert "0.25 MiB of data placed on one device" in report["text"], report["text"]


def test_a_check_works_with_the_devices_this_process_has():
    # a test process (or a notebook) where JAX started with whatever devices it has: the mesh takes them
    from fastjax import exercises as ex
    from fastjax.exercises import scale as practice, scale_code as code

    import jax

    n = len(jax.devices())
    assert practice.mesh().shape["samples"] == max(d for d in range(1, n + 1) if 64 % d == 0)
    assert ex.check("scale-4", code.fit_one_call, time_it=False).right
