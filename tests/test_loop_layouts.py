"""fastjax.resnet.loop_layouts (chapters/resnet/04-scan.md's experiments): what its programs hold,
not how fast they run (timings live on the page)."""

from fastjax.resnet import loop_layouts as L
from fastjax.resnet.bench import convolutions


def test_the_bodies_keep_their_carry_shapes():
    for name, (body, carry) in L.bodies(4).items():
        out, _ = body(carry, None)
        assert [a.shape for a in out] == [a.shape for a in carry], name


def test_only_a_full_unroll_leaves_no_convolution_in_a_loop():
    body, carry = L.bodies(4)["conv NHWC, with gradient"]
    *_, rolled = L.loop_and_scan(body, carry, 4)
    *_, unrolled = L.loop_and_scan(body, carry, 4, unroll=4)
    assert any(k.startswith("in a loop") for k in convolutions(rolled.as_text()))
    assert not any(k.startswith("in a loop") for k in convolutions(unrolled.as_text()))



def test_loop_against_scan_splits_the_scans_extra_time():
    def row(op, ms, labels=""):
        return {"op": op, "total ms": ms, "labels": labels}

    ops = {"loop": [row("convolution", 2.0, L.NHWC_LABELS), row("fusion", 1.0)],
           "scan": [row("convolution", 2.0, L.NHWC_LABELS), row("convolution", 4.0, "bf01_oi01->bf01"),
                    row("fusion", 1.0), row("copy", 1.0)]}
    out = L.loop_against_scan(ops)
    assert (out["loop_ms"], out["scan_ms"], out["extra_ms"]) == (3.0, 8.0, 5.0)
    assert (out["share_other_conv"], out["copy_share"], out["conv_extra_share"]) == (50.0, 12.5, 80.0)
