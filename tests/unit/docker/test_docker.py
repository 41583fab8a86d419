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


def test_local_compose_runs_the_same_services_as_the_registry_one():
    """docker/compose.local.yaml (no registry) runs each asyncrl service of docker/compose.yaml
    with the same command, only the broker's and the trainer's addresses moved to the host's
    loopback, and its broker is the asyncrl image's own (`asyncrl broker`)."""
    import yaml

    normal = yaml.safe_load((DOCKERFILE.parent / "compose.yaml").read_text())["services"]
    local = yaml.safe_load((DOCKERFILE.parent / "compose.local.yaml").read_text())["services"]
    assert set(local) == {"broker", "setup", "trainer", "rollout-0", "rollout-1", "monitor"}
    assert local["broker"]["command"][0] == "broker"
    broker = "127.0.0.1:${BROKER_PORT:-19092}"
    world = {
        "kafka:9092": broker,
        "sync.master_addr=trainer": "sync.master_addr=127.0.0.1",
        "sync.master_port=29500": "sync.master_port=${SYNC_PORT:-29500}",
    }
    for name in ("setup", "trainer", "rollout-0", "rollout-1", "monitor"):
        expected = []
        for arg in normal[name]["command"]:
            for there, here in world.items():
                arg = arg.replace(there, here)
            expected.append(arg)
        extra = [a for a in local[name]["command"] if a not in expected]
        assert [a for a in local[name]["command"] if a in expected] == expected, name
        assert extra in ([], ["trainer.save_freq=${SAVE_FREQ:-10}"]), (name, extra)
        assert local[name]["network_mode"] == "host", name
        assert local[name]["image"] == "${ASYNCRL_IMAGE:-asyncrl:local}", name
        assert local[name]["environment"]["OTEL_TRACES_EXPORTER"] == "file", name
    assert local["trainer"]["restart"] == normal["trainer"]["restart"] == "on-failure"
