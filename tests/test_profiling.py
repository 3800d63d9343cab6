import gzip
import json

import fastjax  # noqa: F401  (CPU workaround before JAX)
import jax
import jax.numpy as jnp
import pytest

from fastjax.tools import profiling


def chain(x):
    return jnp.sum(jnp.sin(x) * 2.0 + 1.0)


@pytest.fixture(scope="module")
def compiled():
    return jax.jit(chain).lower(jnp.ones((64, 64))).compile()


LOOP_HLO = """HloModule loop
%inner (a: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  ROOT %e = f32[] exponential(f32[] %a)
}
%body (p: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  ROOT %c = f32[] call(f32[] %p), to_apply=%inner
}
%cond (q: f32[]) -> pred[] {
  %q = f32[] parameter(0)
  %k = f32[] constant(10)
  ROOT %lt = pred[] compare(f32[] %q, f32[] %k), direction=LT
}
ENTRY %main (x: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  ROOT %w = f32[] while(f32[] %x), condition=%cond, body=%body
}
"""


def test_the_hlo_parser_splits_computations_and_finds_what_runs_in_a_loop():
    comps = profiling.computations(LOOP_HLO)
    assert list(comps) == ["inner", "body", "cond", "main"] and len(comps["cond"]) == 3
    assert profiling.loop_computations(LOOP_HLO) == {"body", "inner"}  # the body and what it calls
    ins = profiling.instructions(LOOP_HLO)
    assert ins["e"]["op"] == "exponential" and ins["e"]["in_loop"]
    assert ins["w"]["op"] == "while" and not ins["w"]["in_loop"] and ins["w"]["labels"] is None


def test_a_generated_trace_is_parsed_and_joined_with_its_program(tmp_path, compiled):
    x = jnp.ones((64, 64))
    compiled(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(3):
            compiled(x).block_until_ready()
    events = profiling.read_trace(profiling.find_trace(tmp_path))
    assert events and all(e["dur"] >= 0 and e["thread"] for e in events)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
    rows = profiling.top_ops(events, compiled.as_text())
    assert rows and all(r["calls"] % 3 == 0 for r in rows)  # every instruction ran once per call
    known = profiling.instructions(compiled.as_text())
    assert all(r["op"] == known[r["op name"]]["op"] and not r["in_loop"] for r in rows)  # no loop in chain
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)
    assert rows == sorted(rows, key=lambda r: -r["total ms"])


def test_bad_trace_input_gets_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no trace file"):
        profiling.read_trace(tmp_path / "missing.trace.json.gz")
    with pytest.raises(FileNotFoundError, match="no trace folder"):
        profiling.find_trace(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no \\*.trace.json.gz"):
        profiling.find_trace(tmp_path)
    empty = tmp_path / "empty.trace.json.gz"
    with gzip.open(empty, "wt") as f:
        json.dump({"traceEvents": [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "t"}}]}, f)
    with pytest.raises(ValueError, match="no timed events"):
        profiling.read_trace(empty)
    plain = tmp_path / "plain.trace.json.gz"
    plain.write_text("not gzip")
    with pytest.raises(ValueError, match="not a gzipped JSON trace"):
        profiling.read_trace(plain)


def test_top_ops_refuses_a_trace_of_another_program(compiled):
    events = [{"name": "no_such_instruction", "thread": "t", "ts": 0.0, "dur": 1.0}]
    with pytest.raises(ValueError, match="same compiled program"):
        profiling.top_ops(events, compiled.as_text())


def test_fusions_find_the_elementwise_chain_fused(compiled):
    found = profiling.fusions(compiled.as_text())
    assert found and all(f["kind"].startswith("k") for f in found)
    biggest = max(found, key=lambda f: len(f["ops"]))
    assert {"sine", "multiply"} <= set(biggest["ops"])  # sin and the product ran as one kernel
    assert "sine" not in profiling.unfused(compiled.as_text())


def test_hlo_readers_refuse_other_text():
    for reader in (profiling.fusions, profiling.unfused):
        with pytest.raises(ValueError, match="compiled HLO module"):
            reader("module @jit_f { func.func public @main() }")


def test_cost_reads_both_forms_of_the_cost_analysis(compiled):
    new = profiling.cost(compiled)
    assert new["flops"] > 0 and new["bytes accessed"] > 0 and new["library calls"] == 0
    assert {k: new[k] for k in ("flops", "bytes accessed", "transcendentals")} == profiling.xla_cost(compiled)

    class OldStyle:  # older JAX: a list of one dict per program
        def cost_analysis(self):
            return [{"flops": 10.0, "bytes accessed": 4.0}]

        def as_text(self):
            return "HloModule m\nENTRY %main (x: f32[]) -> f32[] {\n  ROOT %x = f32[] parameter(0)\n}\n"

    assert profiling.xla_cost(OldStyle()) == {"flops": 10.0, "bytes accessed": 4.0, "transcendentals": 0.0}
    assert profiling.cost(OldStyle())["flops"] == 10.0

    class Two:
        def cost_analysis(self):
            return [{}, {}]

    with pytest.raises(ValueError, match="one program"):
        profiling.cost(Two())


def test_roofline_picks_the_larger_bound():
    r = profiling.roofline(flops=1e9, bytes_accessed=1e6, flops_per_s=1e10, bytes_per_s=1e9)
    assert r["limit"] == "compute" and r["bound s"] == pytest.approx(0.1) and r["intensity"] == 1e3
    r = profiling.roofline(flops=1e6, bytes_accessed=1e9, flops_per_s=1e10, bytes_per_s=1e9)
    assert r["limit"] == "memory" and r["bound s"] == pytest.approx(1.0)
    assert profiling.fraction_of_roofline(2.0, r) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peaks > 0"):
        profiling.roofline(1.0, 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        profiling.fraction_of_roofline(0.0, r)


def test_measured_peaks_are_positive():
    assert profiling.peak_flops(n=128, repeats=1) > 0
    assert profiling.peak_bandwidth(mib=4, repeats=1) > 0


def test_library_calls_are_counted_with_their_flops_and_bytes():
    a = jnp.eye(30) * 2.0
    chol_solve = jax.jit(lambda a, b: jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(a), b, lower=True))
    hlo = chol_solve.lower(a, jnp.ones((30, 50))).compile().as_text()
    calls = {c["kernel"]: c for c in profiling.library_calls(hlo)}
    assert set(calls) == {"potrf", "trsm"}
    assert calls["potrf"]["flops"] == pytest.approx(30**3 / 3)  # textbook counts
    assert calls["trsm"]["flops"] == pytest.approx(30 * 30 * 50)
    # the solve reads the 30×30 triangle and the 30×50 right-hand sides and writes a 30×50 result (float32)
    assert (calls["trsm"]["read bytes"], calls["trsm"]["written bytes"]) == (4 * (900 + 1500), 4 * 1500)
    assert calls["potrf"]["read bytes"] == 4 * 900 and calls["potrf"]["written bytes"] == 4 * 900 + 4  # + info
    lib = profiling.library_cost(hlo)
    assert (lib["flops"], lib["calls"], lib["uncounted"]) == (pytest.approx(30**3 / 3 + 30 * 30 * 50), 2, [])
    assert lib["bytes accessed"] == 4 * (900 + 900 + 2400 + 1500) + 4  # Cholesky in, out, info; solve in, out
    lu = jax.jit(jnp.linalg.solve).lower(a, jnp.ones((30, 50))).compile().as_text()
    assert profiling.library_cost(lu)["flops"] == pytest.approx(2 * 30**3 / 3 + 2 * 30 * 30 * 50)  # getrf + two trsm
    batched = jax.jit(jnp.linalg.cholesky).lower(jnp.stack([a, a, a])).compile().as_text()
    assert profiling.library_cost(batched)["flops"] == pytest.approx(3 * 30**3 / 3)  # one call, 3 matrices
    assert profiling.library_cost(jax.jit(jnp.sin).lower(a).compile().as_text())["calls"] == 0
    with pytest.raises(ValueError, match="HloModule"):
        profiling.library_calls("not HLO")
    qr = jax.jit(jnp.linalg.qr).lower(a).compile()  # a LAPACK kernel without a flop formula here
    assert profiling.library_cost(qr.as_text())["uncounted"]
    with pytest.raises(ValueError, match="no flop count for the library calls"):
        profiling.cost(qr)


def test_cost_replaces_xlas_minus_one_per_library_call():
    """XLA counts a custom-call as -1 flop and -1 byte (HloCostAnalysis::HandleCustomCall); cost puts
    the LAPACK call's own count in its place, so that a roofline of a program that calls LAPACK is not
    too low."""
    compiled = jax.jit(jnp.linalg.cholesky).lower(jnp.eye(30) * 2.0).compile()
    hlo = compiled.as_text()
    fused = sum(f["read bytes"] + f["written bytes"] for f in profiling.fusion_bytes(hlo))
    xla = profiling.xla_cost(compiled)
    assert xla["bytes accessed"] == fused - 1  # the fusions around the call, and -1 for the call
    full = profiling.cost(compiled)
    assert full["bytes accessed"] == fused + 4 * (900 + 900) + 4  # the call reads A, writes L and its info
    assert full["flops"] == xla["flops"] + 1 + 30**3 / 3
    assert (full["library calls"], full["library flops"]) == (1, 30**3 / 3)
    # inside a loop, as in the fits: counted once, as cost_analysis counts a loop body
    loop = jax.jit(lambda a: jax.lax.fori_loop(0, 3, lambda i, x: jnp.linalg.cholesky(x) + 1.0, a))
    looped = loop.lower(jnp.eye(30) * 2.0).compile()
    calls = profiling.library_calls(looped.as_text())
    assert [c["in_loop"] for c in calls] == [True]
    assert profiling.cost(looped)["flops"] == profiling.xla_cost(looped)["flops"] + 1 + 30**3 / 3


def test_fusion_bytes_add_up_to_the_cost_analysis():
    f = jax.jit(lambda x, y: (jnp.sin(x) * y, jnp.cos(y) + x))
    compiled = f.lower(jnp.ones((200, 100)), jnp.ones((200, 100))).compile()
    rows = profiling.fusion_bytes(compiled.as_text())
    assert rows and all(r["written bytes"] > 0 for r in rows)
    moved = sum(r["read bytes"] + r["written bytes"] for r in rows)
    assert moved == pytest.approx(profiling.cost(compiled)["bytes accessed"], rel=0.01)
    with pytest.raises(ValueError, match="HloModule"):
        profiling.fusion_bytes("")


def test_traced_ops_and_their_kinds():
    x = jnp.ones((64, 64))
    compiled = jax.jit(lambda a: jnp.tanh(a @ a) + 1.0).lower(x).compile()
    rows = profiling.traced_ops(compiled, x)
    assert rows and abs(sum(r["share"] for r in rows) - 1) < 1e-9
    shares = profiling.shares_by_kind(rows)
    assert abs(sum(shares.values()) - 1) < 1e-9 and "matrix products" in shares
    assert list(shares.values()) == sorted(shares.values(), reverse=True)
    assert profiling.op_kind({"op": "custom-call", "op name": "cholesky.1"}) == "library calls"


def test_array_types_name_what_each_instruction_makes_and_reads():
    hlo = jax.jit(lambda a, b: a @ b.T).lower(jnp.ones((8, 3)), jnp.ones((5, 3))).compile().as_text()
    types = profiling.array_types(hlo)
    dots = [t for name, t in types.items() if t[0] == "f32[8,5]" and sorted(t[1]) == ["f32[5,3]", "f32[8,3]"]]
    assert dots, types  # the product makes the 8 × 5 result from both operands (whatever XLA names it)
    text = "  %a = f32[2,2]{1,0} parameter(0)\n  %t = (f32[2], s32[]) custom-call(f32[2,2]{1,0} %a)\n" \
           "  ROOT %r = f32[2,2]{1,0} add(f32[2,2]{1,0} %a, f32[2]{0} %t)\n"
    assert profiling.array_types(text) == {"a": ("f32[2,2]", []), "r": ("f32[2,2]", ["f32[2,2]", "?"])}


def test_jax_log_collects_a_cache_miss_and_restores_the_logger():
    import logging

    logger = logging.getLogger("jax")
    handlers, propagate = list(logger.handlers), logger.propagate
    f = jax.jit(lambda x: x + 1)
    with profiling.jax_log() as log, jax.explain_cache_misses(True):
        f(jnp.ones(2))
        f(jnp.ones(3))  # another shape: traced again, and explained
    assert "TRACING CACHE MISS" in log.getvalue()
    assert logger.handlers == handlers and logger.propagate == propagate


def test_fusion_summary_counts_what_fused():
    import jax
    import jax.numpy as jnp

    from fastjax.tools import profiling as prof

    f = jax.jit(lambda x: jnp.exp(x * 2.0 + 1.0).sum())
    x = jnp.ones((64, 64))
    row = prof.fusion_summary(f.lower(x).compile().as_text(), f.lower(x).as_text())
    assert row["StableHLO ops"] >= 3 and row["fusions"] == len(prof.fusions(f.lower(x).compile().as_text()))
    assert row["ops fused in all"] >= row["fusions of ≥ 2 ops"]
