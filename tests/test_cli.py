"""The `bertkit` command's own conventions."""

from __future__ import annotations

import subprocess
import sys

import bertkit


def test_version_on_stdout_exit_0():
    r = subprocess.run([sys.executable, "-m", "bertkit", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"bertkit {bertkit.__version__}" and r.stderr == ""
