"""The check that two float64 trainings of the ResNet are the same: the PyTorch twin of
:mod:`fastjax.resnet.torch_twin` (written in chapters/resnet/08-pytorch.md) against Part II's floor, from the
same weights on the same batches, within bounds derived from float64 rounding.

``twin_rtol`` bounds one train step's results (logits, gradients, batch statistics), ``adam_gain`` and
``weight_atol`` the weights after a few Adam steps; each docstring holds its derivation.
``torch_float64_run`` and ``jax_float64_run`` record what ``check_same_training`` compares, which raises
``NotTheSameTraining`` where the two differ by more than rounding allows. ``weights`` reads a twin back in
the NNX layout and naming of ``resnet_nnx.weights``. tests/test_torch_twin.py checks the bounds and that a
twin with one slip fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from torch import nn

from fastjax.resnet import ladder
from fastjax.resnet.digits import N_CLASSES
from fastjax.resnet.resnet_nnx import BN_MOMENTUM, ResNetConfig, make_model
from fastjax.resnet.rungs import LEARNING_RATE
from fastjax.resnet.torch_twin import TorchResNet, to_torch, torch_train_step

U64 = ladder.U64  # float64's unit roundoff, 1.1e-16 (the one Part II derives its bounds from)
MARGIN = 10  # what the first-order count of twin_rtol leaves out (see there)
CHECK_STEPS = 10  # float64 train steps whose weights are compared
ADAM_EPS, ADAM_BETAS = 1e-8, (0.9, 0.999)  # optax.adam's defaults (R.TX) and torch.optim.Adam's alike


def nnx_layout(model: TorchResNet, read) -> dict[str, np.ndarray]:
    """``read(parameter)`` (a tensor of the parameter's shape: itself, its gradient, ...) for every parameter
    of a PyTorch twin, in the NNX layout and naming of ``resnet_nnx.weights``."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, nn.Conv2d):
            out[f"{name}.kernel"] = read(module.weight).detach().numpy().transpose(2, 3, 1, 0).copy()
        elif isinstance(module, (nn.Linear, nn.BatchNorm2d)):
            kernel = "kernel" if isinstance(module, nn.Linear) else "scale"
            value = read(module.weight).detach().numpy()
            out[f"{name}.{kernel}"] = (value.T if kernel == "kernel" else value).copy()
            out[f"{name}.bias"] = read(module.bias).detach().numpy().copy()
    return dict(sorted(out.items()))


def weights(model: TorchResNet) -> dict[str, np.ndarray]:
    """The weights of a PyTorch twin (running statistics included) in the NNX layout and naming of
    ``resnet_nnx.weights``."""
    out = nnx_layout(model, lambda p: p)
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            out[f"{name}.mean"] = module.running_mean.numpy().copy()
            out[f"{name}.var"] = module.running_var.numpy().copy()
    return dict(sorted(out.items()))


class NotTheSameTraining(AssertionError):
    """Two float64 trainings from the same weights on the same batches that differ by more than rounding allows."""


def reduction_length(config: ResNetConfig, batch: int) -> int:
    """How many terms one train step adds up along its longest chain of sums, from the image forward to the
    loss and back to the stem's kernel gradient: per 3×3 convolution from c_in to c_out channels, 9·c_in terms
    forward and 9·c_out back to its input; per BatchNorm over n = batch·h·w values, 4·n (the mean and the
    variance forward, two sums back); the mean over the last stage's pixels; the head (its inputs forward, the
    10 classes back); the loss (the 10 classes, then the batch); the stem's kernel gradient (batch·64 pixels)."""
    pixels = batch * 64
    total = 9 + 4 * pixels  # the stem (one input channel; nothing goes back to the image) and its BatchNorm
    c_in = config.width
    for stage, c_out in enumerate(config.stage_widths()):
        n = batch * (8 >> stage) ** 2
        for _ in range(config.blocks):
            total += 9 * c_in + 9 * c_out + 4 * n  # conv1 and bn1
            total += 9 * c_out + 9 * c_out + 4 * n  # conv2 and bn2 (the 1×1 shortcut is a shorter chain)
            c_in = c_out
    return total + (8 >> (config.stages - 1)) ** 2 + (c_in + N_CLASSES) + (N_CLASSES + batch) + pixels


def twin_rtol(config: ResNetConfig, batch: int) -> float:
    """The relative difference float64 rounding allows between two programs' results of one train step (the
    logits, a gradient array, a batch statistic), in norm: MARGIN·u·L, u = 2⁻⁵³, L = reduction_length.

    Any order of adding K terms is off the exact sum by at most (K − 1)·u times the sum of the terms'
    magnitudes (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., §4.2). To first order in u,
    the errors of a chain of operations add up, each multiplied by how much the rest of the chain magnifies
    it (its condition); with every condition 1, a result is off by at most u·L of its size. BatchNorm rescales
    every layer to unit variance, which keeps the sizes, and so the conditions, of order one; MARGIN = 10
    allows conditions up to 10 on average (BatchNorm's division by a standard deviation below 1, cancellation
    in a sum of terms of both signs). Independent roundings add up to about √L·u, not L·u, so the differences
    measured are far below this bound (the page prints both), where a step that computes something else is
    off by far more: a gradient scaled by 1.01 by 1e-2."""
    return MARGIN * U64 * reduction_length(config, batch)


def adam_gain(step: int, betas: tuple[float, float] = ADAM_BETAS) -> float:
    """How far Adam's update m̂/(√v̂ + eps) at ``step`` (from 1) can move when each gradient so far moves by at
    most δ, in units of δ/(√v̂ + eps): 1 + c. m̂ = Σ a_j·g_j and √v̂ = (Σ b_j·g_j²)^½ are averages (the weights
    a_j and b_j sum to 1 after the bias correction), so each moves by at most δ; the update then moves by at
    most δ/(√v̂ + eps) + |m̂|·δ/(√v̂ + eps)², and |m̂| ≤ c·√v̂ (Cauchy–Schwarz) with c = (Σ a_j²/b_j)^½: 1 at
    step 1, 1.04 at step 10."""
    b1, b2 = betas
    j = np.arange(1, step + 1)
    a = (1 - b1) * b1 ** (step - j) / (1 - b1**step)
    b = (1 - b2) * b2 ** (step - j) / (1 - b2**step)
    return 1 + float(np.sqrt(np.sum(a**2 / b)))


def weight_atol(grad_norms: list[dict[str, float]], root_v: list[dict[str, np.ndarray]], rtol: float,
                weights_: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The absolute difference float64 rounding allows in each weight of two programs after ``len(root_v)``
    Adam steps (learning rate LEARNING_RATE, eps ADAM_EPS) from the same weights on the same batches, per
    array of ``weights_`` (the reference's, NNX naming): ``grad_norms`` per step, the norm G of each gradient
    array; ``root_v`` per step, √v̂ of each entry (torch_float64_run reads both).

    Each gradient entry is off by at most ``rtol``·G (twin_rtol bounds the norm of an array's difference, so
    each of its entries too; check_same_training asserts it of the first gradient). By adam_gain, the update
    lr·m̂/(√v̂ + eps) of an entry at a step is then off by at most lr·adam_gain·rtol·G/(√v̂ + eps), G the
    largest of the array so far: Adam magnifies a gradient's rounding by 1/(√v̂ + eps), up to 1/eps = 1e8 for
    an entry whose gradients are near zero, so the bound reads each entry's √v̂ from the run rather than
    assume one. The steps' errors add up, and each side also
    rounds Adam's own arithmetic and w − update: MARGIN·u of the array's largest weight per step. The
    gradients of the steps after the first come from weights that already differ by this much; the bound
    leaves that feedback out, which can only make it too tight (the check would then fail), never let a
    wrong step pass."""
    out = {}
    for k, w in weights_.items():
        if k.endswith((".mean", ".var")):
            continue
        total, g_max = np.zeros(np.shape(w)), 0.0
        for step, (norms, roots) in enumerate(zip(grad_norms, root_v), start=1):
            g_max = max(g_max, norms[k])
            total += LEARNING_RATE * adam_gain(step) * rtol * g_max / (roots[k] + ADAM_EPS)
        out[k] = total + MARGIN * len(root_v) * U64 * float(np.max(np.abs(w)))
    return out


@dataclass
class Float64Run:
    """What the check compares of a float64 training: the ``logits`` of the first forward pass (training mode),
    the ``gradient`` of the first step and the ``losses`` (NNX naming), the ``weights`` after the last step
    (running variances in Flax's biased convention). A PyTorch run also holds what the bounds read, per step:
    ``grad_norms`` (the norm of each gradient array) and ``root_v`` (Adam's √v̂, NNX layout); and
    ``bn_scale`` (per BatchNorm: the largest root mean square of a channel of its input, over the steps)."""

    logits: np.ndarray
    gradient: dict[str, np.ndarray]
    losses: np.ndarray
    weights: dict[str, np.ndarray]
    grad_norms: list[dict[str, float]] = field(default_factory=list)
    root_v: list[dict[str, np.ndarray]] = field(default_factory=list)
    bn_scale: dict[str, float] = field(default_factory=dict)


def gradients(model: nn.Module) -> dict[str, np.ndarray]:
    """The gradients that the last ``backward()`` left in a PyTorch twin, in the NNX layout and naming."""
    return nnx_layout(model, lambda p: p.grad)


def torch_float64_run(model: nn.Module, xs, ys, make_optimizer=None, step=torch_train_step) -> Float64Run:
    """Train the PyTorch twin ``model`` (turned to float64, in place) CHECK_STEPS steps on the batches ``xs``,
    ``ys`` (NHWC, NumPy) with a fresh Adam (``make_optimizer(parameters)``, by default torch.optim.Adam at
    LEARNING_RATE) and ``step``; record what check_same_training compares and what its bounds read."""
    if len(xs) < CHECK_STEPS or len(ys) < CHECK_STEPS:
        raise ValueError(f"need {CHECK_STEPS} batches; got {len(xs)} images and {len(ys)} labels")
    model.double()
    optimizer = (make_optimizer or (lambda p: torch.optim.Adam(p, lr=LEARNING_RATE)))(model.parameters())
    start_var = {name: m.running_var.clone() for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)}
    seen: dict[str, list] = {}  # per BatchNorm: [values averaged per channel, largest channel RMS]

    def watch(name):
        def hook(module, inputs, output):
            x = inputs[0].detach()
            count, rms = x.numel() // x.shape[1], float(x.pow(2).mean(dim=(0, 2, 3)).sqrt().max())
            seen[name] = [count, max(rms, seen.get(name, [0, 0.0])[1])]
        return hook

    handles = [m.register_forward_hook(watch(name)) for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    first: list[np.ndarray] = []
    handles.append(model.register_forward_hook(lambda m, i, out: first.append(out.detach().numpy().copy()) if not first else None))
    b2 = optimizer.param_groups[0]["betas"][1]
    losses, grad_norms, root_v, gradient = [], [], [], None
    try:
        for x, y in zip(xs[:CHECK_STEPS], ys[:CHECK_STEPS]):
            images, labels = to_torch(x, y)
            losses.append(float(step(model, optimizer, images.double(), labels)))
            grads = gradients(model)
            gradient = grads if gradient is None else gradient
            grad_norms.append({k: float(np.linalg.norm(g)) for k, g in grads.items()})
            root_v.append(nnx_layout(model, lambda p: (optimizer.state[p]["exp_avg_sq"]
                                                       / (1 - b2 ** float(optimizer.state[p]["step"]))).sqrt()))
    finally:
        for h in handles:
            h.remove()
    out = weights(model)
    kept = BN_MOMENTUM**CHECK_STEPS  # the part of the first running variance still in it
    for name, v0 in start_var.items():  # PyTorch averages var·n/(n − 1); Flax var
        n = seen[name][0]
        out[f"{name}.var"] = kept * v0.numpy() + (out[f"{name}.var"] - kept * v0.numpy()) * (n - 1) / n
    return Float64Run(first[0], gradient, np.array(losses), out, grad_norms, root_v,
                      {name: s[1] for name, s in seen.items()})


def jax_float64_run(config: ResNetConfig, xs, ys, seed: int = 0) -> Float64Run:
    """The reference: Part II's floor (``ladder.build(..., float64=True)``) trained CHECK_STEPS steps in float64
    from the weights of ``make_model(config, seed)`` on the batches ``xs``, ``ys`` (NHWC, NumPy)."""
    xs64, ys = np.asarray(xs[:CHECK_STEPS], np.float64), np.asarray(ys[:CHECK_STEPS])
    with jax.enable_x64(True):
        model = make_model(config, seed)  # a throwaway copy for the logits (training mode updates its statistics)
        nnx.update(model, ladder.to_float64(nnx.state(model)))
        logits = np.asarray(model(jnp.asarray(xs64[0])))
        floor = ladder.build("floor", config, seed, float64=True)
        losses, gradient = ladder.trajectory_with_gradient(floor, xs64, ys)
        return Float64Run(logits, gradient, losses, floor.weights())


def check_same_training(ours: Float64Run, ref: Float64Run, config: ResNetConfig, batch: int,
                        what: str = "PyTorch") -> dict[str, tuple[float, float]]:
    """Raise NotTheSameTraining unless two float64 runs (``ours`` from torch_float64_run: the bounds read its
    Adam state and BatchNorm inputs) agree as far as rounding allows (twin_rtol, weight_atol): the logits, to
    rtol of the largest; each array of the first gradient, to rtol of its norm; each weight after the last
    step, to weight_atol; each running mean to rtol·r and running variance to 2·rtol·r², r the largest root
    mean square of a channel of the BatchNorm's input (a mean of values off by rtol·r is off by at most that;
    a variance, a mean of squared deviations, by about twice that times r). Return, per kind, the largest
    difference (relative for the logits and the gradient) and what rounding allows there, where their ratio
    is the largest."""
    if not ours.root_v:
        raise ValueError("ours must be a PyTorch run (torch_float64_run): the bounds read its Adam state")
    if ours.weights.keys() != ref.weights.keys() or ours.gradient.keys() != ref.gradient.keys():
        raise NotTheSameTraining(f"{what}: different arrays: {sorted(set(ours.weights) ^ set(ref.weights))}")
    rtol = twin_rtol(config, batch)
    atol = weight_atol(ours.grad_norms, ours.root_v, rtol, ref.weights)
    biggest = float(np.max(np.abs(ref.logits)))
    pairs = {"logits": [(np.max(np.abs(ours.logits - ref.logits)), biggest, rtol, "")]}
    pairs["first gradient"] = [
        (np.linalg.norm(ours.gradient[k] - ref.gradient[k]), np.linalg.norm(ref.gradient[k]), rtol, k) for k in ref.gradient]
    pairs["weights"] = []
    for k, allowed in atol.items():  # the entry nearest its bound
        gaps = np.abs(ours.weights[k] - ref.weights[k])
        ratio = gaps / np.maximum(allowed, np.finfo(np.float64).tiny)
        i = np.unravel_index(np.argmax(np.where(np.isnan(gaps), np.inf, ratio)), gaps.shape)
        pairs["weights"].append((gaps[i], 1.0, float(allowed[i]), k))
    for kind, key, power in (("running means", ".mean", 1), ("running variances", ".var", 2)):
        pairs[kind] = [(np.max(np.abs(ours.weights[k] - ref.weights[k])), 1.0,
                        power * rtol * ours.bn_scale[k.rsplit(".", 1)[0]] ** power, k)
                       for k in ref.weights if k.endswith(key)]
    out = {}
    for kind, rows in pairs.items():
        for gap, scale, allowed, name in rows:
            if not gap <= allowed * scale:  # also fails on NaN
                relative = " relative" if kind in ("logits", "first gradient") else ""
                raise NotTheSameTraining(f"{what}: the {kind}{f' ({name})' if name else ''} differ by "
                                         f"{gap / scale:.2e}{relative}, where float64 rounding allows {allowed:.2e}")
        gap, scale, allowed, _ = max(rows, key=lambda r: r[0] / (r[2] * r[1]) if r[2] * r[1] > 0 else 0.0)
        out[kind] = (float(gap / scale), float(allowed))
    return out


def check_rows(same: dict[str, tuple[float, float]], what: str = "float64, PyTorch twin against the floor") -> list[dict]:
    """:func:`check_same_training`'s result as table rows: each kind's largest difference, what rounding
    allows, and how many times below the bound it is."""
    how = {"logits": "relative to the largest logit", "first gradient": "relative to each array's norm"}
    return [{what: kind, "measured": how.get(kind, f"absolute, after {CHECK_STEPS} steps"), "largest difference": gap,
             "rounding allows": allowed, "× below the bound": allowed / max(gap, np.finfo(np.float64).tiny)}
            for kind, (gap, allowed) in same.items()]
