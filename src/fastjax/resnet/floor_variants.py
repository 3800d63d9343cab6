"""The ResNet floor's experiments (chapters/floor/03-resnet-floor.md): Part II's floor step with one thing
about its convolutions changed through the ``nnx.Conv`` modules' attributes, the network and its flat list
of arrays unchanged.

- ``conv_nchw``: a drop-in for ``jax.lax.conv_general_dilated`` that computes the same NHWC convolution
  channels first (NCHW input, OIHW kernel), as Part II's Equinox twin does.
- ``variant_step``: the floor step with the modules' convolution or their precision changed.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
from flax import nnx

from fastjax.resnet.rungs import train_step


def conv_nchw(lhs: Any, rhs: Any, window_strides: Any, padding: Any, lhs_dilation: Any = None,
              rhs_dilation: Any = None, dimension_numbers: Any = None, feature_group_count: int = 1,
              precision: Any = None, **kwargs: Any) -> Any:
    """The same convolution channels first: NHWC input and HWIO kernel transposed to NCHW and OIHW, the
    result back to NHWC. Plain convolutions only (no dilation, one feature group), as the ResNet's are."""
    if set(lhs_dilation or (1,)) != {1} or set(rhs_dilation or (1,)) != {1} or feature_group_count != 1:
        raise ValueError("conv_nchw computes plain convolutions only: no dilation, one feature group")
    y = jax.lax.conv_general_dilated(lhs.transpose(0, 3, 1, 2), rhs.transpose(3, 2, 0, 1), window_strides, padding,
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"), precision=precision)
    return y.transpose(0, 2, 3, 1)


def variant_step(graphdef: Any, treedef: Any, conv: Callable[..., Any] | None = None,
                 precision: Any = None) -> Callable[..., Any]:
    """Part II's floor step ``step(leaves, images, labels) -> (leaves, loss)`` with every ``nnx.Conv``'s
    convolution set to ``conv`` (when given) and its precision to ``precision`` (jit it)."""
    def step(leaves, images, labels):
        model, optimizer = nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))
        for _, m in nnx.iter_modules(model):
            if isinstance(m, nnx.Conv):
                m.conv_general_dilated = conv or m.conv_general_dilated
                m.precision = precision
        loss = train_step(model, optimizer, images, labels)
        return jax.tree.leaves(nnx.state((model, optimizer))), loss
    return step
