"""fastjax.pln.rprop follows torch.optim.Rprop step for step; optax.rprop (0.2.8) does not."""

from __future__ import annotations

import fastjax  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastjax.pln.rprop import rprop



def loss_np(x):
    """A toy loss whose gradient changes sign as the fit oscillates: a sum of shifted quartics."""
    return jnp.sum((x - jnp.arange(x.shape[0], dtype=x.dtype) / 3) ** 4 + 0.1 * jnp.sin(5 * x))


def torch_path(x0, n, **kw):
    torch = pytest.importorskip("torch")
    x = torch.tensor(x0, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Rprop([x], **kw)
    out = []
    for _ in range(n):
        opt.zero_grad()
        y = torch.sum((x - torch.arange(x.shape[0], dtype=torch.float64) / 3) ** 4 + 0.1 * torch.sin(5 * x))
        y.backward()
        opt.step()
        out.append(x.detach().numpy().copy())
    return np.array(out)


def jax_path(tx, x0, n):
    with jax.enable_x64(True):
        x = jnp.asarray(x0, jnp.float64)
        state = tx.init(x)
        out = []
        for _ in range(n):
            g = jax.grad(loss_np)(x)
            u, state = tx.update(g, state, x)
            x = optax.apply_updates(x, u)
            out.append(np.asarray(x))
    return np.array(out)


@pytest.mark.parametrize("kw", [{}, dict(lr=0.05, etas=(0.3, 1.5), step_sizes=(1e-10, 0.2))])
def test_matches_torch_step_for_step(kw):
    x0 = np.linspace(-1.0, 2.0, 7)
    ours = jax_path(rprop(kw.get("lr", 0.01), kw.get("etas", (0.5, 1.2)), kw.get("step_sizes", (1e-6, 50))), x0, 60)
    np.testing.assert_array_equal(ours, torch_path(x0, 60, **kw))  # same float64 operations: bit for bit


def test_first_update_moves_by_lr():
    u, _ = rprop(0.01).update(jnp.array([2.0, -3.0, 0.0]), rprop(0.01).init(jnp.zeros(3)))
    np.testing.assert_array_equal(u, np.array([-0.01, 0.01, 0.0], np.float32))


def test_optax_rprop_is_stale_or_fixed():
    x0 = np.linspace(-1.0, 2.0, 7)
    theirs = jax_path(optax.rprop(0.01), x0, 5)
    if np.allclose(theirs, torch_path(x0, 5)):
        pytest.skip("optax.rprop now follows torch (optax pull request #1725)")
    np.testing.assert_array_equal(theirs[0], x0)  # optax 0.2.8: the first update is the stored zeros


def test_pytree_of_three_arrays():
    params = (jnp.ones(2), jnp.ones(3), jnp.ones(1))
    tx = rprop()
    u, st = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params))
    assert jax.tree.structure(u) == jax.tree.structure(params)
    assert [a.shape for a in st.step_sizes] == [(2,), (3,), (1,)]


@pytest.mark.parametrize("kw, match", [(dict(etas=(1.5, 1.2)), "etas"), (dict(learning_rate=-1.0), "learning_rate"),
                                       (dict(step_sizes=(1.0, 0.1)), "step_sizes")])
def test_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        rprop(**kw)
