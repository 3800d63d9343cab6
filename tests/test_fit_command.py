"""fastjax.pln.fit: the command reads a reader's CSV, refuses bad input with a clear message and a non-zero
exit (never a traceback), and fits exactly what the same program fits in-process, from its cache too."""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import fit as fitcmd

RNG = np.random.default_rng(0)
COUNTS = RNG.poisson(3.0, size=(24, 5))
MAXITER = 40  # a short fit: the tests check the plumbing, not convergence


def write_csv(path, rows, header=None):
    lines = ([",".join(header)] if header else []) + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_command(*args, env=None):
    return subprocess.run([sys.executable, "-m", "fastjax.pln.fit", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env)


def fails_clearly(capsys, args, *words, code=2):
    assert fitcmd.main([str(a) for a in args]) == code
    err = capsys.readouterr().err
    assert err.startswith(f"{fitcmd.PROG}: error: ") and "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


# ----------------------------------------------------------------------------- reading

def test_csv_with_header_and_row_names(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("sample,a,b\ns1,1,2\ns2,3,4\n")
    np.testing.assert_array_equal(fitcmd.read_matrix(path, "counts"), [[1, 2], [3, 4]])


def test_plain_csv_tsv_and_spaces(tmp_path):
    for name, text in (("c.csv", "1,2\n3,4\n"), ("c.tsv", "1\t2\n3\t4\n"), ("c.txt", "1 2\n3   4\n")):
        path = tmp_path / name
        path.write_text(text)
        np.testing.assert_array_equal(fitcmd.read_matrix(path, "counts"), [[1, 2], [3, 4]])


def test_npz_holds_counts_and_offsets(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, counts=COUNTS, offsets=np.zeros(COUNTS.shape))
    data = fitcmd.read_data(path)
    assert data.shape == (24, 5, 1) and np.all(data.covariates == 1)


# ----------------------------------------------------------------------------- bad input

def test_missing_file_exits_with_a_message_not_a_traceback(tmp_path):
    proc = run_command(tmp_path / "nowhere.csv")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "counts file not found" in proc.stderr and "nowhere.csv" in proc.stderr


def test_negative_count(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", [[1, 2], [-3, 4]], header=["a", "b"])
    fails_clearly(capsys, [path], "non-negative integers", "-3", "row 1, column 0")


def test_non_integer_count(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", [[1, 2.5], [3, 4]])
    fails_clearly(capsys, [path], "non-negative integers", "2.5")


@pytest.mark.parametrize("cell", ["nan", "", "NA"])
def test_nan_count(tmp_path, capsys, cell):
    path = write_csv(tmp_path / "c.csv", [[1, 2], [3, cell]])
    fails_clearly(capsys, [path], "must be finite", "nan")


def test_text_in_a_count(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", [[1, 2], [3, "x7"]])
    fails_clearly(capsys, [path], "'x7'", "not a number", "row 1, column 1")


def test_ragged_table(tmp_path, capsys):
    path = tmp_path / "c.csv"
    path.write_text("1,2,3\n4,5\n")
    fails_clearly(capsys, [path], "ragged", "row 1 (line 2) has 2 cells")


def test_offsets_of_the_wrong_shape(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    offsets = write_csv(tmp_path / "o.csv", np.zeros((24, 4)))
    fails_clearly(capsys, [counts, "--offsets", offsets], "offsets must have the shape of counts (24, 5)", "(24, 4)")


def test_covariates_of_the_wrong_length(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    covariates = write_csv(tmp_path / "x.csv", RNG.normal(size=(23, 2)))
    fails_clearly(capsys, [counts, "--covariates", covariates], "one row per sample", "(24)", "23 rows")


def test_covariates_that_repeat_the_intercept(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    covariates = write_csv(tmp_path / "x.csv", np.ones((24, 1)))
    fails_clearly(capsys, [counts, "--covariates", covariates], "covariate column 0 holds 1 in every row",
                  "repeats the intercept column the command adds", "--no-intercept")


def test_missing_offsets_file(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    fails_clearly(capsys, [counts, "--offsets", tmp_path / "o.csv"], "offsets file not found")


def test_bad_maxiter(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    fails_clearly(capsys, [counts, "--maxiter", "0"], "--maxiter must be positive")


def test_npz_without_counts(tmp_path, capsys):
    path = tmp_path / "d.npz"
    np.savez(path, y=COUNTS)
    fails_clearly(capsys, [path], "no array named 'counts'", "['y']")


# ----------------------------------------------------------------------------- the fit

def in_process(data, maxiter):
    """The command's program, compiled in this process."""
    import jax

    args = (pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.float32(data.log_factorial)),
            np.float32(pln.TOL), np.float32(np.inf))
    return jax.jit(functools.partial(fitcmd.fit_program, maxiter=maxiter))(*args)


def test_the_command_fits_what_the_program_fits_in_process_and_from_its_cache(tmp_path):
    offsets = np.log(RNG.uniform(0.5, 2.0, size=COUNTS.shape))
    covariate = RNG.normal(size=(COUNTS.shape[0], 1))
    paths = [write_csv(tmp_path / "c.csv", COUNTS, header=[f"g{j}" for j in range(5)]),
             write_csv(tmp_path / "o.csv", offsets), write_csv(tmp_path / "x.csv", covariate)]
    data = pln.check_pln_data(COUNTS, fitcmd.read_matrix(paths[1], "offsets"),
                              np.hstack([np.ones((24, 1)), fitcmd.read_matrix(paths[2], "covariates")]))
    (m, s), elbos, crit = in_process(data, MAXITER)
    elbos = np.asarray(elbos)[: int(crit.count)]
    cache = tmp_path / "cache"
    for run, program in ((1, "compiled, saved to the cache"), (2, "loaded from the cache")):
        out = tmp_path / f"out{run}.npz"
        proc = run_command(paths[0], "--offsets", paths[1], "--covariates", paths[2], "--out", out,
                           "--cache", cache, "--maxiter", MAXITER, "--quiet")
        assert proc.returncode == 0, proc.stderr
        assert f"program {program}" in proc.stdout and "Traceback" not in proc.stderr
        got = np.load(out)
        # the same program (jit of fit_program) on the same float32 input, compiled by the same XLA with the
        # same flags in both processes, or loaded: the same bits
        np.testing.assert_array_equal(got["elbos"], elbos)
        np.testing.assert_array_equal(got["M"], np.asarray(m, np.float64))
        np.testing.assert_array_equal(got["S"], np.asarray(s, np.float64))
        assert got["B"].shape == (2, 5) and got["Sigma"].shape == (5, 5)
    files = sorted(f.name for f in cache.iterdir())
    assert files == sorted([fitcmd.cache_key(data.shape, MAXITER) + ".jaxexe", fitcmd.SECRET_NAME])  # no temporary left
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in cache.iterdir())  # readable by their owner only


def test_fit_matches_part_v_fit(tmp_path):
    from fastjax.pln import floor as F

    data = pln.check_pln_data(COUNTS)
    result = fitcmd.fit(data, maxiter=MAXITER, cache=None)
    jdata = pln.to_jax(data)
    _, elbos, crit = F.fit_fast(pln.start(jdata), jdata, np.float32(pln.TOL), np.float32(np.inf), maxiter=MAXITER)
    # the same fit; the start (M, S) is computed inside the program here and eagerly there, so the float32
    # rounding may differ in the last place: 1e-6 relative on the ELBO is ~8 float32 ulps
    np.testing.assert_allclose(result.elbos, np.asarray(elbos)[: int(crit.count)], rtol=1e-6)
    assert result.program == "compiled" and result.elbo == result.elbos[-1]


def test_a_cache_file_others_can_write_is_removed_and_compiled_again(tmp_path):
    data = pln.check_pln_data(COUNTS)
    first = fitcmd.fit(data, maxiter=MAXITER, cache=tmp_path)
    (path,) = tmp_path.glob("*.jaxexe")
    os.chmod(path, 0o666)
    with pytest.warns(UserWarning, match="has mode 666, not 600: removed, compiling again"):
        again = fitcmd.fit(data, maxiter=MAXITER, cache=tmp_path)
    assert first.program.startswith("compiled") and again.program == "compiled, saved to the cache"
    np.testing.assert_array_equal(first.elbos, again.elbos)
    assert path.stat().st_mode & 0o777 == 0o600  # the new one, written by this run


def test_zero_column_is_dropped_with_a_note(tmp_path):
    counts = COUNTS.copy()
    counts[:, 2] = 0
    path = write_csv(tmp_path / "c.csv", counts)
    proc = run_command(path, "--no-cache", "--maxiter", MAXITER, "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "note: counts: removed 1 column(s) holding only zeros: [2]" in proc.stderr and "Warning" not in proc.stderr
    assert "24 samples × 4 counts" in proc.stdout


def test_importing_the_command_imports_no_jax_flax_torch():
    """The command reads and checks the input before JAX: importing it loads none of the fit's modules."""
    heavy = ("jax", "optax", "flax", "torch", "pyPLNmodels", "fastjax.pln.rungs", "fastjax.pln.many")
    proc = subprocess.run([sys.executable, "-c", f"import sys, fastjax.pln.fit; print([m for m in {heavy!r} if m in sys.modules])"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- Part IV: --ranks and --bootstrap

@pytest.mark.parametrize("args, words", [
    (["--ranks", "0-3"], ["--ranks 0-3", "ranks start at 1", "got 0"]),
    (["--ranks", "5-2"], ["--ranks 5-2", "runs backwards", "write 2-5"]),
    (["--ranks", "two"], ["'two' is neither a rank", "such as 1-10"]),
    (["--ranks", "1-"], ["'1-' is neither a rank"]),
    (["--ranks", "2.5"], ["'2.5' is neither a rank"]),
    (["--ranks", ""], ["--ranks needs ranks"]),
    (["--ranks", "1-6"], ["rank 6 is above the number of count columns, 5"]),
    (["--bootstrap", "0"], ["--bootstrap must be at least 2", "got 0"]),
    (["--bootstrap", "-5"], ["--bootstrap must be at least 2", "got -5"]),
    (["--bootstrap", "2.5"], ["--bootstrap must be a whole number", "'2.5'"]),
    (["--bootstrap", "many"], ["--bootstrap must be a whole number", "'many'"]),
    (["--bootstrap", "99999999"], ["--bootstrap must be at most 10,000"]),
    (["--bootstrap", "4", "--seed", "-1"], ["--seed must be 0 or more"]),
    (["--seed", "1"], ["--seed is the seed of --bootstrap's samples"]),
    (["--ranks", "1-2", "--bootstrap", "4"], ["--ranks and --bootstrap are two different fits"]),
])
def test_bad_ranks_and_bootstrap_exit_2_naming_the_problem(tmp_path, capsys, args, words):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    err = fails_clearly(capsys, [counts, *args, "--no-cache"], *words)
    assert len(err.strip().splitlines()) == 1, err  # one line, before JAX


def test_a_rank_needs_more_samples_than_it_has_dimensions(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", RNG.poisson(3.0, size=(4, 6)))
    fails_clearly(capsys, [counts, "--ranks", "2-4", "--no-cache"], "rank 4 needs more samples", "n − 1 = 3")


def test_a_bootstrap_sample_that_loses_a_covariate_is_refused(tmp_path, capsys):
    counts = write_csv(tmp_path / "c.csv", COUNTS)
    rare = np.zeros((COUNTS.shape[0], 1))
    rare[3] = 1.0  # one sample of 24 has it: most resamples leave it out, and its coefficient undefined
    covariates = write_csv(tmp_path / "x.csv", rare)
    fails_clearly(capsys, [counts, "--covariates", covariates, "--bootstrap", "20", "--no-cache"],
                  "--bootstrap: sample", "covariates have rank 1, not 2", "drop or merge")


@pytest.mark.parametrize("mode", [["--ranks", "1-2"], ["--bootstrap", "3", "--seed", "5"], ["--ranks", "1-2", "--converge"]],
                         ids=["ranks", "bootstrap", "converge"])
def test_ranks_and_bootstrap_are_cached_like_the_fit(tmp_path, mode):
    """Each program is compiled once, saved signed, and loaded by the next process (where a serialized
    executable is run first, before anything was lowered: the LAPACK fill-in of load_executable), with the same
    bits as the compiled one; its file is its own, not the fit's."""
    offsets = write_csv(tmp_path / "o.csv", np.log(RNG.uniform(0.5, 2.0, size=COUNTS.shape)))
    covariates = write_csv(tmp_path / "x.csv", RNG.normal(size=(COUNTS.shape[0], 1)))
    counts, cache = write_csv(tmp_path / "c.csv", COUNTS), tmp_path / "cache"
    outs = []
    for run, program in ((1, "compiled, saved to the cache"), (2, "loaded from the cache")):
        out = tmp_path / f"out{run}.npz"
        proc = run_command(counts, "--offsets", offsets, "--covariates", covariates, *mode, "--cache", cache,
                           "--maxiter", MAXITER, "--quiet", "--out", out)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert f"program {program}" in proc.stdout
        if "--converge" in mode:  # its float64 program too
            assert f"convergence {program}" in proc.stdout
        outs.append(np.load(out))
    assert outs[0].files == outs[1].files
    for key in outs[0].files:
        np.testing.assert_array_equal(outs[0][key], outs[1][key])  # the program loaded is the one compiled
    files = sorted(f.name for f in cache.iterdir())
    assert len(files) == (3 if "--converge" in mode else 2) and fitcmd.SECRET_NAME in files
    assert fitcmd.cache_key((24, 5, 2), MAXITER) + ".jaxexe" not in files
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in cache.iterdir())


def test_the_first_elbo_checks_catch_a_program_that_computes_something_else():
    """A loaded collection or bootstrap program whose first ELBOs are not NumPy's is rejected: one that adds 1 to
    the counts, one that mixes up its members."""
    from fastjax.pln import collection as col

    data = pln.load_oaks_counts()
    members = fitcmd.prepare_ranks(data, [1, 2, 3])
    starts = [col.PcaParams(*(np.asarray(a)[i] for a in members.starts)) for i in range(3)]
    right = np.array([[col.pca_elbo(s, data, m, np)] for s, m in zip(starts, members.masks)])
    plus_one = np.array([[col.pca_elbo(s, data._replace(counts=data.counts + 1), m, np)] for s, m in zip(starts, members.masks)])
    fitcmd.check_first_pca_elbos(right.astype(np.float32), members.starts, members.masks, data)
    with pytest.raises(fitcmd.CacheRejected, match="at the start of rank 1"):
        fitcmd.check_first_pca_elbos(plus_one, members.starts, members.masks, data)
    boot = fitcmd.prepare_bootstrap(data, 3, seed=0)
    first = np.array([[pln.profiled_elbo(*pln.start(pln.PlnData(*(a[b] for a in boot.samples))),
                                         pln.PlnData(*(a[b] for a in boot.samples)), np)] for b in range(4)])
    fitcmd.check_first_bootstrap_elbos(first.astype(np.float32), boot.samples)
    with pytest.raises(fitcmd.CacheRejected, match=r"\(member 1\) gives the ELBO"):
        fitcmd.check_first_bootstrap_elbos(first[[0, 2, 1, 3]], boot.samples)


@pytest.fixture(scope="module")
def oaks_csv(tmp_path_factory):
    """The oaks counts (with a header of taxon names) and their log-offsets, written as CSV."""
    folder = tmp_path_factory.mktemp("oaks")
    data = pln.load_oaks_counts()
    counts = write_csv(folder / "counts.csv", data.counts.astype(int), header=[f"taxon{j}" for j in range(data.shape[1])])
    offsets = folder / "offsets.csv"
    np.savetxt(offsets, data.offsets, delimiter=",")
    return data, counts, offsets


def command_output(*args):
    """``main(args)`` in this process: (exit status, what it printed)."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = fitcmd.main([str(a) for a in args])
    return code, printed.getvalue()


@pytest.fixture(scope="module")
def oaks_ranks(oaks_csv, tmp_path_factory):
    """``--ranks 1-3`` on oaks, pyPLNmodels' defaults (400 iterations at most): what it printed and wrote."""
    data, counts, offsets = oaks_csv
    out = tmp_path_factory.mktemp("ranks") / "ranks.npz"
    code, text = command_output(counts, "--offsets", offsets, "--ranks", "1-3", "--no-cache", "--quiet", "--out", out)
    assert code == 0, text
    return text, np.load(out)


def test_ranks_on_oaks_print_the_table_they_write(oaks_ranks, oaks_csv):
    text, got = oaks_ranks
    lines = text.splitlines()
    assert "ranks 1-3 as one program" in lines[0]
    assert lines[1].split() == ["rank", "ELBO", "BIC", "ICL", "iterations", "stopped"]
    for i, line in enumerate(lines[2:5]):
        rank, elbo, bic, icl, iterations, *stopped = line.split()
        assert int(rank) == got["ranks"][i] == i + 1 and int(iterations) == got["iterations"][i]
        assert " ".join(stopped) == ("converged (tol)" if int(iterations) < 400 else "at --maxiter")
        assert (float(elbo), float(bic), float(icl)) == tuple(float(f"{got[k][i]:.8g}") for k in ("ELBO", "BIC", "ICL"))
    best = int(got["best_BIC"])
    assert best == got["ranks"][np.argmin(got["BIC"])] and int(got["best_ICL"]) == got["ranks"][np.argmin(got["ICL"])]
    assert f"rank chosen by BIC: {best}; by ICL: {int(got['best_ICL'])}" in text
    n, p = oaks_csv[0].counts.shape
    assert got["M"].shape == (n, best) and got["C"].shape == (p, best) and got["B"].shape == (1, p)
    np.testing.assert_array_equal(got["Sigma"], got["C"] @ got["C"].T)
    assert np.all(np.diff(got["ELBO"]) > 0)  # a larger rank fits better, at least on oaks


def test_ranks_on_oaks_choose_the_rank_pyplnmodels_chooses(oaks_ranks, oaks_csv):
    """pyPLNmodels' own collection of the same ranks (its own starts, each member from the one before) picks the
    same rank by BIC and by ICL as the command (and as chapters/many/01 asserts of its members)."""
    import contextlib
    import io

    pytest.importorskip("torch", reason="pyPLNmodels needs torch, which the newest leg does not install")
    from fastjax.pln import collection as col

    _, got = oaks_ranks
    theirs = col.pyplnmodels_collection(oaks_csv[0], [1, 2, 3])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        theirs.fit()
    assert theirs.best_model("BIC").rank == int(got["best_BIC"])
    assert theirs.best_model("ICL").rank == int(got["best_ICL"])


def test_bootstrap_on_oaks_gives_intervals_around_the_fit_of_all_rows(oaks_csv, tmp_path):
    from fastjax.pln import collection as col

    data, counts, offsets = oaks_csv
    out = tmp_path / "boot.npz"
    code, text = command_output(counts, "--offsets", offsets, "--bootstrap", 8, "--seed", 0, "--no-cache", "--quiet",
                                "--out", out)
    assert code == 0, text
    got = np.load(out)
    n, p = data.counts.shape
    assert got["coefs"].shape == (8, 1, p) and got["B"].shape == got["low"].shape == got["high"].shape == (1, p)
    np.testing.assert_array_equal(got["rows"], col.bootstrap_samples(data, 8, seed=0)[1])  # the rows of seed 0
    low, high = col.percentile_interval(got["coefs"], 0.95)
    np.testing.assert_array_equal(got["low"], low)
    np.testing.assert_array_equal(got["high"], high)
    inside = (got["B"] >= got["low"]) & (got["B"] <= got["high"])
    assert f"{int(inside.sum())} of {p} coefficients of the fit of all rows lie inside their interval" in text
    # not a rounding bound: with 8 refits the interval's ends lie near the smallest and largest refit, so the fit
    # of all rows falls outside for a few taxa (6 of 114 at seed 0, as chapters/many/02 finds); most lie inside
    assert inside.mean() >= 0.9, inside.mean()
    first = str(got["columns"][0])  # the input's name of its first column
    row = next(line for line in text.splitlines() if line.split()[:2] == ["intercept", first])
    assert row.split()[2:] == [f"{got[k][0, 0]:.5g}" for k in ("B", "low", "high")]


def test_help_lists_every_flag():
    # argparse formats each help text with %: a bare "%" in one made --help itself crash
    done = subprocess.run([sys.executable, "-m", "fastjax.pln.fit", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(flag in done.stdout for flag in ("--ranks", "--bootstrap", "--seed", "--offsets", "--out", "--cache"))


def test_the_fits_run_with_one_openblas_thread_on_narrow_tables_only():
    """``run.blas_threads``: one thread in SciPy's OpenBLAS (where jaxlib's LAPACK calls run) while a program
    for a table of at most ``ONE_BLAS_THREAD_UP_TO`` count columns runs, the threads as they were after; a
    wider table keeps OpenBLAS's own."""
    import threadpoolctl

    from fastjax.pln.fit import run as fitrun

    def scipy_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["internal_api"] == "openblas" and "scipy_openblas-" in i["filepath"].replace("\\", "/").split("/")[-1]]

    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS)

    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # as on a 2-core machine (a test runner may set 1)
        before = scipy_threads()
        assert before, threadpoolctl.threadpool_info()
        with fitrun.blas_threads(fitrun.ONE_BLAS_THREAD_UP_TO):
            assert scipy_threads() == [1] * len(before)
        assert scipy_threads() == before
        with fitrun.blas_threads(fitrun.ONE_BLAS_THREAD_UP_TO + 1):
            assert scipy_threads() == before
