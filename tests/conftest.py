"""Shared fixtures. One embedded Tansu broker serves the whole session; each test gets its own
run_id, so its topics are fresh and tests never see each other's messages.

Kafka imports stay inside the fixtures so unit tests that need no broker do not pay for them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
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


PREBUILT: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "demo_policy": (None, ()),
    "countdown_policy": ("countdown", ("actor_rollout_ref.model.warmup_steps=60",)),
}
"""Warm starts built in the background from the session's start, in this order, when a test
that will run asks for them (by fixture name): a config, and overrides beyond the cache."""

BUILD_TIMEOUT_S = 900.0
"""How long a test waits for a warm start built in the background (the demo's: ~1.5 min idle)."""

BUILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from asyncrl.config import load_config
    from asyncrl.models.warm_start import load_policy

    where = Path(sys.argv[1])
    for name, config, overrides in json.loads(sys.argv[2]):
        cache = f"actor_rollout_ref.model.cache_dir='{where}'"
        load_policy(load_config(config, overrides=[cache, *overrides]))
        (where / f".built-{name}").touch()
        print("built", name, flush=True)
    """
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Choose the session's model cache and start building, in a process of its own, the warm
    starts of ``PREBUILT`` that a test to run asks for. A build runs on one thread (the same
    weights on every machine) while the suite keeps about one of two cores busy, so it
    overlaps the tests before the first one that needs it instead of stopping the suite."""
    config = session.config
    kept = os.environ.get("ASYNCRL_TEST_POLICY_DIR")
    if kept:
        where = Path(kept)
        where.mkdir(parents=True, exist_ok=True)
    else:
        where = config._tmp_path_factory.mktemp("policy")  # type: ignore[attr-defined]
    config.stash[_POLICY_DIR] = where
    asked = {
        name
        for item in session.items
        if item.get_closest_marker("skip") is None
        for name in getattr(item, "fixturenames", ())
    }
    wanted = [[name, *PREBUILT[name]] for name in PREBUILT if name in asked]
    if wanted and not config.option.collectonly:
        for name, *_ in wanted:
            (where / f".built-{name}").unlink(missing_ok=True)
        config.stash[_BUILDER] = _start_builder(where, wanted)


def _start_builder(where: Path, wanted: list) -> tuple[subprocess.Popen, Path]:
    """The builder, niced so that the test beside it keeps its timing; it dies with the
    session (asyncrl.launch.process.die_with_parent)."""
    from asyncrl.launch.process import child_env, die_with_parent

    log = where.parent / "warm-starts.log"
    dies = die_with_parent()

    def lowered() -> None:
        os.nice(10)
        dies()

    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(where), json.dumps(wanted)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=child_env(),
            preexec_fn=lowered,
        )
    return proc, log


def _prebuilt(config: pytest.Config, name: str) -> tuple[str, ...]:
    """The overrides of ``PREBUILT[name]``, once the builder has built it."""
    where = config.stash[_POLICY_DIR]
    builder = config.stash.get(_BUILDER, None)
    if builder is not None:
        proc, log = builder
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        while not (where / f".built-{name}").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the {name} warm start was not built: {log.read_text()[-3000:]}")
            time.sleep(0.2)
    return (f"actor_rollout_ref.model.cache_dir='{where}'", *PREBUILT[name][1])


_POLICY_DIR = pytest.StashKey[Path]()
_BUILDER = pytest.StashKey[tuple[subprocess.Popen, Path]]()


@pytest.fixture(scope="session")
def policy_dir(pytestconfig: pytest.Config) -> Path:
    """One model cache for the session: each warm-start recipe is built once.

    ``ASYNCRL_TEST_POLICY_DIR`` names a folder kept across sessions instead, so running one
    file again does not rebuild the demo's warm start (~1.5 min) each time; entries are keyed
    by recipe and cache format (``asyncrl/models/cache.py``). Unset (CI): a fresh tmp dir.
    """
    return pytestconfig.stash[_POLICY_DIR]


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
def demo_policy(pytestconfig: pytest.Config) -> tuple[str, ...]:
    """Overrides for runs that must learn: the demo's own warm start (built in the background
    from the session's start; the first test to ask waits for it)."""
    return _prebuilt(pytestconfig, "demo_policy")


@pytest.fixture(scope="session")
def countdown_policy(pytestconfig: pytest.Config) -> tuple[str, ...]:
    """Overrides for the countdown task's runs: a 60-step warm start that already writes long
    chains (built in the background)."""
    return _prebuilt(pytestconfig, "countdown_policy")
