"""The sweep page's evidence (fastjax.resnet.sweep_checks): the convolution count reads a compiled program."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

pytest.importorskip("torch", reason="fastjax.resnet.sweep (the page's exported code) imports torch")

from fastjax.resnet import sweep_checks  # noqa: E402


def test_the_count_tells_a_grouped_convolution_from_a_plain_one():
    def conv(a, k, groups):
        return jax.lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            feature_group_count=groups)

    a, k = jnp.ones((1, 4, 4, 4)), jnp.ones((3, 3, 2, 4))
    grouped = jax.jit(lambda a, k: conv(a, k, 2)).lower(a, k).compile().as_text()
    plain = jax.jit(lambda a, k: conv(a, k[:, :, :, :2].repeat(2, axis=2)[:, :, :4], 1)).lower(a, k).compile().as_text()
    assert sweep_checks.count_convolutions(grouped) == (1, 1)
    assert sweep_checks.count_convolutions(plain)[1] == 0
