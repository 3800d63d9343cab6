"""The command's fits: Part VI's fit (``fit``), Part IV's PLN-PCA collection (``fit_ranks``) and bootstrap
(``fit_bootstrap``), each one program run by ``run.run_program``, with what they take and give.

The fit is Part VI's (``fastjax.pln.floor.fit_fast``, pyPLNmodels' optimizer and stopping rule), in float32.
Part IV's fits (chapters/many), each one program of many fits (``fastjax.pln.many``, exported from the
chapters), in float32:

- ``--ranks SPEC``: a PLN-PCA of each rank, the members padded to the largest rank and masked
  (``many.fit_collection``), each from a start of pyPLNmodels' kind computed in NumPy
  (``collection.pca_start``) and stopped by pyPLNmodels' rule. A rank is at most the number of count
  columns, and than n − 1.
- ``--bootstrap B``: B refits of the PLN on samples of the rows drawn with replacement
  (``collection.bootstrap_samples``) and the fit of all the rows, as one program (``bootstrap_program``:
  Part VI's fit of each sample, one after another). A sample whose covariates are not of full column rank
  is bad input.

Their members are split over the CPU's cores, one JAX device each (``cores.over_cores``: on oaks, two cores
fit ``--bootstrap`` in about half the time of one). Their programs are cached as the fit's is, under keys
that also name the program and its members
(``cache_what``'s ``program``) and hash Part IV's sources (``MANY_SOURCES``); a loaded one must give every
member's first ELBO as NumPy's float64 does (``check_first_pca_elbos``, ``check_first_bootstrap_elbos``).
The samples' seed is an input, not part of the program: another seed reuses the program.

``--converge`` (any of the three): then every member fitted on from where it stopped, in float64, by L-BFGS
until its ELBO stops gaining (``lbfgs_until_flat``), one more cached program (``converge_program``,
``converge_fit_program``, ``converge_bootstrap_program``) whose first ELBOs must be NumPy's float64 ones.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

import numpy as np

from fastjax import pln
from fastjax.pln.fit.cache import cache_what
from fastjax.pln.fit.cores import over_cores
from fastjax.pln.fit.options import LEVEL, check_maxiter, check_tol, ranks_text
from fastjax.pln.fit.run import (Program, _float32, _import_jax, _member, check_first_bootstrap_elbos,
                                 check_first_converge_elbos, check_first_converge_fit_elbo, check_first_elbo, check_first_pca_elbos, checked_elbos,
                                 run_program)


def fit_program(data: pln.PlnData, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part VI's fit from pyPLNmodels' start, as one program: ``F.fit_fast(pln.start(data), data, ...)``."""
    from fastjax.pln import floor as F

    return F.fit_fast(pln.start(data), data, tol, target, maxiter=maxiter)


_EXPORT_REGISTERED: list[bool] = []


def register_for_export() -> None:
    """Let ``jax.export`` serialize the fit's pytrees (``pln.PlnData`` in, ``pln.Criterion`` out), once per
    process: a process that deserializes an exported fit must call it too."""
    if _EXPORT_REGISTERED:
        return
    from jax import export

    for cls in (pln.PlnData, pln.Criterion):
        export.register_namedtuple_serialization(cls, serialized_name=f"fastjax.pln.{cls.__name__}")
    _EXPORT_REGISTERED.append(True)



class FitResult(NamedTuple):
    """A fit: ``M``, ``S`` (n×p), ``B`` (d×p), ``Σ`` (p×p) in float64 NumPy, the ELBO of each iteration,
    the criterion at the end, where the program came from and the seconds of each stage."""

    m: np.ndarray
    s: np.ndarray
    coef: np.ndarray
    covariance: np.ndarray
    elbos: np.ndarray
    criterion: float
    program: str
    seconds: dict[str, float]
    converge_iterations: int | None = None  # --converge: L-BFGS's iterations after Rprop's (their ELBOs follow)

    @property
    def elbo(self) -> float:
        """The last ELBO."""
        return float(self.elbos[-1])

    def converged(self, tol: float) -> bool:
        """Whether the fit stopped by its rule: pyPLNmodels' tolerance, or with ``--converge``, L-BFGS's before
        ``CONVERGE_MAXITER``."""
        if self.converge_iterations is not None:
            return self.converge_iterations < CONVERGE_MAXITER
        return abs(self.criterion) < tol



def fit(data: pln.PlnData, maxiter: int = pln.MAXITER, tol: float = pln.TOL, cache: str | os.PathLike | None = None,
        progress: bool = False, compile_options: dict[str, Any] | None = None, converge: bool = False) -> FitResult:
    """Fit ``data`` (NumPy ``PlnData``, e.g. from ``read_data``) with ``fit_program``, compiled once per
    shape (with XLA's ``compile_options``, e.g. ``QUICK_COMPILE``): loaded from ``cache`` (a folder; None:
    no cache) when this command saved it there before (module docstring: the checks). Problems with the
    cache are warnings (UserWarning, one line each); FloatingPointError when the fit fails. ``converge``:
    then fit on from where it stopped, in float64 (``converge_fit_program``, cached as the others are)."""
    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    prog = Program(fit_program, (_float32(data), np.float32(tol), np.float32(np.inf)),
                   cache_what(data.shape, maxiter, compile_options), "fit",
                   f"compiling the fit for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_elbo(out[1], data), valid=lambda out: checked_elbos(out[1], out[2]))
    ((m, s), elbos, crit), program = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    elbos = checked_elbos(elbos, crit)
    m, s = np.asarray(m, np.float64), np.asarray(s, np.float64)
    k = None
    if converge:
        data64, more, t0 = _float64_data(data), {}, time.perf_counter()
        prog = Program(converge_fit_program, ((m, s), data64), _converge_what(data, compile_options, kind="converge fit"),
                       "convergence", f"compiling the convergence of the fit for {n}×{p} counts (once per shape)",
                       first=lambda out: check_first_converge_fit_elbo(np.asarray(out[1])[0], m, s, data64),
                       valid=lambda out: checked_elbos(out[1], pln.Criterion(out[2], 0.0, 0.0, 0.0, 0.0), "--converge: "))
        ((m, s), more_elbos, k), where = run_float64(prog, cache, progress, compile_options, more, t0)
        m, s, k = np.asarray(m, np.float64), np.asarray(s, np.float64), int(k)
        elbos = np.concatenate([np.asarray(elbos, np.float64), np.asarray(more_elbos)[:k]])
        program = f"{program}; convergence {where}"
        seconds.update(converge_program=more["program"], converge=more["fit"])
    x = np.asarray(data.covariates, np.float64)
    return FitResult(m, s, pln.closed_form_coef(x, m, np), pln.closed_form_covariance(x, m, s, np),
                     elbos, float(crit.value), program, seconds, k)


def collection_program(params: Any, data_and_masks: Any, tol: Any, target: Any, maxiter: int = pln.MAXITER) -> Any:
    """Part IV's PLN-PCA collection as one program (``fastjax.pln.many.fit_collection``, chapters/many/01)."""
    from fastjax.pln import many

    data, masks = data_and_masks
    def members(share: Any, data: Any, tol: Any, target: Any) -> Any:
        return many.fit_collection(share[0], (data, share[1]), tol, target, maxiter=maxiter)

    return over_cores(members, (params, masks), data, tol, target)


def bootstrap_program(samples: pln.PlnData, tol: Any, target: Any, maxiter: int = pln.MAXITER,
                      keep_params: bool = False) -> Any:
    """The bootstrap as one program: each sample refitted by Part VI's fit (``fastjax.pln.floor.fit_fast``: the
    hand-written gradient), one sample after another on each core (``lax.map`` in ``cores.over_cores``), with
    its coefficients in closed form: outputs of the same kind as Part IV's ``fastjax.pln.many.bootstrap`` (the
    float32 numbers differ by rounding: two gradients, computed differently).

    Why not ``jax.vmap`` over the samples, as chapters/many/02 teaches: on XLA:CPU, measured on oaks at 8 and 64
    members, the batched fit cost more per refit than one fit at a time, and its memory grew with every member.
    Member by member, memory holds one refit's working set besides the samples and the outputs.
    ``keep_params``: each member's ``(M, S)`` is a fourth output (``--converge`` fits on from there)."""
    import jax

    from fastjax.pln import floor as F

    def refits(share: pln.PlnData, tol: Any, target: Any) -> Any:
        def refit(sample: pln.PlnData) -> Any:
            params, elbos, crit = F.fit_fast(pln.start(sample), sample, tol, target, maxiter=maxiter)
            out = pln.closed_form_coef(sample.covariates, params[0]), elbos, crit
            return (*out, params) if keep_params else out

        return jax.lax.map(refit, share)

    return over_cores(refits, samples, tol, target)


class Collection(NamedTuple):
    """The members of a PLN-PCA collection before the fit: their ranks, their starts (``collection.pca_start``,
    float64, padded to the largest rank by ``collection.pad``) and their masks."""

    ranks: list[int]
    starts: Any
    masks: np.ndarray


def prepare_ranks(data: pln.PlnData, ranks: list[int]) -> Collection:
    """Check ``ranks`` against ``data`` (each at most the number of count columns, and than n − 1) and draw
    each member's start (NumPy, before JAX); else ValueError."""
    from fastjax.pln import collection as col

    n, p, _ = data.shape
    if ranks[-1] > p:
        raise ValueError(f"--ranks {ranks_text(ranks)}: rank {ranks[-1]} is above the number of count columns, {p} "
                         "(after any column of zeros is removed): a rank is at most that")
    if ranks[-1] > n - 1:
        raise ValueError(f"--ranks {ranks_text(ranks)}: rank {ranks[-1]} needs more samples: the PCA that starts a "
                         f"member has at most n − 1 = {n - 1} components for {n} samples")
    starts, masks = col.pad([col.pca_start(data, q) for q in ranks])
    return Collection(ranks, starts, masks)


CONVERGE_WINDOW = 200  # --converge: a member stops when its ELBO gained less than CONVERGE_RTOL of itself over this many
CONVERGE_RTOL = 1e-7  # iterations (on oaks, ranks 1-10 from the start: within 6.5e-5 of a float64 L-BFGS-B run to its end)
CONVERGE_MAXITER = 50_000  # --converge: the iterations of one member at most (oaks' slowest rank needed about 19,000)


def lbfgs_until_flat(loss: Any, params: Any, maxiter: int = CONVERGE_MAXITER) -> Any:
    """``params`` fitted on (in their precision: float64 for ``--converge``) by L-BFGS (``optax.lbfgs``, its zoom
    line search) on ``loss`` (the negative ELBO), until the ELBO gained less than ``CONVERGE_RTOL`` of itself
    over the last ``CONVERGE_WINDOW`` iterations, or ``maxiter`` iterations: ``(params, ELBO of each iteration
    (NaN past the stop), iterations)``."""
    import jax
    import jax.numpy as jnp
    import optax

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def running(carry: Any) -> Any:
        _, _, k, elbos = carry
        gained = elbos[k - 1] - elbos[k - 1 - CONVERGE_WINDOW]
        return (k < maxiter) & ((k <= CONVERGE_WINDOW) | (gained > CONVERGE_RTOL * jnp.abs(elbos[k - 1])))

    def body(carry: Any) -> Any:
        p, state, k, elbos = carry
        value, grad = value_and_grad(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state, k + 1, elbos.at[k].set(-value)

    elbos = jnp.full((maxiter,), jnp.nan, jax.tree.leaves(params)[0].dtype)
    params, _, k, elbos = jax.lax.while_loop(running, body, (params, opt.init(params), jnp.int32(0), elbos))
    return params, elbos, k


def converge_member(params: Any, data_and_mask: Any, maxiter: int = CONVERGE_MAXITER) -> Any:
    """One PLN-PCA member fitted on from ``params`` by ``lbfgs_until_flat`` on its ELBO. The masked columns of a
    padded member have a gradient of 0, so L-BFGS leaves them."""
    from fastjax.pln import collection as col

    return lbfgs_until_flat(lambda p: col.pca_loss(p, data_and_mask), params, maxiter)


def converge_fit_program(params: Any, data: pln.PlnData, maxiter: int = CONVERGE_MAXITER) -> Any:
    """``--converge`` with the PLN fit: ``(M, S)`` fitted on from ``params`` by ``lbfgs_until_flat`` on the
    profiled ELBO (Part VI's hand gradient, ``floor.loss_by_hand``), in float64 (under ``jax_enable_x64``)."""
    from fastjax.pln import floor as F

    return lbfgs_until_flat(lambda p: F.loss_by_hand(p, data), params, maxiter)


def converge_bootstrap_program(params: Any, samples: pln.PlnData, maxiter: int = CONVERGE_MAXITER) -> Any:
    """``--converge`` with ``--bootstrap``: each member's ``(M, S)`` fitted on by ``converge_fit_program``, one
    after another (``lax.map``): its coefficients in closed form, its ELBO before and after, its iterations."""
    import jax

    def member(ps: Any) -> Any:
        p, sample = ps
        (m, _), elbos, k = converge_fit_program(p, sample, maxiter)
        return pln.closed_form_coef(sample.covariates, m), elbos[0], elbos[k - 1], k

    return over_cores(lambda share: jax.lax.map(member, share), (params, samples))


def _float64_data(data: pln.PlnData) -> pln.PlnData:
    return pln.PlnData(*(np.asarray(a, np.float64) for a in data[:3]), np.asarray(data.log_factorial, np.float64))


def run_float64(prog: Program, cache: str | os.PathLike | None, progress: bool,
                compile_options: dict[str, Any] | None, seconds: dict[str, float], t0: float) -> tuple[Any, str]:
    """``run_program`` of a ``--converge`` program, with ``maxiter`` ``CONVERGE_MAXITER``, under JAX's
    process-wide float64 flag (``interruptible`` traces and runs the program in a worker thread, where
    ``jax.enable_x64()`` does not reach), set back as it was after."""
    import jax

    previous = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", True)
    try:
        return run_program(prog, CONVERGE_MAXITER, cache, progress, compile_options, seconds, t0)
    finally:
        jax.config.update("jax_enable_x64", previous)


def _converge_what(data: pln.PlnData, compile_options: dict[str, Any] | None, **program: Any) -> dict[str, Any]:
    return cache_what(data.shape, CONVERGE_MAXITER, compile_options,
                      dict(program, dtype="float64", window=CONVERGE_WINDOW, rtol=CONVERGE_RTOL))


def converge_program(params: Any, data_and_masks: Any, maxiter: int = CONVERGE_MAXITER) -> Any:
    """``--converge``: every member of a collection fitted on by ``converge_member``, one after another
    (``lax.map``), in float64 (run it under ``jax.enable_x64``)."""
    import jax

    data, masks = data_and_masks
    return over_cores(lambda share, data: jax.lax.map(lambda pm: converge_member(pm[0], (data, pm[1]), maxiter), share),
                      (params, masks), data)


class Bootstrap(NamedTuple):
    """A bootstrap before the fit: the samples, member 0 all the rows as they are and members 1..B drawn
    with replacement (stacked NumPy ``PlnData``), the drawn row indices (B × n) and the seed."""

    samples: pln.PlnData
    rows: np.ndarray
    seed: int


def prepare_bootstrap(data: pln.PlnData, n_boot: int, seed: int = 0) -> Bootstrap:
    """Draw ``n_boot`` samples of the rows of ``data`` (``collection.bootstrap_samples``, NumPy, before JAX) and
    put all the rows in front; ValueError when a sample's covariates are not of full column rank (its
    coefficients would not be defined)."""
    from fastjax.pln import collection as col

    drawn, rows = col.bootstrap_samples(data, n_boot, seed)
    d = data.covariates.shape[1]
    for b in range(n_boot):
        rank = np.linalg.matrix_rank(drawn.covariates[b])
        if rank < d:
            raise ValueError(f"--bootstrap: sample {b} (seed {seed}) draws rows whose covariates have rank {rank}, "
                             f"not {d}: its coefficients are not defined. A covariate that is constant, or non-zero "
                             "in few rows, does that; drop or merge such covariates")
    whole = col.resample_rows(data, np.arange(data.shape[0]))
    samples = pln.PlnData(*(np.concatenate([np.asarray(a)[None], np.asarray(b)]) for a, b in zip(whole, drawn)))
    return Bootstrap(samples, rows, seed)


class RanksResult(NamedTuple):
    """A PLN-PCA collection fitted: the ranks, each member's ELBO, BIC, ICL (``collection.member_criteria``)
    and iterations, its parameters (float64, padded, with the masks) and ELBO of each iteration (members ×
    maxiter, NaN past its stop), where the program came from and the seconds of each stage."""

    ranks: list[int]
    elbo: np.ndarray
    bic: np.ndarray
    icl: np.ndarray
    iterations: np.ndarray
    params: Any
    masks: np.ndarray
    elbos: np.ndarray
    program: str
    seconds: dict[str, float]
    converge_iterations: np.ndarray | None = None  # --converge: each member's L-BFGS iterations after Rprop's

    def converged(self, maxiter: int) -> np.ndarray:
        """Which members stopped by their rule: pyPLNmodels' tolerance before ``maxiter``, or with
        ``--converge``, ``converge_member``'s before ``CONVERGE_MAXITER``."""
        if self.converge_iterations is not None:
            return np.asarray(self.converge_iterations) < CONVERGE_MAXITER
        return np.asarray(self.iterations) < maxiter

    def best(self, criterion: str = "BIC") -> int:
        """The rank that ``criterion`` ("BIC" or "ICL", lower is better) chooses."""
        return int(self.ranks[int(np.argmin(self.bic if criterion == "BIC" else self.icl))])

    def member(self, rank: int) -> Any:
        """The parameters of the member of ``rank``, without padding (``collection.PcaParams``)."""
        from fastjax.pln import collection as col

        i = self.ranks.index(rank)
        return col.unpad(col.PcaParams(*(np.asarray(a)[i] for a in self.params)), rank)


def fit_ranks(data: pln.PlnData, collection: Collection, maxiter: int = pln.MAXITER, tol: float = pln.TOL,
              cache: str | os.PathLike | None = None, progress: bool = False,
              compile_options: dict[str, Any] | None = None, converge: bool = False) -> RanksResult:
    """Fit the PLN-PCA members of ``collection`` (``prepare_ranks``) to ``data`` as one program
    (``collection_program``), in float32, cached as ``fit`` caches its program. ``converge``: then fit every
    member on to its optimum (``converge_ranks``); the result is that of the members where they ended."""
    from fastjax.pln import collection as col

    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    ranks, masks = collection.ranks, collection.masks
    starts32 = col.PcaParams(*(np.asarray(a, np.float32) for a in collection.starts))
    args = (starts32, (_float32(data), np.asarray(masks, np.float32)), np.float32(tol), np.float32(np.inf))
    program = dict(kind="ranks", members=len(ranks), q_max=int(masks.shape[1]))

    def valid(out: Any) -> None:
        for i, q in enumerate(ranks):
            checked_elbos(np.asarray(out[1])[i], _member(out[2], i), f"rank {q}: ")

    prog = Program(collection_program, args, cache_what(data.shape, maxiter, compile_options, program), "collection",
                   f"compiling the collection of ranks {ranks_text(ranks)} for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_pca_elbos(out[1], collection.starts, masks, data), valid=valid)
    (params, elbos, crit), where = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    params = col.PcaParams(*(np.asarray(a, np.float64) for a in params))
    table = col.member_criteria(params, elbos, crit, masks, data)
    result = RanksResult(list(ranks), table["ELBO"], np.asarray(table["BIC"]), np.asarray(table["ICL"]),
                         np.asarray(crit.count), params, masks, np.asarray(elbos), where, seconds)
    return converge_ranks(data, result, cache, progress, compile_options) if converge else result


def converge_ranks(data: pln.PlnData, result: RanksResult, cache: str | os.PathLike | None = None,
                   progress: bool = False, compile_options: dict[str, Any] | None = None) -> RanksResult:
    """``--converge``: every member of ``result`` fitted on from where it stopped, in float64, by
    ``converge_program`` (cached as the others are), its first ELBOs checked against NumPy's float64 ones at
    those parameters. The result holds the members where they ended: their ELBO (NumPy's float64 at their
    parameters), BIC and ICL, and ``converge_iterations`` (each member's L-BFGS iterations; below
    ``CONVERGE_MAXITER``: stopped by the rule)."""
    from fastjax.pln import collection as col

    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    n, p, _ = data.shape
    ranks, masks = result.ranks, np.asarray(result.masks, np.float64)
    data64 = _float64_data(data)

    def first(out: Any) -> None:
        check_first_converge_elbos(out[1], result.params, masks, data64)

    def valid(out: Any) -> None:
        for i, q in enumerate(ranks):
            checked_elbos(np.asarray(out[1])[i], pln.Criterion(np.asarray(out[2])[i], 0.0, 0.0, 0.0, 0.0),
                          f"rank {q} (--converge): ")

    prog = Program(converge_program, (result.params, (data64, masks)),
                   _converge_what(data, compile_options, kind="converge", members=len(ranks), q_max=int(masks.shape[1])),
                   "convergence", f"compiling the convergence of ranks {ranks_text(ranks)} for {n}×{p} counts (once per "
                   "shape)", first=first, valid=valid)
    (params, _, count), where = run_float64(prog, cache, progress, compile_options, seconds, t0)
    params = col.PcaParams(*(np.asarray(a, np.float64) for a in params))
    elbo = np.array([float(col.pca_elbo(col.PcaParams(*(a[i] for a in params)), data64, masks[i], np))
                     for i in range(len(ranks))])
    table = col.criteria(elbo, params.s, masks, p, data.shape[2], np)
    times = dict(result.seconds, converge_program=seconds["program"], converge=seconds["fit"])
    return result._replace(elbo=elbo, bic=np.asarray(table["BIC"]), icl=np.asarray(table["ICL"]), params=params,
                           program=f"{result.program}; convergence {where}", seconds=times,
                           converge_iterations=np.asarray(count))


class BootstrapResult(NamedTuple):
    """A bootstrap fitted: ``coef`` the B (d×p) of all the rows, ``coefs`` each refit's (n_boot × d × p), the
    percentile interval (``low``, ``high``) at ``level``, the drawn rows, the seed, each member's
    iterations (all the rows first), where the program came from and the seconds of each stage."""

    coef: np.ndarray
    coefs: np.ndarray
    low: np.ndarray
    high: np.ndarray
    level: float
    rows: np.ndarray
    seed: int
    iterations: np.ndarray
    program: str
    seconds: dict[str, float]
    empty: np.ndarray  # (n_boot, p): the refit's rows hold only zeros in that column (its coefficients NaN)
    converge_iterations: np.ndarray | None = None  # --converge: each member's L-BFGS iterations after Rprop's

    def converged(self, maxiter: int) -> np.ndarray:
        """Which members (all the rows first) stopped by their rule: pyPLNmodels' tolerance before ``maxiter``,
        or with ``--converge``, L-BFGS's before ``CONVERGE_MAXITER``."""
        if self.converge_iterations is not None:
            return np.asarray(self.converge_iterations) < CONVERGE_MAXITER
        return np.asarray(self.iterations) < maxiter


def fit_bootstrap(data: pln.PlnData, boot: Bootstrap, maxiter: int = pln.MAXITER, tol: float = pln.TOL,
                  cache: str | os.PathLike | None = None, progress: bool = False,
                  compile_options: dict[str, Any] | None = None, level: float = LEVEL,
                  converge: bool = False) -> BootstrapResult:
    """Refit ``boot``'s samples (``prepare_bootstrap``: all the rows, then the drawn ones) as one program
    (``bootstrap_program``), in float32, cached as ``fit`` caches its program; the percentile interval at
    ``level`` of each coefficient from the drawn samples' refits. ``converge``: every member then fitted on
    from where it stopped, in float64 (``converge_bootstrap_program``), and the intervals taken from there."""
    import functools

    from fastjax.pln import collection as col

    maxiter, tol = check_maxiter(maxiter), check_tol(tol)
    seconds, t0 = _import_jax()
    n, p, _ = data.shape
    members = int(np.shape(boot.samples.counts)[0])
    program = dict(kind="bootstrap", members=members, **({"params": True} if converge else {}))

    def valid(out: Any) -> None:
        for b in range(members):
            checked_elbos(np.asarray(out[1])[b], _member(out[2], b), "the fit of all rows: " if b == 0 else f"refit {b}: ")

    function = functools.partial(bootstrap_program, keep_params=True) if converge else bootstrap_program
    prog = Program(function, (_float32(boot.samples), np.float32(tol), np.float32(np.inf)),
                   cache_what(data.shape, maxiter, compile_options, program), "bootstrap",
                   f"compiling the bootstrap of {members - 1} refits for {n}×{p} counts (once per shape)",
                   first=lambda out: check_first_bootstrap_elbos(out[1], boot.samples), valid=valid)
    (coefs, _, crit, *params), where = run_program(prog, maxiter, cache, progress, compile_options, seconds, t0)
    coefs, k = np.asarray(coefs, np.float64), None
    if converge:
        coefs, k, where = _converge_bootstrap(data, boot, params[0], where, cache, progress, compile_options, seconds)
    refits, empty = coefs[1:].copy(), np.asarray(boot.samples.counts)[1:].sum(axis=1) == 0  # (B, p)
    low, high = col.percentile_interval(refits, level)
    # A refit whose rows hold only zeros in a column has no finite coefficients there (its fit runs to −∞
    # the longer it runs, and stops wherever --maxiter leaves it): they are NaN in ``coefs``, and every
    # coefficient of such a column gets an unbounded interval (−∞, +∞): the resampling says nothing finite.
    refits[np.broadcast_to(empty[:, None, :], refits.shape)] = np.nan
    unbounded = empty.any(axis=0)
    low[:, unbounded], high[:, unbounded] = -np.inf, np.inf
    return BootstrapResult(coefs[0], refits, low, high, level, boot.rows, boot.seed, np.asarray(crit.count),
                           where, seconds, empty, k)


def _converge_bootstrap(data: pln.PlnData, boot: Bootstrap, params: Any, where: str, cache: str | os.PathLike | None,
                        progress: bool, compile_options: dict[str, Any] | None, seconds: dict[str, float]) -> tuple:
    """``--converge`` with ``--bootstrap``: every member fitted on from ``params`` (where its float32 refit
    stopped) by ``converge_bootstrap_program``, its first ELBO checked against NumPy's float64 one there:
    ``(coefficients, each member's L-BFGS iterations, where the programs came from)``."""
    n, p, _ = data.shape
    m32, s32 = params
    samples64, more, t0 = _float64_data(boot.samples), {}, time.perf_counter()
    members = int(np.shape(samples64.counts)[0])
    params64 = (np.asarray(m32, np.float64), np.asarray(s32, np.float64))

    def sample(b: int) -> pln.PlnData:
        return pln.PlnData(*(a[b] for a in samples64[:3]), float(samples64.log_factorial[b]))

    def first(out: Any) -> None:
        for b in range(members):
            check_first_converge_fit_elbo(np.asarray(out[1])[b], params64[0][b], params64[1][b], sample(b),
                                          "the fit of all rows" if b == 0 else f"refit {b}")

    def valid(out: Any) -> None:
        last = np.asarray(out[2])
        bad = np.flatnonzero(~np.isfinite(last) | (last >= 0))
        if bad.size:
            b = int(bad[0])
            raise FloatingPointError(f"{'the fit of all rows' if b == 0 else f'refit {b}'} (--converge): its ELBO "
                                     f"reached {last[b]:.6g}; fit with pyPLNmodels in float64")

    prog = Program(converge_bootstrap_program, (params64, samples64),
                   _converge_what(data, compile_options, kind="converge bootstrap", members=members), "convergence",
                   f"compiling the convergence of the bootstrap's {members - 1} refits for {n}×{p} counts (once per "
                   "shape)", first=first, valid=valid)
    (coefs, _, _, k), more_where = run_float64(prog, cache, progress, compile_options, more, t0)
    seconds.update(converge_program=more["program"], converge=more["fit"])
    return np.asarray(coefs, np.float64), np.asarray(k), f"{where}; convergence {more_where}"

