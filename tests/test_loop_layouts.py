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

