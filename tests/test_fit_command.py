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
