"""fastjax.pln.fit, safe on anything (issue 37): bad input exits 2 with a message that names the file, the
cell and what to do; nothing is lost when a write fails; the cache loads no file the command cannot prove
it wrote, and recovers from every attack here with one line and the same fit."""

from __future__ import annotations

import base64
import os
import pickle
import stat
import subprocess
import sys

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax import pln
from fastjax.pln import fit as fitcmd

COUNTS = np.random.default_rng(0).poisson(3.0, size=(24, 5))
MAXITER = 40  # a short fit: the plumbing, not convergence
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def write_csv(path, rows, header=None):
    lines = ([",".join(header)] if header else []) + [",".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def fails_clearly(capsys, args, *words, code=2):
    assert fitcmd.main([str(a) for a in args]) == code
    err = capsys.readouterr().err
    assert err.startswith(f"{fitcmd.PROG}: error: ") and "Traceback" not in err and "allow_pickle" not in err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture
def counts(tmp_path):
    return write_csv(tmp_path / "c.csv", COUNTS)


# ----------------------------------------------------------------------------- bad input: exit 2, a message

@pytest.mark.parametrize("tol", ["inf", "nan", "-1", "0", "1"])
def test_tol_outside_zero_one(counts, capsys, tol):
    fails_clearly(capsys, [counts, "--tol", tol], "--tol must be a number in (0, 1)", f"got {float(tol)!r}")


def test_maxiter_too_large(counts, capsys):
    fails_clearly(capsys, [counts, "--maxiter", "10000000"], "--maxiter must be at most 1,000,000")


@pytest.mark.parametrize("where, what", [(".", "is a folder"), ("/dev/null", "not a regular file (a device")])
def test_a_folder_or_a_device_as_the_counts(capsys, where, what):
    fails_clearly(capsys, [where], where, what)


def test_a_folder_or_a_device_as_offsets(counts, capsys):
    fails_clearly(capsys, [counts, "--offsets", "/dev/null"], "/dev/null: the offsets file is not a regular file")


def test_latin1_text_names_the_byte_line_and_encoding(tmp_path, capsys):
    path = tmp_path / "c.csv"
    path.write_bytes("espèce,b\n1,2\n3,4\n".encode("latin-1"))
    fails_clearly(capsys, [path], str(path), "not UTF-8: byte 0xe8 on line 1", "Windows-1252", "iconv")


def test_utf16_text(tmp_path, capsys):
    path = tmp_path / "c.csv"
    path.write_text("a,b\n1,2\n3,4\n", encoding="utf-16")
    fails_clearly(capsys, [path], "looks like UTF-16")


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("a,b\n1,2\n3,4\n", encoding="utf-8-sig")
    np.testing.assert_array_equal(fitcmd.read_matrix(path, "counts"), [[1, 2], [3, 4]])


@pytest.mark.parametrize("suffix", [".npz", ".npy"])
def test_a_bad_numpy_file_gets_no_allow_pickle_advice(tmp_path, capsys, suffix):
    path = tmp_path / f"junk{suffix}"
    path.write_bytes(b"PK\x03\x04 not really a zip " * 10)
    fails_clearly(capsys, [path], str(path), f"not a NumPy {suffix} file this command can read", "np.save")


def test_an_npz_of_python_objects_is_never_unpickled(tmp_path, capsys):
    path = tmp_path / "objects.npz"
    np.savez(path, counts=np.array([[1, "a"], [2, None]], dtype=object))
    fails_clearly(capsys, [path], "without unpickling")


def test_fifty_megabytes_of_junk_fail_at_its_second_line(tmp_path, capsys):
    path = tmp_path / "junk.csv"
    path.write_bytes(base64.encodebytes(os.urandom(37_500_000)))  # 50 MB of base64 lines, no separator
    fails_clearly(capsys, [path], "line 2 holds no numbers", "not a table of counts")


def test_count_errors_name_the_file_and_the_convention(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", [[1, 2], [-3, 4], [5, 6]], header=["a", "b"])
    fails_clearly(capsys, [path], str(path), "found -3.0 at row 1, column 0", "after any header row and row-name column")


def test_a_nan_covariate_is_numbered_in_the_users_columns(counts, tmp_path, capsys):
    x = np.random.default_rng(1).normal(size=(24, 2))
    x[2, 0] = np.nan
    covariates = write_csv(tmp_path / "x.csv", x)
    fails_clearly(capsys, [counts, "--covariates", covariates], str(covariates), "covariates must be finite",
                  "row 2, column 0")


def test_dependent_covariates_name_the_added_intercept(counts, tmp_path, capsys):
    x = np.random.default_rng(1).normal(size=(24, 1))
    covariates = write_csv(tmp_path / "x.csv", np.hstack([x, 2 * x]))
    fails_clearly(capsys, [counts, "--covariates", covariates], "after the intercept column the command adds", "rank is 2")


def test_a_text_covariate_is_refused(counts, tmp_path, capsys):
    path = tmp_path / "x.csv"
    path.write_text("site,temp\n" + "".join(f"{'AB'[i % 2]},{i * 0.1:.1f}\n" for i in range(24)))
    fails_clearly(capsys, [counts, "--covariates", path], "holds text ('A', ...)", "0/1 columns")


def test_covariate_rows_named_unlike_the_counts_are_refused(tmp_path, capsys):
    counts = tmp_path / "c.csv"
    counts.write_text("s,a,b\n" + "".join(f"s{i},{i % 3},{i % 4 + 1}\n" for i in range(6)))
    covariates = tmp_path / "x.csv"
    covariates.write_text("s,t\n" + "".join(f"s{5 - i},{i * 0.3:.1f}\n" for i in range(6)))
    fails_clearly(capsys, [counts, "--covariates", covariates], "row 0 of the covariates is named 's5'", "same order")


def test_raw_offsets_get_the_hint_to_take_logs(counts, tmp_path, capsys):
    offsets = write_csv(tmp_path / "o.csv", np.full(COUNTS.shape, 25_000))
    fails_clearly(capsys, [counts, "--offsets", offsets], "look like raw totals", "np.log")


def test_an_unnamed_index_column_is_refused(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", np.hstack([np.arange(24)[:, None], COUNTS]))
    fails_clearly(capsys, [path], "column 0 of the counts holds 0, 1, ..., 23 in order: an index column", "index=False")


def test_pandas_index_under_an_empty_header_cell_is_dropped_with_a_note(tmp_path, capsys):
    pandas = tmp_path / "pandas.csv"
    pandas.write_text(",a,b,c\n" + "".join(f"{i},{i % 3},{i % 4 + 1},{i % 5}\n" for i in range(6)))
    assert fitcmd.main([str(pandas), "--no-cache", "--maxiter", "3", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "note:" in captured.err and "read as row names" in captured.err and "6 samples × 3 counts" in captured.out


def test_a_numeric_header_is_refused(tmp_path, capsys):
    path = write_csv(tmp_path / "c.csv", COUNTS, header=[str(101 + j) for j in range(5)])
    fails_clearly(capsys, [path], "row 0 of the counts holds 101, 102, ..., 105", "g101")


@pytest.mark.parametrize("big", [2**24 + 1, "1e12"])
def test_counts_beyond_float32_are_refused(tmp_path, capsys, big):
    rows = COUNTS.astype(object)
    rows[3, 2] = big
    fails_clearly(capsys, [write_csv(tmp_path / "c.csv", rows)], "at row 3, column 2", "above 2**24 = 16,777,216")


def test_fewer_samples_than_covariates_plus_one(tmp_path, capsys):
    fails_clearly(capsys, [write_csv(tmp_path / "c.csv", [[1, 2, 3]])], "1 sample(s) for 1 covariate", "at least 2")


@pytest.mark.parametrize("name, what", [("res.csv", "ends in .npz (such as res.npz)"), ("folder.npz", "is a folder")])
def test_a_wrong_out_is_refused_before_the_fit(counts, tmp_path, capsys, name, what):
    (tmp_path / "folder.npz").mkdir()
    fails_clearly(capsys, [counts, "--out", tmp_path / name], what)
    assert not (tmp_path / "res.csv").exists() and not (tmp_path / "res.csv.npz").exists()


def test_an_elbo_of_zero_or_more_is_an_error():
    counts = COUNTS.astype(float)
    counts[3, 2] = 1e9  # read_data refuses it (above 2**24); fit() must not return what float32 makes of it
    with pytest.raises(FloatingPointError, match="impossible for counts"):
        fitcmd.fit(pln.check_pln_data(counts), cache=None)


# ----------------------------------------------------------------------------- nothing lost

def test_out_is_written_under_its_exact_name(counts, tmp_path):
    out = tmp_path / "res.npz"
    assert fitcmd.main([str(counts), "--no-cache", "--maxiter", str(MAXITER), "--quiet", "--out", str(out)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["c.csv", "res.npz"]  # no temporary left, no res.npz.npz
    assert np.load(out)["elbos"].shape == (MAXITER,)


def test_a_full_disk_loses_nothing(counts, tmp_path):
    """Files limited to 2,000 bytes (ulimit -f): the cache cannot be written (a warning, the fit goes on) and
    neither can --out (exit 1): the old result is as it was and no temporary file is left anywhere."""
    out, cache = tmp_path / "prev.npz", tmp_path / "cache"
    np.savez(out, old=np.arange(5000))
    before = out.read_bytes()
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000)); "
    proc = subprocess.run([sys.executable, "-c", limit + "import sys; from fastjax.pln.fit import main; sys.exit(main())",
                           str(counts), "--cache", str(cache), "--maxiter", str(MAXITER), "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "warning: the compiled fit could not be saved" in proc.stderr and "ELBO" in proc.stdout
    assert f"error: could not write {out}" in proc.stderr and "as it was before this run" in proc.stderr
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["c.csv", "cache", "prev.npz"]
    assert sorted(os.listdir(cache)) == [fitcmd.SECRET_NAME]


def test_a_cache_that_is_a_file_is_a_warning(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.warns(UserWarning, match="not used: .*compiling in memory"):
        result = fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=tmp_path / "file")
    assert result.program == "compiled"


# ----------------------------------------------------------------------------- cache attacks

@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The clean fit, and a cache folder that holds its program."""
    cache = tmp_path_factory.mktemp("clean") / "cache"
    result = fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=cache)
    assert result.program == "compiled, saved to the cache"
    return result, cache


def the_file(cache):
    return cache / (fitcmd.cache_key(pln.check_pln_data(COUNTS).shape, MAXITER) + ".jaxexe")


def copy_cache(clean, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for f in clean[1].iterdir():
        (cache / f.name).write_bytes(f.read_bytes())
        os.chmod(cache / f.name, 0o600)
    return cache


def refit(cache, match):
    with pytest.warns(UserWarning, match=match):
        return fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=cache)


def test_the_clean_cache_loads(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    again = fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=cache)
    assert again.program == "loaded from the cache"
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)


def test_a_planted_pickle_is_never_unpickled(clean, tmp_path):
    cache, marker = copy_cache(clean, tmp_path), tmp_path / "pwned"

    class Plant:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)  # runs `touch` when unpickled

    planted = pickle.dumps(Plant())
    the_file(cache).write_bytes(planted)
    os.chmod(the_file(cache), 0o600)
    again = refit(cache, "does not carry this cache's signature.*removed, compiling again")
    assert not marker.exists() and again.program == "compiled, saved to the cache"
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9, -1])
def test_a_flipped_byte_is_caught(clean, tmp_path, where):
    cache = copy_cache(clean, tmp_path)
    raw = bytearray(the_file(cache).read_bytes())
    raw[int(where * len(raw))] ^= 0x10
    the_file(cache).write_bytes(bytes(raw))
    again = refit(cache, "does not carry this cache's signature")
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)
    assert fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=cache).program == "loaded from the cache"


def test_a_program_for_another_shape_under_this_name(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    other = fitcmd.fit(pln.check_pln_data(COUNTS[:20]), maxiter=MAXITER, cache=cache)
    (cache / (fitcmd.cache_key((20, 5, 1), MAXITER) + ".jaxexe")).replace(the_file(cache))
    again = refit(cache, r"was compiled for another shape \(shape=\[20, 5, 1\]\)")
    assert other.program.startswith("compiled") and again.program == "compiled, saved to the cache"
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)


def test_a_signed_program_that_computes_something_else_gives_no_result(clean, tmp_path):
    """A file that passes every check but runs another function (as a damaged program that still loads
    would): its first ELBO differs from NumPy's, so it is removed and the fit compiled again."""
    import functools

    import jax

    cache = copy_cache(clean, tmp_path)
    data = pln.check_pln_data(COUNTS)
    args = (pln.PlnData(*(np.asarray(a, np.float32) for a in data[:3]), np.float32(data.log_factorial)),
            np.float32(pln.TOL), np.float32(np.inf))

    def wrong(d, tol, target):
        return fitcmd.fit_program(d._replace(counts=d.counts + 1), tol, target, maxiter=MAXITER)

    compiled = jax.jit(functools.partial(wrong)).trace(*args).lower().compile()
    fd = fitcmd.open_cache(cache)
    try:
        assert fitcmd.save_executable(compiled, fd, the_file(cache).name, fitcmd.cache_what(data.shape, MAXITER))
    finally:
        os.close(fd)
    again = refit(cache, "gives the ELBO .* at the start, where it is .*removed, compiling again")
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)


def test_a_symlinked_cache_folder_is_not_used(clean, tmp_path):
    real = copy_cache(clean, tmp_path)
    (tmp_path / "link").symlink_to(real)
    again = refit(tmp_path / "link", "link: .* \\(the cache folder must be a folder, not a symbolic link\\).*compiling in memory")
    assert again.program == "compiled"


def test_a_symlinked_cache_file_is_removed_not_followed(clean, tmp_path):
    cache, elsewhere = copy_cache(clean, tmp_path), tmp_path / "elsewhere.jaxexe"
    the_file(cache).replace(elsewhere)
    the_file(cache).symlink_to(elsewhere)
    again = refit(cache, "cannot be opened safely")
    assert elsewhere.is_file() and not the_file(cache).is_symlink() and again.program == "compiled, saved to the cache"


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_parent_others_can_write_makes_the_cache_unused(clean, tmp_path, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    again = refit(shared / "fits", f"shared can be written by others \\(mode {mode:o}\\)")
    assert again.program == "compiled" and not (shared / "fits").exists()


def test_a_cache_folder_others_can_write_is_not_used(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    os.chmod(cache, 0o757)
    again = refit(cache, "can be written by others")
    assert again.program == "compiled"


def test_a_secret_others_can_read_is_replaced(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    os.chmod(cache / fitcmd.SECRET_NAME, 0o644)
    with pytest.warns(UserWarning) as caught:
        again = fitcmd.fit(pln.check_pln_data(COUNTS), maxiter=MAXITER, cache=cache)
    said = " | ".join(str(w.message) for w in caught)
    assert "secret.key has mode 644, not 600: replaced by a new one" in said and "signature" in said
    assert again.program == "compiled, saved to the cache"


@pytest.mark.skipif(not IS_ROOT, reason="making a file or folder of another user's needs root")
def test_files_and_folders_of_another_user(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    os.chown(the_file(cache), 12345, -1)
    assert refit(cache, "belongs to user id 12345, not to you").program == "compiled, saved to the cache"
    os.chown(cache, 12345, -1)
    assert refit(cache, "cache belongs to user id 12345").program == "compiled"


def test_the_key_covers_optax_and_the_environment(monkeypatch):
    base = fitcmd.cache_key((24, 5, 1), MAXITER)
    assert {"jax", "jaxlib", "optax"} <= set(fitcmd.cache_what((24, 5, 1), MAXITER)["versions"])
    monkeypatch.setenv("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    assert fitcmd.cache_key((24, 5, 1), MAXITER) != base


def test_no_temporary_is_left_in_the_cache(clean):
    assert not [f for f in os.listdir(clean[1]) if f.endswith(".tmp")]
    assert all(stat.S_IMODE((clean[1] / f).stat().st_mode) == 0o600 for f in os.listdir(clean[1]))


def test_a_loaded_program_that_fails_to_run_is_removed(clean, tmp_path, monkeypatch):
    cache = copy_cache(clean, tmp_path)

    def broken(*args):
        raise TypeError("argument 0 has another shape")

    monkeypatch.setattr(fitcmd.cache, "load_executable", lambda *args: broken)
    again = refit(cache, "does not run \\(TypeError: argument 0 has another shape\\): removed, compiling again")
    assert again.program == "compiled, saved to the cache" and the_file(cache).is_file()
    np.testing.assert_array_equal(again.elbos, clean[0].elbos)
