"""The image's build file stays lint-clean (hadolint, a dev dependency)."""

import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).parents[3] / "docker" / "Dockerfile"


def test_dockerfile_is_lint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_copies_every_package_folder():
    """A package folder added to pyproject but not copied would break the image's install."""
    import re

    pyproject = (DOCKERFILE.parents[1] / "pyproject.toml").read_text()
    package_dir = next(line for line in pyproject.splitlines() if line.startswith("package-dir"))
    folders = set(re.findall(r'= "(\w+)"', package_dir))
    assert "producers" in folders and "asyncrl" in folders
    text = DOCKERFILE.read_text()
    assert all(f"COPY {folder}/ {folder}/" in text for folder in folders), folders
