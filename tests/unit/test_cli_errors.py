"""The CLI ends in one clear message, not a traceback, for what the user can fix (issue 16):
a YAML syntax error, an unreachable broker, a failed run. ASYNCRL_DEBUG=1 keeps the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.cli import main
from asyncrl.kafka import BrokerUnavailable
from asyncrl.launch.broker import free_port
from asyncrl.launch.launcher import RunFailed


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCRL_DEBUG", raising=False)


def test_a_yaml_syntax_error_names_the_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_training_steps: [1, 2\n  save_freq: 1\n")
    assert main(["inspect", "control", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: YAML syntax error at line 3" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_bad_override_value_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "control", "trainer.total_training_steps=[1,"]) == 2
    assert "override 'trainer.total_training_steps=[1,': YAML syntax error" in (
        capsys.readouterr().err
    )


def test_an_unreachable_broker_is_one_line_naming_the_key() -> None:
    """Through a real process: logging as the CLI sets it up, librdkafka writing to fd 2."""
    bootstrap = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    out = subprocess.run(
        [
            *[sys.executable, "-m", "asyncrl", "inspect", "control"],
            f"kafka.bootstrap_servers='{bootstrap}'",
            "kafka.broker_down_timeout_s=1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "ASYNCRL_DEBUG"},
    )
    assert out.returncode == 1, out.stderr
    assert time.monotonic() - t0 < 15
    err = out.stderr.splitlines()
    assert err[-1].startswith("asyncrl inspect: no Kafka broker reachable at " + bootstrap)
    assert "kafka.bootstrap_servers" in err[-1]
    assert "Traceback" not in out.stderr
    assert len(err) <= 3, out.stderr


def test_a_failed_run_prints_the_log_tail_as_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def failing(_args: object) -> int:
        raise RunFailed("rollout-0 exited with code 1; last lines of rollout-0.log:\nboom\nend")

    monkeypatch.setitem(cli.COMMANDS, "run", failing)
    assert main(["run"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("asyncrl run: rollout-0 exited with code 1")
    assert err.rstrip().endswith("boom\nend")
    assert "Traceback" not in err


def test_asyncrl_debug_keeps_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(_args: object) -> int:
        raise BrokerUnavailable("127.0.0.1:1", 15, "Connection refused")

    monkeypatch.setitem(cli.COMMANDS, "run", failing)
    monkeypatch.setenv("ASYNCRL_DEBUG", "1")
    with pytest.raises(BrokerUnavailable):
        main(["run"])


def test_the_help_says_how_to_get_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "ASYNCRL_DEBUG=1" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["run", "train", "rollout", "inspect"])
def test_a_subcommands_help_lists_every_config_key_with_its_docstring(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from asyncrl.config import RunConfig

    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    field = RunConfig.model_fields["async_training"].annotation.model_fields["staleness_threshold"]
    assert "async_training.staleness_threshold  [float, default 0.5]" in out
    assert " ".join(field.description.split())[:60] in " ".join(out.split())
    assert "actor_rollout_ref.rollout.n  [" in out and "kafka.bootstrap_servers  [" in out


def test_bench_staleness_is_checked_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    """``--staleness`` sets the grid of ``bench tuning`` and the ablation of ``bench modes``;
    a value that is not a number, or the option given to another benchmark, ends at once."""
    assert main(["bench", "modes", "--staleness", "0.1,x"]) == 2
    assert "asyncrl bench modes: --staleness: could not convert string to float: 'x'" in (
        capsys.readouterr().err
    )
    assert main(["bench", "learn", "--staleness", "1"]) == 2
    assert "--staleness applies to modes and tuning, not learn" in capsys.readouterr().err
