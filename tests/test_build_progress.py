"""scripts/build_progress.py: one progress line per executed chapter, read from jupyter-book's output."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

LOG = (
    "\x1b[01mreading sources... \x1b[39;49;00m[ 10%] \x1b[35mchapters/cpu-bug\x1b[39;49;00m\n"
    f"{ROOT}/chapters/cpu-bug.md: Executing notebook using local CWD [mystnb]\n"
    f"{ROOT}/chapters/cpu-bug.md: Executed notebook in 30.00 seconds [mystnb]\n"
    "\rreading sources... [ 20%] chapters/index\r"
    f"{ROOT}/chapters/index.md: Executed notebook in 2.00 seconds [mystnb]\n"
)


def test_a_line_per_executed_chapter_with_the_time_left(tmp_path):
    env = {"FASTJAX_SIZE": "progress-test", "PATH": "/usr/bin:/bin"}
    record = ROOT / "_build" / "exec-times-progress-test.json"
    record.unlink(missing_ok=True)
    try:
        out = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_progress.py")], input=LOG,
                             capture_output=True, text=True, env=env, timeout=60, check=True).stdout
        lines = [ln for ln in out.splitlines() if ln.startswith("[")]
        n = len(__import__("fastjax.setup.colab").setup.colab.toc_files(ROOT))
        assert lines[0].startswith(f"[1/{n}] chapters/cpu-bug executed in 30 s; about ")
        assert lines[1].startswith(f"[2/{n}] chapters/index executed in 2 s; about ")
        assert "from the mean so far" in lines[1] and record.is_file()
        # a second build estimates from the first one's record
        again = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_progress.py")], input=LOG,
                               capture_output=True, text=True, env=env, timeout=60, check=True).stdout
        assert "from this machine's last build" in again
    finally:
        record.unlink(missing_ok=True)
