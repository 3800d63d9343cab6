"""fastjax.pln.fit on real tables as a hostile user meets them: each case either refused with exit 2 and one
line naming the real problem, or handled right (nothing of the user's overwritten, no permission widened,
no temporary left by a killed run surviving the next, Ctrl-C within a second, memory checked before the
program runs, the input's column names kept, refits with an all-zero column stated)."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout

import fastjax  # noqa: F401
import numpy as np
import pytest

from fastjax.pln import fit as fitcmd

RNG = np.random.default_rng(7)
COUNTS = RNG.poisson(3.0, size=(12, 4))
MAXITER = 5  # the tests check the plumbing, not convergence


def run(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = fitcmd.main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def refused(argv, *words) -> str:
    code, out, err = run(argv)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"{fitcmd.PROG}: error: ") and "Traceback" not in err, err
    for word in words:
        assert word in lines[-1], lines[-1]
    return lines[-1]


def csv_text(rows, header=None, names=None, sep=","):
    lines = [sep.join(header)] if header is not None else []
    for i, row in enumerate(rows):
        lines.append(sep.join(([names[i]] if names is not None else []) + [str(v) for v in row]))
    return "\n".join(lines) + "\n"


def write(path, text):
    path.write_text(text)
    return path


# ----------------------------------------------------------------------------- --out

def test_out_naming_an_input_is_refused_and_the_input_kept(tmp_path):
    data = tmp_path / "d.npz"
    np.savez(data, counts=COUNTS)
    before = data.read_bytes()
    refused([data, "--out", data, "--no-cache"], "is the counts file", "would replace your data")
    assert data.read_bytes() == before
    offsets = tmp_path / "o.npz"
    np.savez(offsets, o=np.zeros(3))
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    os.link(counts, tmp_path / "hard.npz")  # another name of the same file
    refused([counts, "--out", tmp_path / "hard.npz", "--no-cache"], "is the counts file")


def test_out_that_is_a_symbolic_link_is_refused(tmp_path):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    target = tmp_path / "target.npz"
    target.write_bytes(b"mine")
    (tmp_path / "link.npz").symlink_to(target)
    refused([counts, "--out", tmp_path / "link.npz", "--no-cache"], "is a symbolic link (to", "the file itself")
    assert target.read_bytes() == b"mine" and (tmp_path / "link.npz").is_symlink()


def test_out_keeps_the_mode_of_an_existing_file_and_removes_dead_runs_temporaries(tmp_path):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    out = tmp_path / "r.npz"
    out.write_bytes(b"old")
    out.chmod(0o600)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".r.npz.{int(dead.stdout)}-0123456789ab.tmp"  # a run killed while writing
    stale.write_bytes(b"half")
    alive = tmp_path / f".r.npz.{os.getpid()}-0123456789ab.tmp"  # one still being written: left alone
    alive.write_bytes(b"writing")
    other = tmp_path / ".r.npz.notours.tmp"
    other.write_bytes(b"someone else's")
    code, _, err = run([counts, "--out", out, "--no-cache", "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not stale.exists() and alive.exists() and other.exists()
    with np.load(out) as f:
        assert f["B"].shape == (1, 4)


def test_cache_temporaries_of_a_killed_run_go_on_the_next_run(tmp_path):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    cache = tmp_path / "cache"
    code, _, err = run([counts, "--cache", cache, "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = cache / f".x.jaxexe.{int(dead.stdout)}-0123456789ab.tmp"
    stale.write_bytes(b"half a program")
    stale.chmod(0o600)
    code, _, err = run([counts, "--cache", cache, "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    assert not stale.exists()


def test_sigkill_during_out_leaves_nothing_after_the_next_run(tmp_path):
    """A real SIGKILL while --out is written: its temporary (if any) is gone after the next run."""
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    out = tmp_path / "r.npz"
    slow = ("import numpy as np, time, sys; from fastjax.pln.fit import output\n"
            "real = np.savez\n"
            "def savez(f, **a): real(f, **a); f.flush(); print('written', flush=True); time.sleep(60)\n"
            "output.np.savez = savez\n"
            "from fastjax.pln.fit.cli import run; sys.argv = ['x'] + sys.argv[1:]; run()\n")
    proc = subprocess.Popen([sys.executable, "-c", slow, str(counts), "--out", str(out), "--no-cache", "--maxiter",
                             str(MAXITER), "--quiet"], stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while not lines or lines[-1] not in ("written\n", ""):
            lines.append(proc.stdout.readline())
        assert lines[-1] == "written\n", lines
    finally:
        proc.kill()
        proc.wait()
    assert [p.name for p in tmp_path.glob(".r.npz.*.tmp")], "the killed run left no temporary to clean"
    code, _, err = run([counts, "--out", out, "--no-cache", "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    assert not list(tmp_path.glob(".r.npz.*.tmp"))


# ----------------------------------------------------------------------------- Ctrl-C and memory

def test_ctrl_c_stops_within_a_second_with_one_line_and_130(tmp_path):
    counts = write(tmp_path / "c.csv", csv_text(RNG.poisson(3.0, size=(60, 30))))
    proc = subprocess.Popen([sys.executable, "-m", "fastjax.pln.fit", str(counts), "--bootstrap", "400", "--no-cache",
                             "--quiet", "--maxiter", "20000", "--tol", "1e-12"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)  # compiling or fitting: a long call into XLA either way
    assert proc.poll() is None, proc.communicate()
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [f"{fitcmd.PROG}: error: interrupted (Ctrl-C); nothing was written"], err
    assert seconds < 1.0, seconds


def test_a_pipe_closed_early_ends_it_quietly(tmp_path):
    """``fastjax-fit counts.csv | head -1``: the reader closed the pipe; no BrokenPipeError traceback."""
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    read, write_end = os.pipe()
    os.close(read)  # nobody reads: the command's first print meets a closed pipe
    try:
        done = subprocess.run([sys.executable, "-m", "fastjax.pln.fit", str(counts), "--no-cache", "--maxiter", str(MAXITER)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_a_program_larger_than_free_memory_is_refused_before_it_runs(tmp_path, monkeypatch):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    need = []
    real = fitcmd.run.program_bytes
    monkeypatch.setattr(fitcmd.run, "program_bytes", lambda compiled: need.append(real(compiled)) or need[-1])
    monkeypatch.setattr(fitcmd.run, "available_memory", lambda: 1000)
    ran = []
    monkeypatch.setattr(fitcmd.run, "interruptible", lambda call, real=fitcmd.run.interruptible: ran.append(1) or real(call))
    line = refused([counts, "--bootstrap", 50, "--no-cache", "--maxiter", MAXITER, "--quiet"],
                   "the bootstrap needs", "GB of memory at once", "0.00 GB free", "give fewer refits")
    assert need and need[0] > 1000 and len(ran) == 1, (need, ran, line)  # compiled, never run


def test_program_bytes_grow_with_the_refits():
    """XLA's own plan of the bootstrap's memory, per refit: what --bootstrap's check compares with."""
    import jax

    sizes = {}
    for b in (4, 16):
        boot = fitcmd.prepare_bootstrap(fastjax_pln_data(), b)
        args = (fitcmd.run._float32(boot.samples), np.float32(1e-6), np.float32(np.inf))
        compiled = jax.jit(lambda s, t, g: fitcmd.bootstrap_program(s, t, g, maxiter=MAXITER)).trace(*args).lower().compile()
        sizes[b] = fitcmd.run.program_bytes(compiled)
    assert sizes[16] > sizes[4] > 0


def fastjax_pln_data():
    from fastjax import pln

    return pln.check_pln_data(COUNTS)


# ----------------------------------------------------------------------------- the tables

def test_integer_otu_ids_as_header_are_refused(tmp_path):
    ids = ["1045", "109", "1093", "2000"]
    path = write(tmp_path / "c.csv", csv_text(COUNTS, header=ids))
    refused([path, "--no-cache"], "row 0 (line 1) holds 1045, 109, 1093", "a header of numeric names", "otu1045")
    path = write(tmp_path / "s.csv", csv_text(COUNTS, header=["sample", "2771001", "991659", "30", "41"],
                                              names=[f"s{i}" for i in range(12)]))
    refused([path, "--no-cache"], "holds 2771001, 991659, 30", "a header of numeric names")


@pytest.mark.parametrize("word", ["sample", "SampleID", "id", "#SampleID"])
def test_a_numeric_id_column_under_an_id_name_is_read_as_row_names(tmp_path, word):
    word = word if word.lower() in fitcmd.tables.ID_WORDS else "sample"
    path = write(tmp_path / "c.csv", csv_text(COUNTS, header=[word, "g0", "g1", "g2", "g3"],
                                              names=[str(1001 + 3 * i) for i in range(12)]))
    code, out, err = run([path, "--no-cache", "--maxiter", MAXITER, "--json"])
    assert code == 0, err
    assert json.loads(out)["p"] == 4 and json.loads(out)["columns"] == ["g0", "g1", "g2", "g3"]
    assert f"the first column is named {word!r}: read as the samples' names" in err
    covariates = write(tmp_path / "x.csv", csv_text(RNG.normal(size=(12, 1)).round(3), header=[word, "x"],
                                                    names=[str(1001 + 3 * i) for i in range(12)]))
    code, out, err = run([path, "--covariates", covariates, "--no-cache", "--maxiter", MAXITER, "--json"])
    assert code == 0, err


def test_a_rising_id_column_under_another_name_is_refused(tmp_path):
    path = write(tmp_path / "c.csv", csv_text(COUNTS, header=["code", "g0", "g1", "g2", "g3"],
                                              names=[str(1001 + 7 * i) for i in range(12)]))
    refused([path, "--no-cache"], "column 0 of the counts holds 1001, 1008, ..., 1078 in order",
            "an index column (sample IDs)")


def test_dropped_columns_keep_names_and_order_in_output_and_npz(tmp_path):
    counts = COUNTS.copy()
    counts[:, 1] = 0
    path = write(tmp_path / "c.csv", csv_text(counts, header=["a", "b", "c", "d"]))
    out = tmp_path / "r.npz"
    code, stdout, err = run([path, "--bootstrap", 4, "--no-cache", "--maxiter", MAXITER, "--out", out])
    assert code == 0, err
    assert "but b (only zeros), in the input's order" in err
    rows = [line.split() for line in stdout.splitlines() if line.startswith("intercept")]
    assert [r[1] for r in rows] == ["a", "c", "d"]
    with np.load(out) as f:
        assert f["columns"].tolist() == ["a", "c", "d"] and f["dropped"].tolist() == ["b"]


def test_a_refit_with_an_all_zero_column_has_an_unbounded_interval(tmp_path):
    counts = RNG.poisson(4.0, size=(20, 3))
    counts[:, 2] = 0
    counts[0, 2] = 5  # a rare taxon: one sample holds it, so many refits never draw it
    path = write(tmp_path / "c.csv", csv_text(counts, header=["a", "b", "rare"]))
    out = tmp_path / "r.npz"
    code, stdout, err = run([path, "--bootstrap", 20, "--no-cache", "--maxiter", MAXITER, "--out", out])
    assert code == 0, err
    rare = [line.split() for line in stdout.splitlines() if line.startswith("intercept") and " rare " in line][0]
    assert rare[3:] == ["-inf", "inf"], rare
    assert "column rare holds only zeros in" in stdout and "unbounded (-inf, inf)" in stdout
    with np.load(out) as f:
        empty = f["empty"]
        assert empty[:, 2].any() and not empty[:, :2].any()
        assert np.isnan(f["coefs"][empty[:, 2], :, 2]).all() and np.isfinite(f["coefs"][~empty[:, 2], :, 2]).all()


def test_a_csv_still_being_written_is_refused(tmp_path):
    path = tmp_path / "c.csv"
    text = csv_text(RNG.poisson(3.0, size=(200, 20)))
    path.write_text(text[: len(text) // 2 - 1].rstrip("\n"))  # ends mid-line, as a writer leaves it

    def finish():
        time.sleep(0.1)
        with open(path, "a") as f:
            f.write(text[len(text) // 2 - 1:])

    writer = threading.Thread(target=finish)
    writer.start()
    try:
        refused([path, "--no-cache"], "changed while it was read", "still being written")
    finally:
        writer.join()


@pytest.mark.parametrize("name, text, words", [
    ("na.csv", "s,NA,g1,g2\n" + "".join(f"s{i},1,{i % 3},2\n" for i in range(10)), None),
    ("trail.csv", "g0,g1,g2,\n" + "1,2,3\n" * 10, ["ends with an empty name", "delete the last ','"]),
    ("semi.csv", "g0;g1\n1;2\n3;1,5\n", ["'1,5', not a number", "a decimal comma: write 1.5"]),
    ("pandas.csv", ",1,2,3\n" + "".join(f"s{i},1,{i % 3},2\n" for i in range(10)), None),
])
def test_messages_name_the_real_problem(tmp_path, name, text, words):
    path = write(tmp_path / name, text)
    if words is None:
        code, out, err = run([path, "--no-cache", "--maxiter", MAXITER, "--json"])
        assert code == 0, err
        assert json.loads(out)["p"] == 3
    else:
        refused([path, "--no-cache"], *words)


def test_gzip_and_offsets_advice(tmp_path):
    path = tmp_path / "c.csv"
    with gzip.open(path, "wt") as f:
        f.write(csv_text(COUNTS))
    refused([path], "is gzip-compressed, not a text table", "gunzip")
    counts = write(tmp_path / "c2.csv", csv_text(COUNTS))
    offsets = write(tmp_path / "o.csv", csv_text(np.zeros((12, 4)), names=[f"s{i}" for i in range(12)]))
    line = refused([counts, "--offsets", offsets], "offsets must be numbers (log-offsets")
    assert "category" not in line


@pytest.mark.parametrize("argv, words", [
    (["--seed", "7" * 5000, "--bootstrap", "10"], ["--seed must have at most 40 digits", "(5,000 characters)"]),
    (["--ranks", ",".join(["1-3"] * 3000)], ["too long a list"]),
    (["--bootstrap", "x" * 5000], ["--bootstrap must be a whole number", "characters)"]),
])
def test_long_arguments_are_refused_at_once_and_not_echoed(tmp_path, argv, words):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    t0 = time.perf_counter()
    line = refused([counts, *argv], *words)
    assert time.perf_counter() - t0 < 1.0 and len(line) < 300, line


def test_cache_home_that_is_a_file_or_relative(tmp_path, monkeypatch):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(afile))
    code, _, err = run([counts, "--maxiter", MAXITER, "--quiet"])
    assert code == 0 and f"{afile} is not a folder" in err, err
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert fitcmd.cache_folder().is_absolute()


# ----------------------------------------------------------------------------- converged, per member

def test_converged_per_member_in_json_and_text(tmp_path):
    path = write(tmp_path / "c.csv", csv_text(COUNTS))
    code, out, err = run([path, "--ranks", "1-2", "--no-cache", "--maxiter", MAXITER, "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert got["converged"] == [False, False] and got["n"] == 12 and got["p"] == 4
    code, out, err = run([path, "--ranks", "1-2", "--no-cache", "--maxiter", MAXITER])
    assert code == 0, err
    assert sum(line.endswith("at --maxiter") for line in out.splitlines()) == 2
    assert "2 of 2 members stopped at --maxiter 5, not by the tolerance" in out
    if "rank chosen by BIC: 2" in out or "by ICL: 2" in out:
        assert "the rank chosen is the largest tried" in out and "try larger ranks" in out
    code, out, err = run([path, "--no-cache", "--maxiter", 10_000, "--tol", "0.01", "--json"])
    assert code == 0, err
    assert json.loads(out)["converged"] == [True]


# ----------------------------------------------------------------------------- families of tables (Hypothesis)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


@st.composite
def tables(draw):
    """A table of counts (n × p, counts below 50) in one of the ways real tables name their columns and
    samples: names, numeric IDs as the header (refused), numeric sample IDs under an ID word (row names),
    a pandas index under numbered columns (row names); with ',', ';' or a tab."""
    n, p = draw(st.integers(4, 12)), draw(st.integers(3, 6))
    counts = draw(st.lists(st.lists(st.integers(0, 49), min_size=p, max_size=p), min_size=n, max_size=n))
    counts = np.array(counts)
    counts[0, :] += 1  # no column of zeros: they are dropped, tested above
    kind = draw(st.sampled_from(["names", "numeric_ids", "id_column", "pandas_numbered"]))
    sep = draw(st.sampled_from([",", ";", "\t"]))
    ids = draw(st.lists(st.integers(100, 10**7), min_size=p, max_size=p, unique=True))
    word = draw(st.sampled_from(sorted(fitcmd.tables.ID_WORDS)))
    sample_ids = draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n, unique=True))
    if kind == "names":
        text = csv_text(counts, header=[f"g{j}" for j in range(p)], sep=sep)
    elif kind == "numeric_ids":
        text = csv_text(counts, header=[str(v) for v in ids], sep=sep)
    elif kind == "id_column":
        text = csv_text(counts, header=[word] + [f"g{j}" for j in range(p)], names=[str(v) for v in sample_ids], sep=sep)
    else:
        text = csv_text(counts, header=[""] + [str(j) for j in range(p)], names=[f"s{i}" for i in range(n)], sep=sep)
    return kind, text, counts


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tables())
def test_numeric_headers_id_columns_and_separators(tmp_path, case):
    kind, text, counts = case
    # a first column of counts that rises strictly over 8 rows or more is read as sample IDs (by design)
    hypothesis.assume(not (len(counts) >= fitcmd.tables.ID_ROWS and np.all(np.diff(counts[:, 0]) > 0)))
    path = tmp_path / "c.csv"
    path.write_text(text)
    os.utime(path, (time.time() - 10, time.time() - 10))  # written a while ago: not "still being written"
    if kind == "numeric_ids":
        with pytest.raises(ValueError, match="a header of numeric names"):
            fitcmd.tables.read_input(path)
        return
    got = fitcmd.tables.read_input(path)
    np.testing.assert_array_equal(got.data.counts, counts)
    assert len(got.columns) == counts.shape[1] and got.dropped == []


def test_a_folder_in_place_of_the_secret_or_a_program_blames_the_right_file(tmp_path):
    counts = write(tmp_path / "c.csv", csv_text(COUNTS))
    cache = tmp_path / "cache"
    code, _, err = run([counts, "--cache", cache, "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    (program,) = cache.glob("*.jaxexe")
    (cache / fitcmd.SECRET_NAME).unlink()
    (cache / fitcmd.SECRET_NAME).mkdir()
    code, _, err = run([counts, "--cache", cache, "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    assert f"its {fitcmd.SECRET_NAME} is not a regular file and cannot be replaced: remove it" in err, err
    assert program.exists() and "removed" not in err  # the valid program is not blamed
    (cache / fitcmd.SECRET_NAME).rmdir()
    program.unlink()
    program.mkdir()
    code, _, err = run([counts, "--cache", cache, "--maxiter", MAXITER, "--quiet"])
    assert code == 0, err
    assert f"{program} is not a regular file: could not be removed (remove it by hand)" in err, err
