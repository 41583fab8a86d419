"""A non-editable install (what the Docker image and `pip install asyncrl` get) works: every
subpackage and shipped file is in the wheel, and nothing looks for the source tree."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
from asyncrl.config import DEFAULT_CONFIG, load_config
from asyncrl.producers.tools.registry import load_tools, shipped_tools_path
import asyncrl.consumers.trainer, asyncrl.producers.worker, asyncrl.sync.sender
assert load_config().run_id == "demo" and load_config("calculator").data.task == "calculator"
assert list(load_tools(shipped_tools_path())) == ["calculator"]
print(DEFAULT_CONFIG)
"""


def test_the_wheel_installs_and_runs_outside_the_source_tree(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("asyncrl-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"  # no asyncrl/ folder in the working directory
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=elsewhere,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith(str(site))  # the installed config, not the source's
