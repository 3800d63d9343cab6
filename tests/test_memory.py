import gc

import fastjax  # noqa: F401  (CPU workaround before JAX)
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastjax.tools import memory


def _state():
    return {"w": jnp.ones((64, 32)), "b": jnp.zeros(32), "count": jnp.zeros((), jnp.int32)}


def _step(state, x):
    return {"w": state["w"] - 0.1 * x, "b": state["b"] + 1.0, "count": state["count"] + 1}


def test_a_donated_step_reuses_its_input_buffers():
    step = jax.jit(_step, donate_argnums=0)
    state, x = _state(), jnp.full((64, 32), 2.0)
    before = state["w"].unsafe_buffer_pointer()
    new = jax.block_until_ready(step(state, x))
    assert memory.deleted_leaves(state) == (3, 3)  # every donated input is gone ...
    assert new["w"].unsafe_buffer_pointer() == before  # ... and the output lives in its memory
    assert not x.is_deleted()  # the argument that was not donated survives
    np.testing.assert_allclose(new["w"], 0.8)
    with pytest.raises(RuntimeError, match="deleted"):
        state["w"] + 1


def test_a_step_without_donation_keeps_its_inputs():
    state, x = _state(), jnp.full((64, 32), 2.0)
    new = jax.block_until_ready(jax.jit(_step)(state, x))
    assert memory.deleted_leaves(state) == (0, 3)
    assert new["w"].unsafe_buffer_pointer() != state["w"].unsafe_buffer_pointer()
    np.testing.assert_allclose(state["w"], 1.0)


def test_memory_stats_counts_the_donated_bytes_as_aliased():
    state, x = _state(), jnp.ones((64, 32))
    donated = memory.memory_stats(jax.jit(_step, donate_argnums=0).lower(state, x).compile())
    kept = memory.memory_stats(jax.jit(_step).lower(state, x).compile())
    state_bytes = memory.tree_bytes(state)
    assert set(donated) == {"argument", "output", "alias", "temp", "code", "peak"}
    assert donated["alias"] == state_bytes and kept["alias"] == 0
    assert donated["argument"] == kept["argument"] == state_bytes + x.nbytes
    # the output also holds XLA's table of pointers to the output arrays (8 bytes each on CPU)
    assert donated["output"] == kept["output"] >= state_bytes
    if kept["peak"] is not None:  # reported by the jaxlib releases the book runs on
        assert donated["peak"] < kept["peak"]


def test_live_bytes_sees_a_new_array_and_not_a_deleted_one():
    gc.collect()  # free earlier tests' unreachable arrays now, not between the two readings
    before = memory.live_bytes()
    a = jnp.ones((1000,), jnp.float32)
    assert memory.live_bytes() - before == 4000
    a.delete()
    assert memory.live_bytes() == before


def test_tree_bytes_counts_deleted_leaves_as_zero():
    tree = {"a": jnp.ones(10), "b": [jnp.ones(5, jnp.int32), "not an array"]}
    assert memory.tree_bytes(tree) == 60
    tree["a"].delete()
    assert memory.tree_bytes(tree) == 20
    assert memory.deleted_leaves(tree) == (1, 2)


def test_clear_errors():
    with pytest.raises(TypeError, match="compiled program"):
        memory.memory_stats(jax.jit(_step))
    with pytest.raises(ValueError, match="no JAX arrays"):
        memory.tree_bytes({"a": np.ones(3)})


def test_memory_table_adds_up_what_a_program_holds():
    state, x = _state(), jnp.ones((64, 32))
    rows, stats = memory.memory_table({"plain": jax.jit(_step).lower(state, x).compile(),
                                       "donated": jax.jit(_step, donate_argnums=0).lower(state, x).compile()})
    for row, st in zip(rows, stats.values()):
        assert row["held (kB)"] * 1e3 == pytest.approx(st["argument"] + st["output"] - st["alias"] + st["temp"])
    assert [r["program"] for r in rows] == ["plain", "donated"]
    assert rows[1]["alias (kB)"] * 1e3 == memory.tree_bytes(state)


def test_copies_added_by_donation_reads_the_hlo_and_refuses_what_is_not_compiled():
    state, x = _state(), jnp.ones((64, 32))
    plain = jax.jit(_step).lower(state, x).compile()
    donated = jax.jit(_step, donate_argnums=0).lower(state, x).compile()
    assert not memory.copies_added_by_donation(plain, plain)  # a program adds nothing to itself
    copies = memory.copies_added_by_donation(plain, donated)
    assert all(count > 0 for count in copies.values())
    with pytest.raises(TypeError, match="compiled programs"):
        memory.copies_added_by_donation(jax.jit(_step), donated)


def test_shape_bytes_reads_hlo_shapes():
    assert memory.shape_bytes("f32[64,32]{1,0}") == 64 * 32 * 4
    assert memory.shape_bytes("bf16[3]") == 6
    assert memory.shape_bytes("s32[]") == 4
    with pytest.raises(ValueError, match="HLO array shape"):
        memory.shape_bytes("(f32[2], f32[3])")


def test_bytes_added_by_call_sees_donation_free_the_old_state():
    x = jnp.ones((64, 32))
    plain = memory.bytes_added_by_call(_state, jax.jit(_step), x)
    donated = memory.bytes_added_by_call(_state, jax.jit(_step, donate_argnums=0), x)
    assert plain - donated == memory.tree_bytes(_state())
