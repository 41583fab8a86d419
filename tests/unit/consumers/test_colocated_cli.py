"""The colocated baseline's module, run as its docstring shows."""

import subprocess
import sys


def test_help_prints_the_usage_rather_than_a_config_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.consumers.colocated", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "python -m asyncrl.consumers.colocated --config calculator" in done.stdout
    assert "Traceback" not in done.stderr
