"""The witnesses read off a trace of one call (programs dispatched, loops run, Python calls): each names a
plausible slow answer of the exercises it judges (a Python loop of jitted calls, nnx.split inside the loop, a
per-step dispatch, a lax.map where a vmap belongs), and accepts a right answer written another way. These
verdicts rest on counts, so they hold on a busy machine (time is printed, as a second opinion)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import fastjax  # noqa: F401
from fastjax import exercises as ex
from fastjax.exercises import many_code, pln_code
from fastjax.exercises import resnet_code
from fastjax.resnet import rungs as R


def slow_by(name, answer, witness):
    report = ex.check(name, answer, repeats=1)
    assert report.right and report.slow and witness in report.structural_misses, report.text()
    assert report.hint and "What to look at" in report.text()
    return report


def passes(name, answer):
    report = ex.check(name, answer, repeats=1)
    assert report.right and report.passed and report.counted, report.text()
    return report


# ---------------------------------------------------------------- programs dispatched

def test_pln_2_a_python_loop_of_jitted_updates_is_named_by_its_dispatches():
    report = slow_by("pln-2", pln_code.fit_update_jitted_once, "programs")
    assert "compiled program(s) dispatched" in report.text()


@functools.partial(jax.jit, static_argnums=1)
def _fit_fori(data, n_iter):  # pln-2 another way: a fori_loop writing the ELBOs into a buffer
    from fastjax import pln

    tx = pln.optimizer()
    params = pln.start(data)

    def body(i, state):
        params, opt_state, elbos = state
        value, grads = jax.value_and_grad(pln.loss)(params, data)
        updates, opt_state = tx.update(grads, opt_state, params)
        return R.apply_fn(params, updates) if hasattr(R, "apply_fn") else jax.tree.map(jnp.add, params, updates), \
            opt_state, elbos.at[i].set(-value)

    elbos = jnp.zeros(n_iter, params[0].dtype)
    params, _, elbos = jax.lax.fori_loop(0, n_iter, body, (params, tx.init(params), elbos))
    return params, elbos


def test_pln_2_a_fori_loop_inside_jit_passes():
    passes("pln-2", _fit_fori)


_member_fit = jax.jit(functools.partial(many_code.rprop_fit, many_code.negative_elbo_masked))


def _padded_members_one_by_one(data):  # many-2: padded and masked, but a jitted call per member
    q_max = max(many_code.RANKS)
    start = many_code.member_start(data, q_max)
    masks = np.arange(q_max) < np.asarray(many_code.RANKS)[:, None]
    return jnp.stack([_member_fit(start, data, jnp.asarray(m, data.counts.dtype)) for m in masks])


def test_many_2_a_loop_of_jitted_calls_over_the_padded_members_is_named():
    report = slow_by("many-2", _padded_members_one_by_one, "loops")  # the fit's loop once per member
    assert report.excess("compiles") == 0 and "member by member" in report.text()  # one program, as the reference's


# ---------------------------------------------------------------- loops run

_fit_mapped = jax.jit(lambda x, c, o: jax.lax.map(lambda co: many_code.fit_poisson(x, co[0], co[1]), (c.T, o.T)))


def test_many_1_a_lax_map_over_the_taxa_is_one_program_whose_taxa_run_in_turn():
    report = slow_by("many-1", _fit_mapped, "loops")
    assert "programs" not in report.structural_misses and "one after another" in report.text()
    assert "dispatches one program per taxon" not in report.text()


_fit_rows = jax.jit(jax.vmap(many_code.fit_poisson, in_axes=(None, 0, 0)))


def test_many_1_a_vmap_over_rows_of_the_transposed_counts_passes():
    passes("many-1", lambda x, counts, offsets: _fit_rows(x, counts.T, offsets.T))


# ---------------------------------------------------------------- Python calls: nnx.split inside the loop

def _split_each_step(model, optimizer, images, labels):  # resnet-1: the walk moved into the loop
    losses = []
    for x, y in zip(images, labels):
        graphdef, treedef, leaves = R.floor_start(model, optimizer)
        leaves, loss = resnet_code.flat_step(graphdef, treedef)(leaves, x, y)
        nnx.update((model, optimizer), jax.tree.unflatten(treedef, leaves))
        losses.append(loss)
    return jnp.stack(losses)


def test_resnet_1_nnx_split_inside_the_loop_is_named_by_its_python_calls():
    report = slow_by("resnet-1", _split_each_step, "python calls")
    assert "nnx.split" in report.text()


def _walk_once_index_the_batches(model, optimizer, images, labels):  # resnet-1 another way: indices, a fori-free loop
    graphdef, treedef, leaves = R.floor_start(model, optimizer)
    step = resnet_code.flat_step(graphdef, treedef)
    losses = []
    for i in range(images.shape[0]):
        leaves, loss = step(leaves, images[i], labels[i])
        losses.append(loss)
    nnx.update((model, optimizer), jax.tree.unflatten(treedef, leaves))
    return jnp.stack(losses)


def test_resnet_1_one_walk_per_epoch_written_another_way_passes():
    passes("resnet-1", _walk_once_index_the_batches)


def test_resnet_3_the_rolled_scan_is_named_by_its_loop_and_an_unrolled_one_passes():
    slow_by("resnet-3", resnet_code.train_scan, "loops")

    @functools.cache
    def unrolled_steps(graphdef, treedef):
        one = R.floor_step(graphdef, treedef)
        return jax.jit(lambda leaves, xs, ys: jax.lax.scan(lambda ls, b: one(ls, *b), leaves, (xs, ys), unroll=True))

    def train_unrolled(model, optimizer, images, labels):
        graphdef, treedef, leaves = R.floor_start(model, optimizer)
        leaves, losses = unrolled_steps(graphdef, treedef)(leaves, images, labels)
        nnx.update((model, optimizer), jax.tree.unflatten(treedef, leaves))
        return losses

    passes("resnet-3", train_unrolled)


def test_floor_1_reverse_mode_is_named_by_the_levels_it_stores():
    from fastjax.exercises import floor_code

    slow_by("floor-1", floor_code.loss_and_grad_autodiff, "scratch")
    passes("floor-1", floor_code.loss_and_grad_by_hand)


def test_floor_4_an_inverse_per_batch_is_named_and_a_cholesky_factored_once_passes():
    from jax.scipy.linalg import cho_factor, cho_solve

    from fastjax.exercises import floor_code

    slow_by("floor-4", floor_code.predict_batches_start, "triangular solves")
    passes("floor-4", floor_code.predict_batches)

    def cholesky_once(x, y, batches):  # another way: the factors once, a solve with them, a kernel per batch
        k = floor_code.kernel(x, x) + floor_code.NOISE * jnp.eye(x.shape[0])
        weights = cho_solve(cho_factor(k), y)
        return jnp.stack([floor_code.kernel(b, x) @ weights for b in batches])

    passes("floor-4", jax.jit(cholesky_once))


def test_floor_2_the_pieces_jitted_apart_without_a_host_read_are_named_by_their_programs():
    from fastjax.exercises import floor_code as fc

    def pieces_without_a_read(p, g, m, v, t):  # no float() of the norm, but each piece its own program
        norm = fc.gradient_norm(g)
        g = fc.scaled(g, jnp.minimum(1.0, fc.MAX_NORM / norm))
        m, v = fc.moments(m, v, g)
        m_hat, v_hat = fc.bias_corrected(m, v, t)
        return fc.adamw_step(p, m_hat, v_hat), m, v

    report = slow_by("floor-2", pieces_without_a_read, "programs")
    assert report.structural_misses == ["programs"] and "pieces as separate jitted functions" in report.text()
    passes("floor-2", fc.update_fused)


def test_floor_3_a_convolution_left_is_named():
    from fastjax.exercises import floor_code

    report = slow_by("floor-3", floor_code.block_grad_lax, "convolutions")
    assert "convolution instruction(s) run" in report.text()


# ---------------------------------------------------------------- copies and scratch memory

def test_tools_3_a_history_not_donated_is_named_by_its_copies_and_donated_by_name_passes():
    from fastjax.exercises import tools_code

    slow_by("tools-3", tools_code.record_row, "copies")
    passes("tools-3", jax.jit(tools_code.write_row, donate_argnames="history"))


def _loss_by_lstsq(params, data):  # tools-1 another way: the coefficients by least squares, no n x n matrix
    from fastjax import pln

    m, s = params
    x, n = data.covariates, params[0].shape[0]
    r = m - x @ jnp.linalg.lstsq(x, m)[0]
    sigma = (r.T @ r + jnp.diag(jnp.sum(s * s, axis=0))) / n
    return -(-0.5 * n * jnp.linalg.slogdet(sigma)[1] + pln.poisson_part(m, s, data))


def test_tools_1_the_hat_matrix_is_named_by_its_scratch_memory_and_least_squares_pass():
    from fastjax.exercises import tools_code

    report = slow_by("tools-1", tools_code.loss_with_hat_matrix, "scratch")
    assert "MiB of scratch memory" in report.text()
    passes("tools-1", _loss_by_lstsq)


# ---------------------------------------------------------------- where a trace cannot show the lesson

def test_scale_2_on_one_device_counts_nothing_and_says_why():
    import jax

    from fastjax.exercises import scale_code

    if len(jax.devices()) > 1:
        import pytest

        pytest.skip("this process has several devices: the all-gather is counted")
    report = ex.check("scale-2", scale_code.gene_covariance_start, repeats=1)
    assert report.right and not report.counted and "nothing to gather" in report.text(), report.text()
    assert report.structure.get("all-gathers") is None
