"""The CLI ends in one clear message, not a traceback, for what the user can fix (issue 16):
a YAML syntax error, an unreachable broker, a failed run. ASYNCRL_DEBUG=1 keeps the traceback."""

from __future__ import annotations

import argparse
import os
import re
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
            *[sys.executable, "-m", "asyncrl", "prepare", "sync.master_port=29500"],
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
    assert err[-1].startswith("asyncrl prepare: no Kafka broker reachable at " + bootstrap)
    assert "kafka.bootstrap_servers" in err[-1]
    assert "Traceback" not in out.stderr
    assert len(err) <= 3, out.stderr


def test_a_reading_command_fails_at_once_on_a_loopback_port_nothing_listens_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """inspect, audit, monitor and replay read a run: a dead loopback address (often a
    finished run's embedded broker, still named by its saved config) ends at once, in one
    line, not after kafka.broker_down_timeout_s."""
    bootstrap = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "control", f"kafka.bootstrap_servers='{bootstrap}'"])
    assert time.monotonic() - t0 < 5
    assert str(exc.value) == (
        f"asyncrl inspect: nothing listens at {bootstrap} (kafka.bootstrap_servers): start the "
        "broker, or pass the address of the one holding the run"
    )


def _saved_run(output_dir: Path, run_id: str, bootstrap: str, archived: bool) -> Path:
    """A run directory as `asyncrl run` leaves it: its resolved config, maybe its log."""
    from asyncrl.launch.log_archive import ArchivedRecord, PartitionFile

    run_dir = output_dir / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(
        f"run_id: {run_id}\nkafka:\n  bootstrap_servers: '{bootstrap}'\n"
    )
    if archived:
        f = PartitionFile(run_dir / "log" / f"{run_id}.samples" / "0.log")
        f.append(ArchivedRecord(0, 0, b"k", b"v", []))
        f.close()
    return run_dir


def test_a_run_id_that_names_no_run_says_so_and_lists_the_runs_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _saved_run(tmp_path, "first", "127.0.0.1:1", archived=True)
    _saved_run(tmp_path, "first.20261126-101010", "127.0.0.1:1", archived=True)  # set aside
    with pytest.raises(SystemExit) as exc:
        main(["audit", "nosuch", "--output-dir", str(tmp_path)])
    message = str(exc.value)
    assert message.startswith(f"asyncrl audit: no run 'nosuch' in {tmp_path}/ (runs there: first)")
    assert "kafka.bootstrap_servers" in message
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "samples", "run_id=nosuch", f"output_dir='{tmp_path}'"])
    assert str(exc.value).startswith("asyncrl inspect: no run 'nosuch' in")


def test_monitor_of_a_finished_run_points_to_its_archived_log(tmp_path: Path) -> None:
    """monitor reads the run's saved config (so a live run's embedded broker is found by its
    run_id alone); once that broker is gone, it says where the run's log is instead."""
    run_dir = _saved_run(tmp_path, "done", f"127.0.0.1:{free_port()}", archived=True)
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(["monitor", "done", "--once", "--output-dir", str(tmp_path)])
    assert time.monotonic() - t0 < 5
    message = str(exc.value)
    assert message.startswith("asyncrl monitor: run 'done' has ended")
    assert str(run_dir / "log") in message and "asyncrl audit done" in message


def test_the_commands_suggested_for_a_finished_run_find_it_in_its_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run under another output_dir: the monitor (and the launcher's last line) suggested
    `asyncrl audit done`, which looked in runs/ and said "no run 'done' in runs/"."""
    _saved_run(tmp_path, "done", f"127.0.0.1:{free_port()}", archived=True)
    with pytest.raises(SystemExit) as exc:
        main(["monitor", "done", "--once", "--output-dir", str(tmp_path)])
    suggested = re.findall(r"`asyncrl (\w+) ([^`]*)`", str(exc.value))
    assert [command for command, _ in suggested] == ["inspect", "audit", "report"]
    for command, rest in suggested:
        assert f"done --output-dir {tmp_path}" in rest, command
    from asyncrl.cli.find_run import run_config

    audit = next(rest for command, rest in suggested if command == "audit")
    args = cli.build_parser().parse_args(["audit", *audit.split()])
    assert run_config(args).run_dir == tmp_path / "done"  # the suggestion finds the run


def test_audit_and_monitor_take_a_run_directory_as_report_does(tmp_path: Path) -> None:
    import argparse

    from asyncrl.cli.find_run import run_config

    run_dir = _saved_run(tmp_path / "elsewhere", "r7", "127.0.0.1:1", archived=False)
    args = argparse.Namespace(run=str(run_dir), output_dir="runs", config=None, overrides=[])
    cfg = run_config(args)
    assert (cfg.run_id, cfg.run_dir) == ("r7", run_dir.resolve())
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:1"


def test_audit_monitor_and_export_model_take_output_dir_as_inspect_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`asyncrl run output_dir=/x run_id=r` then `asyncrl monitor r output_dir=/x` (or audit,
    export-model): the override was overwritten by --output-dir's default, runs/, and the
    run was not found ("no run 'r' in runs/"); inspect took it."""
    _saved_run(tmp_path, "r8", "127.0.0.1:1", archived=False)
    for command in (["audit", "r8"], ["monitor", "r8", "--once"]):
        with pytest.raises(SystemExit) as exc:
            main([*command, f"output_dir='{tmp_path}'"])
        # found: it goes on to the broker its saved config names
        assert "nothing listens at 127.0.0.1:1" in str(exc.value), command
    assert main(["export-model", "r8", "--out", str(tmp_path / "m"), f"output_dir='{tmp_path}'"])
    assert f"no checkpoint in {tmp_path / 'r8' / 'checkpoints'}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # --output-dir still wins over the override
        main(["audit", "r8", "--output-dir", str(tmp_path / "other"), f"output_dir='{tmp_path}'"])
    assert f"no run 'r8' in {tmp_path / 'other'}/" in str(exc.value)


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
def test_a_subcommands_help_shows_the_common_keys_and_help_keys_every_one(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--help listed all 158 keys (481 lines for `asyncrl run --help`), burying the dozen a
    first run sets; it shows those, and --help-keys [PREFIX] the rest."""
    from asyncrl.config import RunConfig
    from asyncrl.ops.config_docs import COMMON_KEYS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    field = RunConfig.model_fields["async_training"].annotation.model_fields["staleness_threshold"]
    assert "async_training.staleness_threshold  [float, default 0.5]" in out
    assert " ".join(field.description.split())[:60] in " ".join(out.split())
    shown = [m[1] for line in out.splitlines() if (m := re.match(r"  ([a-z_.]+)  \[", line))]
    assert shown and set(shown) <= set(COMMON_KEYS) and len(out.splitlines()) < 120
    assert "kafka.linger_ms" not in out and "--help-keys" in out

    with pytest.raises(SystemExit) as done:
        main([command, "--help-keys"])
    assert done.value.code == 0
    every = capsys.readouterr().out
    assert (
        "kafka.linger_ms  [int, default 5]" in every and "actor_rollout_ref.rollout.n  [" in every
    )
    with pytest.raises(SystemExit):
        main([command, "--help-keys", "kafka.security"])
    listed = capsys.readouterr().out.splitlines()
    under = [m[1] for line in listed if (m := re.match(r"  ([a-z_.]+)  \[", line))]
    assert under and all(k.startswith("kafka.security.") for k in under)
    with pytest.raises(SystemExit) as bad:
        main([command, "--help-keys", "kafak"])
    assert bad.value.code == 2
    assert "no config key is or is under 'kafak'; sections: actor_rollout_ref" in (
        capsys.readouterr().err
    )
    # a key's last part, or a prefix cut inside a part, lists nothing: the keys holding it
    # are named (the message said "starts with", which async_training.staleness_threshold
    # does). Found by a tuning walkthrough.
    for text in ("staleness_threshold", "async_training.staleness"):
        with pytest.raises(SystemExit):
            main([command, "--help-keys", text])
        err = capsys.readouterr().err
        assert f"no config key is or is under '{text}'; keys containing it: " in err
        assert err.strip().endswith("keys containing it: async_training.staleness_threshold")


def test_every_common_key_is_a_config_key() -> None:
    from asyncrl.config import RunConfig
    from asyncrl.ops.config_docs import COMMON_KEYS, _rows

    assert set(COMMON_KEYS) <= {key for key, *_ in _rows(RunConfig, "")}


def test_bench_staleness_is_checked_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    """``--staleness`` sets the grid of ``bench tuning`` and the ablation of ``bench modes``;
    a value that is not a number, or the option given to another benchmark, ends at once."""
    assert main(["bench", "modes", "--staleness", "0.1,x"]) == 2
    assert "asyncrl bench modes: --staleness takes comma-separated numbers of at least 0 " in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as refused:
        main(["bench", "learn", "--staleness", "1"])
    assert refused.value.code == 2
    assert "unrecognized arguments: --staleness" in capsys.readouterr().err


def test_bench_lists_are_parsed_once_and_a_bad_value_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--staleness`` and ``--trigger`` were parsed by the check, then again for the
    benchmark (two parsers to keep alike), and ``--trigger 1,2.0`` ended on Python's "invalid
    literal for int() with base 10: '2.0'". One parse now: the benchmark gets its values, and
    a bad one is one line naming the flag, the value and what it takes."""
    import asyncrl.bench.tuning

    got: list[tuple] = []
    monkeypatch.setattr(asyncrl.bench.tuning, "tuning", lambda *a: got.append(a[4:]))
    assert main(["bench", "tuning", "--staleness", "0.5, 2", "--trigger", "1,4"]) == 0
    assert got == [((0.5, 2.0), (1, 4))]
    capsys.readouterr()
    assert main(["bench", "tuning", "--trigger", "1,2.0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "asyncrl bench tuning: --trigger takes comma-separated whole numbers of at least 1 "
        "(e.g. 1,2,4), not '2.0'"
    ]
    assert len(got) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["learn", "--trigger", "2"], "unrecognized arguments: --trigger"),
        (["modes", "--seeds", "3"], "unrecognized arguments: --seeds"),
        (["learn", "--workload", "long-tail"], "unrecognized arguments: --workload"),
        (["tuning", "--time-scale", "0.1"], "unrecognized arguments: --time-scale"),
        (["learn", "--device", "cpu"], "unrecognized arguments: --device"),
        (["offpolicy", "--new-tokens", "8"], "unrecognized arguments: --new-tokens"),
        (["modes", "--workload", "long-tail", "--time-scale", "0.1"], "--workload seed"),
        (["modes", "--time-scale", "0"], "--time-scale must be above 0 (got 0)"),
        (["tuning", "--trigger", "1,0"], "whole numbers of at least 1 (e.g. 1,2,4), not '0'"),
        (["tuning", "--staleness", "-1"], "--staleness takes comma-separated numbers of at least"),
        (["engine", "--batch", "0"], "--batch must be at least 1 (got 0)"),
    ],
)
def test_a_bench_option_the_benchmark_does_not_read_or_cannot_take_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """Each benchmark takes its own flags: another's is refused by argparse, naming it
    (``bench learn --trigger 2`` once ran learn's own setups without a word), and a value no
    run could take (``--trigger 0``, once found only after the colocated baseline had run)
    is one line naming the flag; either way no benchmark starts."""
    import asyncrl.bench.engine
    import asyncrl.bench.learn
    import asyncrl.bench.modes
    import asyncrl.bench.offpolicy
    import asyncrl.bench.tuning

    started: list[str] = []
    for module, name in (
        (asyncrl.bench.learn, "learn"),
        (asyncrl.bench.modes, "modes"),
        (asyncrl.bench.tuning, "tuning"),
        (asyncrl.bench.engine, "engine"),
        (asyncrl.bench.offpolicy, "offpolicy"),
    ):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: started.append(_n))
    try:
        code = main(["bench", *argv])
    except SystemExit as refused:  # argparse: a flag the benchmark does not take
        code = refused.code
    err = capsys.readouterr().err
    assert code == 2 and message in err
    if "unrecognized" not in message:  # a value: one line, naming the benchmark
        assert err.startswith(f"asyncrl bench {argv[0]}: ") and len(err.strip().splitlines()) == 1
    assert started == []


def test_bench_sync_measures_the_shapes_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/benchmarks.md runs `asyncrl bench sync --shapes 50M,500M`, but --shapes went to
    bench engine alone: bench sync always measured 50M and 500M (`--shapes 5M` took minutes
    instead of seconds). Found by a tuning walkthrough: it reaches sync, and an unknown shape
    is one line, as bench engine's."""
    import asyncrl.bench.sync

    seen: list[tuple[str, ...]] = []
    real = asyncrl.bench.sync.sync
    monkeypatch.setattr(
        asyncrl.bench.sync, "sync", lambda c, o, console, shapes, **k: seen.append(shapes)
    )
    assert main(["bench", "sync", "--shapes", "5M"]) == 0
    assert main(["bench", "sync"]) == 0
    assert seen == [("5M",), ("50M", "500M")]
    monkeypatch.setattr(asyncrl.bench.sync, "sync", real)
    assert main(["bench", "sync", "--shapes", "5M,7M"]) == 2
    assert "asyncrl bench: --shapes: no shape 7M (known: 5M, 50M, 500M)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("device", "gpus", "message"),
    [
        ("foo", 1, "--device takes auto, cpu, cuda or cuda:N, not 'foo'"),
        ("cuda", 0, "--device cuda: torch sees 0 CUDA device(s) here"),
        ("cuda:1", 1, "--device cuda:1: torch sees 1 CUDA device(s) here"),
    ],
)
def test_a_device_torch_would_refuse_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    device: str,
    gpus: int,
    message: str,
) -> None:
    """`bench sync --device foo` ended in torch's RuntimeError traceback, `--device cuda` on a
    machine without CUDA in "Torch not compiled with CUDA enabled". Found by a tuning
    walkthrough: both are one line before the benchmark starts."""
    import torch

    import asyncrl.bench.engine
    import asyncrl.bench.sync

    started: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(asyncrl.bench.sync, "sync", lambda *a, **k: started.append("sync"))
    monkeypatch.setattr(asyncrl.bench.engine, "engine", lambda *a, **k: started.append("engine"))
    for bench in ("sync", "engine"):
        assert main(["bench", bench, "--device", device]) == 2
        err = capsys.readouterr().err
        assert err.strip() == f"asyncrl bench {bench}: {message}"
    assert started == []


def test_a_trainer_past_max_num_gen_batches_exits_3_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The limit of dynamic sampling is the config's, not a crash: `asyncrl train` says it in
    one line and exits 3, which the launcher does not restart (it was a RuntimeError
    traceback, exit 1, restarted). Found by a tuning walkthrough."""
    from asyncrl.config import load_config
    from asyncrl.consumers.dynamic_sampling import GenBatchesExhausted, check_gen_batches

    fg = load_config(overrides=["algorithm.filter_groups.max_num_gen_batches=1"])
    with pytest.raises(GenBatchesExhausted) as limit:
        check_gen_batches(fg.algorithm.filter_groups, queued=1, filtered=7, n=8, step=1)

    def train(args: object) -> int:
        raise limit.value

    monkeypatch.setitem(cli.COMMANDS, "train", train)
    assert main(["train"]) == GenBatchesExhausted.EXIT_CODE == 3
    err = capsys.readouterr().err
    assert err.startswith("asyncrl train: algorithm.filter_groups.max_num_gen_batches=1: step 1")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_trainer_that_cannot_write_its_checkpoint_exits_4_and_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A full disk (or a read-only one) under the checkpoints is no crash: `asyncrl run`
    restarted the trainer trainer.max_restarts times, each training the steps since its last
    checkpoint again and failing on the same disk, then failed. Found walking a run's life
    cycle with the checkpoints on a 64 KiB tmpfs: the trainer now exits 4 in one line, and the
    launcher does not restart it."""
    from asyncrl.consumers.checkpoint import CheckpointWriteError
    from asyncrl.launch.supervise import trainer_not_restarted

    def train(args: object) -> int:
        raise CheckpointWriteError(f"writing a checkpoint failed: the disk of {tmp_path} is full")

    monkeypatch.setitem(cli.COMMANDS, "train", train)
    assert main(["train"]) == CheckpointWriteError.EXIT_CODE == 4
    err = capsys.readouterr().err
    assert err.startswith("asyncrl train: writing a checkpoint failed:")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "not restarted" in (trainer_not_restarted(4) or "")
    assert trainer_not_restarted(1) is None, "a crash is restarted"


def test_inspect_takes_the_run_as_a_word_and_its_broker_from_its_saved_config(
    tmp_path: Path,
) -> None:
    """A run started role by role (no archive): `asyncrl inspect steps RUN` reads the broker
    its config.yaml names, as audit does, instead of asking for kafka.bootstrap_servers."""
    bootstrap = f"127.0.0.1:{free_port()}"
    _saved_run(tmp_path, "byhand", bootstrap, archived=False)
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "steps", "byhand", f"output_dir='{tmp_path}'"])
    assert str(exc.value).startswith(f"asyncrl inspect: nothing listens at {bootstrap}")
    # --output-dir, as audit, monitor and report take it (inspect and replay had none); replay
    # takes the run as a word too, as its --help says
    for argv in (
        ["inspect", "steps", "byhand"],
        ["replay", "step", "1", "run_id=byhand"],
        ["replay", "step", "1", "byhand"],
    ):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--output-dir", str(tmp_path)])
        assert f"nothing listens at {bootstrap}" in str(exc.value)


def test_a_run_that_never_started_is_said_so(tmp_path: Path) -> None:
    (tmp_path / "early" / "logs").mkdir(parents=True)  # a run that failed in its set-up
    with pytest.raises(SystemExit) as exc:
        main(["audit", "early", "--output-dir", str(tmp_path)])
    assert "run 'early' never got past its start-up" in str(exc.value)


def test_a_run_trained_by_hand_without_prepare_is_asked_for_its_broker(tmp_path: Path) -> None:
    """`asyncrl train run_id=other kafka.bootstrap_servers=...` (the README's trainer of a
    replayed stream) writes no config.yaml: its finished run was said to have "never got past
    its start-up", pointing at a logs/ directory it does not have."""
    (tmp_path / "other" / "checkpoints" / "step_000065").mkdir(parents=True)
    (tmp_path / "other" / "metrics.jsonl").write_text("{}\n")
    for argv in (["audit", "other"], ["inspect", "steps", "other"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--output-dir", str(tmp_path)])
        message = str(exc.value)
        assert "never got past its start-up" not in message and "logs" not in message
        assert "holds no config.yaml to name the broker of run 'other'" in message
        assert message.endswith("pass kafka.bootstrap_servers=HOST:PORT")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["audit", "nothing", "--output-dir", str(tmp_path)])
    assert str(exc.value).endswith("holds no config.yaml and no log")  # no logs/ to point at


def test_a_negative_offset_is_a_usage_error_not_a_traceback():
    out = subprocess.run(
        [sys.executable, "-m", "asyncrl", "inspect", "steps", "demo", "--from", "-5"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "an offset is 0 or more, not -5" in out.stderr
    assert "Traceback" not in out.stderr


def test_output_cut_short_by_a_pipe_ends_quietly():
    """``asyncrl inspect samples RUN --json | head -2`` ended in a BrokenPipeError traceback."""
    code = (
        "import sys, asyncrl.cli as cli\n"
        "def endless(args):\n"
        "    while True:\n"
        '        print(\'{"sample_id": "x"}\')\n'
        "cli.COMMANDS['inspect'] = endless\n"
        "sys.exit(cli.main(['inspect', 'samples', 'demo', '--json']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline()  # head -1
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err.decode()
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_messages_the_broker_would_not_take_end_a_role_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A standalone broker restarted mid-run (its topics gone): the trainer and the workers
    died with 77-line tracebacks of KafkaDeliveryError."""
    from asyncrl.kafka import KafkaDeliveryError

    def failing(_args: object) -> int:
        raise KafkaDeliveryError("1 message(s) still undelivered after 30.0 s: the broker at x")

    monkeypatch.setitem(cli.COMMANDS, "train", failing)
    assert main(["train"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("asyncrl train: 1 message(s) still undelivered") and "Traceback" not in err
    )


def test_a_message_above_the_size_limit_ends_the_run_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kafka.max_message_bytes`` at its smallest: the prompt feed's first prompt is larger,
    and the run ended in a traceback around a message that says what to do."""
    argv = ["run", f"output_dir={tmp_path}", "kafka.max_message_bytes=1024", "data.train_size=64"]
    cache = f"actor_rollout_ref.model.cache_dir={tmp_path / 'cache'}"
    assert main([*argv, cache, "actor_rollout_ref.model.warmup_steps=1"]) == 1
    err = capsys.readouterr().err
    assert "above kafka.max_message_bytes=1024" in err and "Traceback" not in err


def test_a_runs_saved_config_finds_its_run_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`asyncrl replay step N --config runs/<run_id>/config.yaml` (and inspect) from outside
    the directory the run was started in: the saved config's output_dir is relative (the
    default `runs`), so the run was looked for under the current directory, and the command
    said nothing listened at the finished run's broker instead of reading its archived log."""
    import argparse

    from asyncrl.cli.find_run import load_run

    run_dir = _saved_run(tmp_path / "project" / "runs", "r8", "127.0.0.1:1", archived=True)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    args = argparse.Namespace(config=str(run_dir / "config.yaml"), overrides=[], output_dir=None)
    cfg = load_run(args)
    assert (cfg.run_id, cfg.run_dir) == ("r8", run_dir.resolve())
    # an output_dir given on the command line still wins
    args = argparse.Namespace(
        config=str(run_dir / "config.yaml"), overrides=["output_dir=mine"], output_dir=None
    )
    assert load_run(args).run_dir == Path("mine").absolute() / "r8"


def test_a_runs_relative_paths_are_found_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run started with model.path=models/m (and a reward file beside it), read back from
    another directory (`replay step N --config proj/runs/r/config.yaml`, `export-model
    proj/runs/r`): its saved config's paths were taken from the current directory, and replay
    said there was no model at models/m. They are found where the run was started from."""
    import argparse

    from asyncrl.cli.find_run import load_run, run_config

    project = tmp_path / "proj"
    run_dir = _saved_run(project / "runs", "r", "127.0.0.1:1", archived=True)
    (project / "models" / "m").mkdir(parents=True)
    (project / "reward.py").write_text("def compute_score(*a, **k):\n    return 0.0\n")
    with (run_dir / "config.yaml").open("a") as f:
        f.write(
            "output_dir: runs\nactor_rollout_ref:\n  model:\n    path: models/m\n"
            "custom_reward_function:\n  path: reward.py\n"
        )
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")

    args = argparse.Namespace(config=str(run_dir / "config.yaml"), overrides=[], output_dir=None)
    for cfg in (
        load_run(args),
        run_config(
            argparse.Namespace(run=str(run_dir), output_dir="runs", config=None, overrides=[])
        ),
    ):
        assert cfg.actor_rollout_ref.model.path == str((project / "models" / "m").resolve())
        assert cfg.custom_reward_function.path == str((project / "reward.py").resolve())

    # Read from where it was started, the paths are the run's files (made absolute at load).
    monkeypatch.chdir(project)
    args = argparse.Namespace(config="runs/r/config.yaml", overrides=[], output_dir=None)
    assert load_run(args).actor_rollout_ref.model.path == str(project / "models" / "m")


@pytest.mark.parametrize(("role", "started"), [("train", "Trainer"), ("rollout", "RolloutWorker")])
def test_a_role_started_without_the_collectives_port_says_so_before_starting(
    role: str, started: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README feeds a replayed stream to `asyncrl train run_id=OTHER
    kafka.bootstrap_servers=...`: the trainer loaded the policy, then died in a traceback,
    "RuntimeError: sync.master_port is not set (the launcher sets it for each run)"."""
    import asyncrl.cli.roles as roles
    import asyncrl.consumers.trainer as trainer
    import asyncrl.producers.worker as worker

    def never(*_args: object, **_kw: object) -> None:
        raise AssertionError(f"{started} started with no sync.master_port")

    monkeypatch.setattr(trainer, "Trainer", never)
    monkeypatch.setattr(worker, "RolloutWorker", never)
    monkeypatch.setattr(roles, "_finished_on_log", lambda cfg, bootstrap: None)
    argv = [role, "run_id=other", "kafka.bootstrap_servers=127.0.0.1:1", f"output_dir={tmp_path}"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, f"actor_rollout_ref.model.cache_dir={tmp_path / 'cache'}"])
    assert str(exc.value).startswith(f"asyncrl {role}: sync.master_port is not set")
    assert "sync.master_port=PORT" in str(exc.value)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["step", "abc"], "replay step takes a step number (1, 2, ...), not 'abc'"),
        (["step", "0"], "replay step takes a step number (1, 2, ...), not '0'"),
        (
            ["topic", "steps", "--to-run", "x"],
            "replay topic takes samples or partials, not 'steps'",
        ),
        (
            ["topic", "samples", "--to-run", "x", "--versions", "3-7"],
            "--versions takes a range LOW..HIGH such as 3..7, or one version, not '3-7'",
        ),
        (  # the whole topic was replayed (an empty shell variable), or " " was asked for
            ["topic", "samples", "--to-run", "x", "--sample-ids", " , "],
            "--sample-ids names no sample id (' , '): give them comma-separated, as a,b",
        ),
        (  # it warm-started a model of that shape (~45 s), then died loading the checkpoint
            ["step", "5", "actor_rollout_ref.model.hidden_size=64"],
            "actor_rollout_ref.model.hidden_size: replay step runs the step on the model its "
            "checkpoint holds, so the model's shape and warm start are the run's; override the "
            "update instead (actor_rollout_ref.actor.*, algorithm.*)",
        ),
    ],
)
def test_a_bad_replay_argument_is_one_line_before_the_log_is_opened(
    argv: list[str],
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`asyncrl replay step abc` and `--versions 3-7` ended in int()'s ValueError traceback,
    after a throwaway broker had served the run's archive (~5 s) for nothing."""
    import asyncrl.cli.replay as replay_cli

    def opened(*_args: object, **_kw: object) -> None:
        raise AssertionError("the run's log was opened")

    monkeypatch.setattr(replay_cli, "log_broker", opened)
    assert main(["replay", *argv, "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == f"asyncrl replay: {said}\n"


def test_replay_topic_into_a_closed_port_says_so_before_the_log_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--to-bootstrap` on a loopback port nothing listens on: the source's archive was served
    first, then 15 s of retries ended in "no Kafka broker reachable at ...
    (kafka.bootstrap_servers)", naming a key the user had not set."""
    import asyncrl.cli.replay as replay_cli

    def opened(*_args: object, **_kw: object) -> None:
        raise AssertionError("the run's log was opened")

    monkeypatch.setattr(replay_cli, "log_broker", opened)
    closed = f"127.0.0.1:{free_port()}"
    argv = ["replay", "topic", "samples", "--to-run", "x", "--to-bootstrap", closed]
    assert main([*argv, "--output-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"asyncrl replay: nothing listens at {closed} (--to-bootstrap): start run x's broker "
        "(`asyncrl broker --port PORT`), or name the one it runs on\n"
    )


def test_replay_topic_strips_the_spaces_around_each_sample_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sample-ids "a, b"` asked for the id " b", which no sample has: it was named as not
    on the topic (or, alone, failed the command) though b was there."""
    import contextlib

    import asyncrl.cli.replay as replay_cli
    import asyncrl.ops.replay as replay

    asked: list[object] = []
    monkeypatch.setattr(
        replay_cli,
        "log_broker",
        lambda cfg, *_: contextlib.nullcontext(cfg.kafka.bootstrap_servers),
    )
    monkeypatch.setattr(replay, "replay_topic", lambda *args: asked.append(args[8]))
    argv = ["replay", "topic", "samples", "--to-run", "x", "--output-dir", str(tmp_path)]
    assert main([*argv, "--sample-ids", " a, b ,,c"]) == 0
    assert main(argv) == 0
    assert asked == [{"a", "b", "c"}, None]


@pytest.mark.parametrize("module", ["asyncrl.config.sections", "asyncrl.launch.launcher"])
def test_ctrl_c_before_asyncrl_run_starts_anything_is_one_line(tmp_path: Path, module: str) -> None:
    """Ctrl-C in the first half second of ``asyncrl run`` (the CLI importing the config
    models, then the launcher) printed a page of KeyboardInterrupt traceback from inside the
    imports and died of the signal. A real SIGINT at that moment (sent as ``module`` is
    imported) now ends it with one line and the shell's 130."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from asyncrl.cli import main\n"
        f"raise SystemExit(main(['run', 'output_dir={tmp_path}']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stderr) == (
        130,
        "asyncrl run: stopped before it started anything\n",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_role_started_by_hand_with_a_key_its_run_cannot_change_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Role by role (`asyncrl train --config runs/<id>/config.yaml actor_rollout_ref.rollout.n=4`)
    a trainer or worker ran with a group size, model or data its run was not made with, as
    `asyncrl run` did on a resume: refused in one line, before anything starts."""
    from asyncrl.config import dump_config, load_config

    cfg = load_config(
        overrides=["run_id=demo", f"output_dir={tmp_path}", "kafka.bootstrap_servers=127.0.0.1:9"]
    )
    saved = cfg.run_dir / "config.yaml"
    dump_config(cfg, saved)
    for role in ("train", "rollout"):
        assert main([role, "--config", str(saved), "actor_rollout_ref.rollout.n=4"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"asyncrl {role}: actor_rollout_ref.rollout.n: 4, but run 'demo'")
        assert "another run_id=" in err and len(err.strip().splitlines()) == 1


def _parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(the words that reach it, parser) for the parser and each subcommand's, at any depth."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*words, name))


def _words_for(parser: argparse.ArgumentParser) -> list[str]:
    """What a parser requires: its positionals (a choice where it has them), its required
    options with a value."""
    words = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction) or not a.required or a.nargs in ("*", "?"):
            continue
        words += [*a.option_strings[-1:], str((a.choices or ["x"])[0])]  # type: ignore[index]
    return words


def _command_after(parser: argparse.ArgumentParser) -> list[str]:
    """What follows the flags of a parser with subcommands (the top level's, bench's): its
    first subcommand and what that requires."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            name, sub = next(iter(a.choices.items()))
            return [name, *_words_for(sub), *_command_after(sub)]
    return []


def test_a_shortened_flag_is_refused_by_every_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse took `bench learn --stal 1` as --staleness, and a shortened flag in a doc or a
    script passed until a new flag shared its start. Each command's every long flag, less its
    last letter, is refused by name (the command itself never runs)."""
    from asyncrl.cli.bench import declare_every_benchmark

    parser = cli.build_parser()
    declare_every_benchmark(parser)  # a benchmark's flags are added once its name is parsed
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    for name in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: 0)
    tried: list[tuple[str, ...]] = []
    for words, p in _parsers(parser):
        flags = {f: a for a in p._actions for f in a.option_strings if f.startswith("--")}
        for flag, action in flags.items():
            short = flag[:-1]
            if any(f.startswith(short) for f in flags if f != flag):
                continue  # an ambiguous prefix is refused either way
            value = [] if action.nargs in (0, "?") else [str((action.choices or ["1"])[0])]
            argv = [*words, *_words_for(p), short, *value, *_command_after(p)]
            try:
                code = cli.main(argv)  # the command ran: it took the flag
            except SystemExit as done:
                code = done.code
            err = capsys.readouterr().err
            assert code == 2 and f"unrecognized arguments: {short}" in err, (
                f"asyncrl {' '.join(argv)}: exit {code}, {err!r}"
            )
            tried.append(words)
    assert set(tried) >= {(), *((c,) for c in cli.COMMANDS)} and len(tried) > 50
    assert ("bench", "engine") in tried and ("bench", "tuning") in tried


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_the_help_says_what_the_commands_do(capsys: pytest.CaptureFixture[str]) -> None:
    """What a new user read in --help and the code or docs contradicted (found reading every
    command's --help)."""
    from asyncrl.config import DEFAULT_CONFIG
    from asyncrl.consumers.checkpoint import CheckpointWriteError
    from asyncrl.consumers.dynamic_sampling import GenBatchesExhausted

    top = _help(capsys)
    # exit codes: "1 or 2" only, while `asyncrl train` exits 3 and 4 on purpose
    assert f"exits {GenBatchesExhausted.EXIT_CODE} when its trainer gives up" in top
    assert f"{CheckpointWriteError.EXIT_CODE} when it cannot write a checkpoint" in top
    # train and rollout named kafka.bootstrap_servers; both also refuse to start without
    # sync.master_port (test_a_role_started_without_the_collectives_port_says_so...)
    assert "(needs kafka.bootstrap_servers and sync.master_port;" in top
    assert "(needs kafka.bootstrap_servers and the trainer's sync.master_port)" in top
    # replay was "re-run a training step" alone; `replay topic` re-publishes records
    assert "re-run a training step from the log and its checkpoint, or re-publish" in top
    # --config said "run config YAML"; the docs' `--config calculator` names a shipped one
    shipped = sorted(f.stem for f in DEFAULT_CONFIG.parent.glob("*.yaml") if f != DEFAULT_CONFIG)
    assert len(shipped) >= 2
    for command in ("run", "inspect"):
        assert f"or a shipped one by name: {', '.join(shipped)} (default:" in _help(capsys, command)
    # --worker-id said 0..num_workers-1; docs/cluster.md starts `--worker-id 2` to add one
    assert "another id joins a running one" in _help(capsys, "rollout")
    # replay said to pass the run's kafka.bootstrap_servers; an `asyncrl run` is read from
    # its archive, and the run may be named as inspect names it
    replay = _help(capsys, "replay")
    assert "read from its archived log" in replay and "a word RUN after the target" in replay
    # monitor said report reads the archived log; it reads metrics.jsonl
    assert "report reads its metrics.jsonl" in _help(capsys, "monitor")
    # audit said it reads "on kafka.bootstrap_servers", then that it reads the archive
    assert "topics on kafka.bootstrap_servers" not in _help(capsys, "audit")
    # report's --output-dir said "default: the config's output_dir, runs"; report takes no
    # config (no --config, and output_dir=DIR alone: _report_output_dir), so runs it is
    report = _help(capsys, "report")
    assert "config's output_dir" not in report
    assert "(default: runs; report reads no config, so only this or output_dir=DIR" in report


def test_export_model_of_a_wrong_run_id_says_no_such_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`asyncrl export-model nope` said "no checkpoint in runs/nope/checkpoints (kept: none;
    trainer.save_freq, ...)", as if the run were there with no checkpoint."""
    _saved_run(tmp_path, "r9", "127.0.0.1:1", archived=False)
    out = tmp_path / "m"
    assert main(["export-model", "nope", "--out", str(out), "--output-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"asyncrl export-model: no run 'nope' in {tmp_path}/ (runs there: r9)"
    )
    assert not out.exists()


REPLAY_TAKES_FIXED = {
    "actor_rollout_ref.actor.ppo_mini_batch_size": "it splits the step into optimizer steps",
    "actor_rollout_ref.model.path": "another model's checkpoint is refused as it loads",
    "actor_rollout_ref.model.override_config": "another model's checkpoint is refused as it loads",
}
"""Keys fixed for a run's life that a replayed step does take, with why."""


def test_each_key_fixed_for_a_run_is_warned_refused_or_known_to_change_a_replayed_step() -> None:
    """``replay step``'s NO_EFFECT_ON_REPLAY is kept by hand beside launch/resume_check.FIXED
    (neither derives from the other: most keys without effect on a replay may change on a
    resume); kafka.topics.partitions.*, fixed for the run, passed a replay without a word.
    Each fixed key is now exactly one of: warned of, refused, or named above with why; a key
    added to FIXED fails here until it is put in one."""
    import asyncrl.cli.replay as replay_cli
    from asyncrl.config import load_config
    from asyncrl.launch.resume_check import fixed_why, flat
    from asyncrl.ops.replay import ReplayError

    fixed = [key for key in flat(load_config().model_dump(mode="json")) if fixed_why(key)]
    unsorted = []
    for key in fixed:
        warned = replay_cli._no_effect_on_replay([f"{key}=1"]) == [key]
        try:
            replay_cli._replayable_overrides([f"{key}=1"])
            refused = False
        except ReplayError:
            refused = True
        if [warned, refused, key in REPLAY_TAKES_FIXED].count(True) != 1:
            unsorted.append(key)
    assert "actor_rollout_ref.rollout.n" in fixed and set(REPLAY_TAKES_FIXED) <= set(fixed)
    assert not unsorted, f"fixed keys replay step neither warns of, refuses nor takes: {unsorted}"


def test_replay_step_warns_of_overrides_the_recorded_samples_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`replay step 5 actor_rollout_ref.rollout.n=4` was taken and silently did nothing; the
    update's keys, and the rollout's temperature (its log-probs), pass without a word."""
    import asyncrl.cli.replay as replay_cli
    from asyncrl.ops.replay import ReplayError

    def opened(*_args: object, **_kw: object) -> None:
        raise ReplayError("the log was opened")

    monkeypatch.setattr(replay_cli, "log_broker", opened)
    idle = ["actor_rollout_ref.rollout.n=4", "data.train_size=8"]
    used = [
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.temperature=0.5",  # the log-probs' temperature
        "actor_rollout_ref.rollout.response_length=32",  # verl's data.max_response_length
    ]
    assert main(["replay", "step", "5", *idle, *used, "--output-dir", str(tmp_path)]) == 1
    warning, opened_line = capsys.readouterr().err.splitlines()
    assert warning.startswith(
        "asyncrl replay: warning: actor_rollout_ref.rollout.n, data.train_size: no effect on a "
        "replayed step"
    )
    assert opened_line == "asyncrl replay: the log was opened"
    assert main(["replay", "step", "5", *used, "--output-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "asyncrl replay: the log was opened\n"
