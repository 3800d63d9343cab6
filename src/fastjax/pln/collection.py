"""Part IV's model maths: PLN-PCA (pyPLNmodels' ``PlnPCA``) with members of several ranks padded to one
shape, its model-selection criteria, pyPLNmodels' own starts and fits, and the resampled rows of a bootstrap.

PLN-PCA: latent ``Z_i = X_i B + C W_i`` with ``W_i ~ N(0, I_q)`` and loadings ``C`` (p×q), so
``Σ = C Cᵀ`` has rank q. The variational law is ``W_i ~ N(M_i, diag(S_i²))`` (M and S are n×q). Every
parameter (M, S, C and B) is moved by Rprop; nothing is in closed form (pyPLNmodels'
``models/plnpca.py``, ``list_of_parameters_needing_gradient``). The ELBO is pyPLNmodels'
``calculations/elbos.py::elbo_plnpca``:

    Σ_ij [Y(O + XB + M Cᵀ) − exp(O + XB + M Cᵀ + ½ S² (C∘C)ᵀ) − log Y!] + ½ Σ log S² − ½ Σ (M² + S²) + nq/2.

A member of rank q among members padded to ``q_max`` columns carries a *mask* (q ones, then zeros): the
masked columns of M, S and C enter nothing, so their gradient is exactly 0 and torch's Rprop (which moves
an entry by ``sign(grad) · step``) never moves them.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, NamedTuple

import numpy as np

from fastjax import checks, pln


class PcaParams(NamedTuple):
    """The PLN-PCA parameters Rprop moves: latent means M (n×q), standard deviations S (n×q),
    loadings C (p×q, pyPLNmodels' ``components``), coefficients B (d×p)."""

    m: Any
    s: Any
    components: Any
    coef: Any


def rank_mask(rank: int, q_max: int, dtype: Any = np.float32) -> np.ndarray:
    """``rank`` ones then ``q_max − rank`` zeros: which columns of a padded member are real."""
    rank, q_max = checks.check_positive_int(rank, "rank"), checks.check_positive_int(q_max, "q_max")
    if rank > q_max:
        raise ValueError(f"rank must be at most q_max ({q_max}); got {rank}")
    return (np.arange(q_max) < rank).astype(dtype)


def pca_elbo(params: PcaParams, data: pln.PlnData, mask: Any, xp: Any = None) -> Any:
    """pyPLNmodels' PLN-PCA ELBO of a member padded to ``mask.shape[0]`` columns, of which ``mask`` marks
    the real ones (pass all ones for an unpadded member). Masked columns add exactly 0 to every term."""
    xp = pln._xp_default(xp)
    m, c = params.m * mask, params.components * mask
    s2 = (params.s * mask) ** 2
    n = data.counts.shape[0]
    log_intensity = data.offsets + data.covariates @ params.coef + m @ c.T
    a = xp.exp(log_intensity + 0.5 * (s2 @ (c * c).T))
    log_s2 = xp.where(mask > 0, s2, xp.ones_like(s2))  # log 1 = 0 on padding, and no gradient through it
    return (xp.sum(data.counts * log_intensity - a) + 0.5 * xp.sum(xp.log(log_s2))
            - 0.5 * xp.sum(m * m + s2) - data.log_factorial + 0.5 * n * xp.sum(mask))


def pca_loss(params: PcaParams, data_and_mask: tuple[pln.PlnData, Any]) -> Any:
    """The negative PLN-PCA ELBO of one member: ``data_and_mask = (data, mask)``, so that a member's mask
    travels with its data through ``fastjax.pln.rungs.fit_until_converged`` (Part I's loop)."""
    data, mask = data_and_mask
    return -pca_elbo(params, data, mask)


def number_of_parameters(dim: int, nb_cov: int, rank: Any) -> Any:
    """pyPLNmodels' count for PlnPCA: ``p(d + q) − q(q − 1)/2`` (loadings up to a rotation)."""
    return dim * (nb_cov + rank) - rank * (rank - 1) / 2


def entropy(s: Any, mask: Any, xp: Any = None) -> Any:
    """pyPLNmodels' ``entropy_gaussian`` of the variational law, on the real columns: it adds
    ``½ Σ S²`` (not ``½ Σ log S²``: its formula, kept as is) and ``nq/2 · (log 2π + 1)``."""
    xp = pln._xp_default(xp)
    size = s.shape[0] * xp.sum(mask)
    return 0.5 * xp.sum((s * mask) ** 2) + 0.5 * size * np.log(2 * np.pi) + 0.5 * size


def criteria(elbo: Any, s: Any, mask: Any, dim: int, nb_cov: int, xp: Any = None) -> dict[str, Any]:
    """BIC and ICL as pyPLNmodels defines them (lower is better): ``BIC = −ELBO + k/2 · log n`` with k
    from ``number_of_parameters``; ``ICL = BIC − entropy``. Works on one member or on stacked members."""
    xp = pln._xp_default(xp)
    n = s.shape[-2]
    rank = xp.sum(mask, axis=-1)
    bic = -elbo + number_of_parameters(dim, nb_cov, rank) / 2 * np.log(n)
    ent = 0.5 * xp.sum((s * mask[..., None, :]) ** 2, axis=(-2, -1)) + 0.5 * n * rank * (np.log(2 * np.pi) + 1)
    return {"BIC": bic, "ICL": bic - ent}


def pad(starts: list[PcaParams], q_max: int | None = None) -> tuple[PcaParams, np.ndarray]:
    """Stack members of different ranks into one ``PcaParams`` of ``q_max`` columns (the largest rank by
    default) and their masks (members × q_max). Padding: M and C by 0, S by 1 (any non-zero value)."""
    if not starts:
        raise ValueError("starts must hold at least one member")
    ranks = [int(np.shape(st.m)[1]) for st in starts]
    q_max = max(ranks) if q_max is None else checks.check_positive_int(q_max, "q_max")

    def widen(a: Any, value: float) -> np.ndarray:
        a = np.asarray(a)
        return np.concatenate([a, np.full((a.shape[0], q_max - a.shape[1]), value, a.dtype)], axis=1)

    stacked = PcaParams(*(np.stack(arrays) for arrays in zip(
        *((widen(st.m, 0.0), widen(st.s, 1.0), widen(st.components, 0.0), np.asarray(st.coef)) for st in starts))))
    masks = np.stack([rank_mask(r, q_max, stacked.m.dtype) for r in ranks])
    return stacked, masks


def unpad(params: PcaParams, rank: int) -> PcaParams:
    """One member's parameters without the padding: the first ``rank`` columns of M, S and C."""
    return PcaParams(np.asarray(params.m)[:, :rank], np.asarray(params.s)[:, :rank],
                     np.asarray(params.components)[:, :rank], np.asarray(params.coef))


def member_criteria(params: PcaParams, elbos: Any, crit: pln.Criterion, masks: Any, data: pln.PlnData) -> dict[str, Any]:
    """Each member's ELBO, BIC and ICL from a collection program's output (NumPy float64): a member's ELBO
    is the one its loop recorded before its last update (at ``crit.count − 1``), as pyPLNmodels reports it."""
    counts = np.asarray(crit.count)
    elbo = np.asarray(elbos, np.float64)[np.arange(counts.size), counts - 1]
    s, masks = np.asarray(params.s, np.float64), np.asarray(masks, np.float64)
    return {"ELBO": elbo, **criteria(elbo, s, masks, data.counts.shape[1], data.covariates.shape[1], np)}


def pca_elbo_condition(params: PcaParams, data: pln.PlnData, mask: Any) -> float:
    """How much the PLN-PCA ELBO's terms cancel, as ``pln.elbo_condition``: the sum of their magnitudes over
    |ELBO|, in float64. The log-intensity ``L = O + XB + MCᵀ`` counts with the magnitudes of its products
    (``|O| + |X||B| + |M||C|ᵀ``), and ``A = exp(L + ½ S²(C∘C)ᵀ)`` with ``A`` times its argument's magnitude
    (``exp`` turns an absolute error of its argument into a relative error of its value). Any order of
    adding the ``n·p`` outer terms, each a sum of ``d + q + 2`` products, is then off by at most
    ``(n·p + d + q + 2)·u`` times this condition times |ELBO| (Higham §4.2)."""
    p64 = PcaParams(*(np.asarray(a, np.float64) for a in params))
    mask = np.asarray(mask, np.float64)
    y, o, x = (np.asarray(a, np.float64) for a in data[:3])
    m, c, s2 = p64.m * mask, p64.components * mask, (p64.s * mask) ** 2
    l_abs = np.abs(o) + np.abs(x) @ np.abs(p64.coef) + np.abs(m) @ np.abs(c).T
    variance = 0.5 * (s2 @ (c * c).T)
    a = np.exp(o + x @ p64.coef + m @ c.T + variance)
    log_s2 = np.where(mask > 0, s2, 1.0)
    magnitude = (np.sum(y * l_abs) + np.sum(a * (1 + l_abs + variance)) + 0.5 * np.sum(np.abs(np.log(log_s2)))
                 + 0.5 * np.sum(m * m + s2) + abs(float(data.log_factorial)) + 0.5 * y.shape[0] * np.sum(mask))
    return float(magnitude / abs(pca_elbo(p64, pln.PlnData(y, o, x, float(data.log_factorial)), mask, np)))


def pca_start(data: pln.PlnData, rank: int) -> PcaParams:
    """A start of pyPLNmodels' kind for a PLN-PCA of ``rank``, in NumPy float64, without torch and without
    random draws (``pyplnmodels_pca`` draws pyPLNmodels' own). With ``L̃ = log(Y + e⁻² 1[Y=0]) − O``
    (pyPLNmodels' log transform): B by least squares of L̃ on X (pyPLNmodels runs a Poisson regression);
    C from the PCA of the residual ``R = L̃ − XB`` (pyPLNmodels' PCA of log Y: the same when X is the
    intercept and O = 0), each loading scaled by its component's standard deviation and signed so that its
    largest entry is positive; M the ridge projection ``R C (CᵀC + I)⁻¹`` (pyPLNmodels takes Rprop steps on
    the posterior from a random M); S pyPLNmodels' Laplace formula at M. Needs
    ``rank`` ≤ min(p, n − 1) (a PCA of n centred rows has n − 1 components)."""
    y, o, x = (np.asarray(a, np.float64) for a in data[:3])
    n, p = y.shape
    rank = checks.check_positive_int(rank, "rank")
    if rank > min(p, n - 1):
        raise ValueError(f"rank must be at most min(p, n − 1) = {min(p, n - 1)} for {n}×{p} counts; got {rank}")
    log_y = np.log(y + (y == 0) * np.exp(-2.0)) - o
    coef = np.linalg.lstsq(x, log_y, rcond=None)[0]
    resid = log_y - x @ coef
    _, sv, vt = np.linalg.svd(resid, full_matrices=False)
    c = vt[:rank].T * (sv[:rank] / np.sqrt(n - 1))
    c = c * np.where(c[np.argmax(np.abs(c), axis=0), np.arange(rank)] < 0, -1.0, 1.0)
    m = np.linalg.solve(c.T @ c + np.eye(rank), c.T @ resid.T).T
    intensity = np.exp(o + x @ coef + m @ c.T)
    hessian = np.einsum("ij,jk,jl->ikl", intensity, c, c) + np.eye(rank)
    s = np.sqrt(np.diagonal(np.linalg.inv(hessian), axis1=1, axis2=2))
    return PcaParams(m, s, c, coef)


# ----------------------------------------------------------------------------- pyPLNmodels' side

def _quiet_import() -> Any:
    with warnings.catch_warnings():  # pyPLNmodels imports pkg_resources, which announces its own deprecation
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        import pyPLNmodels
    return pyPLNmodels


def pyplnmodels_pca(data: pln.PlnData, rank: int, seed: int = 0) -> tuple[Any, PcaParams]:
    """A ``pyPLNmodels.PlnPCA(rank=rank)`` of ``data`` with its start drawn (its own initialisation, seeded:
    a Poisson regression for B, a PCA of log Y for C, a few Rprop steps for M, a Laplace S), and that start
    as float64 NumPy arrays. ``fit_pyplnmodels_pca`` then fits from it."""
    import torch

    plnm = _quiet_import()
    torch.manual_seed(seed)
    np.random.seed(seed)  # pyPLNmodels draws padding loadings with NumPy when rank > n
    model = plnm.PlnPCA(np.asarray(data.counts), offsets=np.asarray(data.offsets),
                        exog=np.asarray(data.covariates), add_const=False, rank=rank)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        model._init_parameters()
    start = PcaParams(*(t.detach().numpy().astype(np.float64) for t in
                        (model._latent_mean, model._latent_sqrt_variance, model._components, model._coef)))
    return model, start


def fit_pyplnmodels_pca(model: Any, data: pln.PlnData, dtype: str = "float32", maxiter: int = pln.MAXITER,
                        tol: float = pln.TOL) -> tuple[float, np.ndarray]:
    """``model.fit()`` quietly from the start ``pyplnmodels_pca`` drew, in float32 (its own) or float64 (its
    data and start cast): (seconds, the ELBO before each update)."""
    from fastjax.pln.bench import fit_quietly

    return fit_quietly(model, data, dtype, maxiter, tol,
                       start=("_latent_mean", "_latent_sqrt_variance", "_components", "_coef"))


def pyplnmodels_collection(data: pln.PlnData, ranks: Any) -> Any:
    """``pyPLNmodels.PlnPCACollection(ranks=ranks)`` of ``data``, not fitted (its ``fit()`` fits the members
    one after another, each from the one before: ``utils/_utils.py::_init_next_model_pca``)."""
    plnm = _quiet_import()
    return plnm.PlnPCACollection(np.asarray(data.counts), offsets=np.asarray(data.offsets),
                                 exog=np.asarray(data.covariates), add_const=False, ranks=list(ranks))


# ----------------------------------------------------------------------------- bootstrap

def resample_rows(data: pln.PlnData, indices: Any) -> pln.PlnData:
    """The rows ``indices`` of ``data`` (NumPy), with its ``Σ log Y!`` recomputed: one bootstrap sample.
    Count columns that the sample leaves all zero stay (a stacked bootstrap needs one shape)."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"indices must be a 1-D integer array; got shape {idx.shape}, dtype {idx.dtype}")
    n = np.shape(data.counts)[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"indices must lie in [0, {n}); got {idx.min()}..{idx.max()}")
    y = np.asarray(data.counts)[idx]
    return pln.PlnData(y, np.asarray(data.offsets)[idx], np.asarray(data.covariates)[idx],
                       float(np.sum(pln.log_stirling(y))))


def bootstrap_samples(data: pln.PlnData, n_boot: int, seed: int = 0) -> tuple[pln.PlnData, np.ndarray]:
    """``n_boot`` samples of the rows of ``data`` drawn with replacement, stacked on a leading axis
    (NumPy; ``log_factorial`` becomes a vector), and the drawn row indices (n_boot × n)."""
    n_boot = checks.check_positive_int(n_boot, "n_boot")
    n = np.shape(data.counts)[0]
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    samples = [resample_rows(data, row) for row in idx]
    return pln.PlnData(*(np.stack([np.asarray(getattr(s, f)) for s in samples]) for f in pln.PlnData._fields)), idx


def percentile_interval(values: Any, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """The percentile bootstrap interval at ``level``: the (1 − level)/2 and (1 + level)/2 quantiles of
    ``values`` over its first axis (the bootstrap samples)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1); got {level}")
    v = np.asarray(values)
    return np.quantile(v, (1 - level) / 2, axis=0), np.quantile(v, (1 + level) / 2, axis=0)
