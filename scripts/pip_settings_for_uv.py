"""Print, one per line, the uv options that repeat pip's own settings on this machine.

setup-env.sh installs the environments with uv, which does not read pip's configuration files or its
PIP_* variables. Without these options uv would resolve against other indexes and constraints than pip:
on the CI machine, pip's machine-wide constraints and its wheel folder are what keep torch at the CPU
build on its disk instead of a CUDA build of several gigabytes. The first option makes uv choose among all indexes as pip does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPTIONS = {"constraint": "--constraint", "find-links": "--find-links",
           "index-url": "--index-url", "extra-index-url": "--extra-index-url"}


def pip_settings() -> dict[str, list[str]]:
    """pip's settings as `pip config list` shows them; a PIP_* variable wins over the files, as in pip."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            check=True).stdout
    from_files: dict[str, list[str]] = {}
    from_env: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rpartition(".")[2]
        if name in OPTIONS:
            (from_env if key.startswith(":env:") else from_files)[name] = value.strip("'\"").split()
    return from_files | from_env


def usable(value: str) -> bool:
    """pip only warns about a file:// index or folder that does not exist; uv stops, so leave it out."""
    if value.startswith("file://"):
        return Path(value.removeprefix("file://")).exists()
    return value.startswith(("http://", "https://")) or Path(value).exists()


if __name__ == "__main__":
    # uv's default (first-index) uses only the first index that has a package; unsafe-best-match picks
    # the best version across all, as pip does (https://docs.rs/uv-configuration/0.0.8/uv_configuration/enum.IndexStrategy.html)
    print("--index-strategy")
    print("unsafe-best-match")
    for name, values in pip_settings().items():
        for value in filter(usable, values):
            print(OPTIONS[name])
            print(value)
