"""The generated rung modules (fastjax/pln/rungs.py, floor.py; fastjax/resnet/rungs.py, floor.py) are exactly what the chapters' ``#| export`` cells hold."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def test_rung_modules_are_up_to_date():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "export_rungs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
