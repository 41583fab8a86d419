"""Where a run writes, and the host its weight collective meets on, are checked at start-up:
``asyncrl run --dry-run`` said ``ok`` for each of these, and the real run then failed in a
traceback (an ``output_dir`` that is a file, one that cannot be made; a model cache that
cannot be made, after a warm start) or retried for good with nothing on the console (a
``sync.master_addr`` that does not resolve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.preflight import check_startable, startup_checks


def _failed(*overrides: str) -> dict[str, str]:
    cfg = load_config(overrides=list(overrides))
    return {c.key: c.detail for c in startup_checks(cfg, "run") if c.ok is False}


def test_an_output_dir_that_is_a_file_fails_naming_the_key(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    failed = _failed(f"output_dir={afile}")
    assert list(failed) == ["output_dir"]
    assert "is a file, not a directory" in failed["output_dir"]
    with pytest.raises(ConfigError, match="output_dir"):
        check_startable(load_config(overrides=[f"output_dir={afile / 'deeper'}"]), "run")


def test_a_directory_that_cannot_be_made_fails_naming_the_key(tmp_path: Path) -> None:
    failed = _failed("output_dir=/proc/asyncrl-x", "actor_rollout_ref.model.cache_dir=/proc/y")
    assert set(failed) == {"output_dir", "actor_rollout_ref.model.cache_dir"}
    assert all("cannot create a directory in /proc" in d for d in failed.values())


def test_writable_places_pass_and_the_probe_leaves_nothing(tmp_path: Path) -> None:
    failed = _failed(
        f"output_dir={tmp_path / 'runs'}", f"actor_rollout_ref.model.cache_dir={tmp_path / 'c'}"
    )
    assert not failed
    assert list(tmp_path.iterdir()) == []  # nothing made by checking


def test_a_master_addr_that_does_not_resolve_fails_naming_the_key() -> None:
    failed = _failed("sync.master_addr=not.a.host.invalid")
    assert list(failed) == ["sync.master_addr"]
    assert "does not resolve" in failed["sync.master_addr"]


@pytest.mark.parametrize(
    ("override", "key", "said"),
    [
        ("kafka.extra.bogus.setting=1", "kafka.extra.bogus.setting", "No such configuration"),
        ("kafka.extra.acks=7", "kafka.extra.acks", "enable.idempotence"),
        ("kafka.linger_ms=99999999", "kafka.linger_ms", "outside allowed range"),
        ("kafka.max_message_bytes=99999999999", "kafka.max_message_bytes", "message.max.bytes"),
    ],
)
def test_client_settings_librdkafka_refuses_fail_naming_our_key(
    override: str, key: str, said: str
) -> None:
    """Each of these passed the dry run; every role then died at its first Kafka client with
    a traceback naming librdkafka's property (queue.buffering.max.ms), not the key set."""
    failed = _failed(override)
    assert list(failed) == [key]
    assert said in failed[key]


def test_a_filter_metric_the_built_in_reward_cannot_give_fails_naming_the_key() -> None:
    """It passed the dry run, and the trainer failed at its first sample (20 s in)."""
    on = "algorithm.filter_groups.enable=true"
    failed = _failed(on, "algorithm.filter_groups.metric=acc")
    assert list(failed) == ["algorithm.filter_groups.metric"]
    assert "returns a float" in failed["algorithm.filter_groups.metric"]
    assert not _failed(on, "algorithm.filter_groups.metric=score")


def test_a_checkpoints_dir_that_cannot_be_written_fails_at_start_up(tmp_path: Path) -> None:
    """A run's ``checkpoints`` on another, read-only disk (here a link into /proc, which even
    root cannot write): the start-up checks said ok, and the trainer died at its lock with an
    OSError traceback, restarted trainer.max_restarts times. Now refused naming output_dir and
    the directory; a trainer started by hand says it in one line (exit 4, not restarted)."""
    from asyncrl.consumers.checkpoint import CheckpointWriteError, trainer_lock

    cfg = load_config(overrides=["run_id=demo", f"output_dir={tmp_path}"])
    cfg.run_dir.mkdir()
    (cfg.run_dir / "checkpoints").symlink_to("/proc")
    failed = _failed("run_id=demo", f"output_dir={tmp_path}")
    assert list(failed) == ["output_dir"]
    assert failed["output_dir"].startswith(f"{cfg.run_dir / 'checkpoints'}: cannot create")
    with pytest.raises(CheckpointWriteError, match="cannot write the run's checkpoints in"):
        trainer_lock(cfg.run_dir)
