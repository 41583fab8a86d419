"""Shared fixtures. One embedded Tansu broker serves the whole session; each test gets its own
run_id, so its topics are fresh and tests never see each other's messages.

Kafka imports stay inside the fixtures so unit tests that need no broker do not pay for them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from asyncrl.config import KafkaConfig, RunConfig


OPT_IN = {
    "cluster": "a simulated Ray cluster: opt in with `make test-cluster`",
    "heavy": "a heavy end-to-end case, covered in part by `make test`: opt in with `make test-heavy`",
}
"""Markers whose tests run only when ``-m`` names them, and why they are skipped otherwise."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cluster`` (a simulated multi-node Ray cluster: each node's agents take
    most of a minute to start on two cores) or ``heavy`` (an end-to-end case whose property
    a lighter test of ``make test`` also checks, in part) run only when ``-m`` names their
    marker (``make test-cluster``, ``make test-heavy``), so ``make test`` stays within its
    time (~25 min on two cores)."""
    markexpr = config.option.markexpr or ""
    for marker, reason in OPT_IN.items():
        if marker in markexpr:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap string of one EmbeddedBroker shared by the session (log kept in a tmp dir)."""
    from asyncrl.launch.broker import EmbeddedBroker

    b = EmbeddedBroker(log_path=tmp_path_factory.mktemp("broker") / "tansu.log")
    try:
        yield b.start()
    finally:
        b.stop()


@pytest.fixture
def make_run_cfg(broker: str, tmp_path: Path) -> Callable[..., RunConfig]:
    """Factory: ``make_run_cfg("kafka.max_message_bytes=4096", create_topics=True)``.

    Each call gets a unique run_id (``t<uuid8>``), the session broker and an output_dir under
    tmp_path; topics are created unless ``create_topics=False``. ``config``: a YAML path or a
    shipped config's name (default: the demo's).
    """
    from asyncrl.config import load_config
    from asyncrl.kafka.topics import create_run_topics
    from tests.helpers import on_session_broker

    def make(*overrides: str, create_topics: bool = True, config: str | None = None) -> RunConfig:
        cfg = load_config(
            config,
            overrides=[
                f"run_id=t{uuid.uuid4().hex[:8]}",
                *on_session_broker(broker),
                f"output_dir='{tmp_path / 'runs'}'",
                *overrides,
            ],
        )
        if create_topics:
            create_run_topics(cfg, broker)
        return cfg

    return make


@pytest.fixture
def run_cfg(make_run_cfg: Callable[..., RunConfig]) -> RunConfig:
    """Default config with a unique run_id, pointed at the session broker, topics created."""
    return make_run_cfg()


@pytest.fixture
def kafka_cfg(run_cfg: RunConfig) -> KafkaConfig:
    """The ``kafka`` section of ``run_cfg`` (bootstrap_servers set to the session broker)."""
    return run_cfg.kafka


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model cache for the session: each warm-start recipe is built once.

    ``ASYNCRL_TEST_POLICY_DIR`` names a folder kept across sessions instead, so running one
    file again does not rebuild the demo's warm start (~1.5 min) each time; entries are keyed
    by recipe and cache format (``asyncrl/models/cache.py``). Unset (CI): a fresh tmp dir.
    """
    kept = os.environ.get("ASYNCRL_TEST_POLICY_DIR")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path_factory.mktemp("policy")


@pytest.fixture(scope="session")
def quick_policy(policy_dir: Path) -> tuple[str, ...]:
    """Overrides for runs that test the protocol, not learning: a 100-step warm start (~5 s)
    and a sync after every step (the shipped configs sync every 4: a short run would see
    few syncs or none)."""
    return (
        f"actor_rollout_ref.model.cache_dir='{policy_dir}'",
        "actor_rollout_ref.model.warmup_steps=100",
        "async_training.trigger_parameter_sync_step=1",
    )


@pytest.fixture(scope="session")
def demo_policy(policy_dir: Path) -> tuple[str, ...]:
    """Overrides for runs that must learn: the demo's own warm start (~1 min, once)."""
    return (f"actor_rollout_ref.model.cache_dir='{policy_dir}'",)
