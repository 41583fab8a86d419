"""Launcher decisions that need no broker: what an earlier run in the same directory means, what
a failed run reports."""

import io

import pytest
import torch
from rich.console import Console

from asyncrl.config import load_config
from asyncrl.consumers.checkpoint import TrainerState, latest_checkpoint, save_checkpoint
from asyncrl.kafka.settings import BACKGROUND_FETCH_WAIT_MS, consumer_config
from asyncrl.launch.launcher import for_embedded_broker, resume_or_set_aside
from asyncrl.launch.log_archive import ArchivedRecord, PartitionFile, log_dir
from asyncrl.launch.supervise import failure_report


def _cfg(tmp_path):
    return load_config(overrides=["run_id=demo", f"output_dir='{tmp_path}'"])


def _checkpoint(cfg) -> None:
    model = torch.nn.Linear(2, 2)
    state = TrainerState(step=3, version=3, batcher={}, metrics={})
    save_checkpoint(cfg.run_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), state)


def _archive(cfg) -> None:
    f = PartitionFile(log_dir(cfg) / cfg.topic("samples") / "0.log")
    f.append(ArchivedRecord(0, 0, b"k", b"v", []))
    f.close()


def _set_aside(tmp_path, cfg):
    return [p for p in tmp_path.iterdir() if p.name.startswith("demo.")]


def test_checkpoint_without_its_log_is_moved_aside(tmp_path):
    cfg = _cfg(tmp_path)
    _checkpoint(cfg)
    out = io.StringIO()
    assert resume_or_set_aside(cfg, Console(file=out, width=200)) is False
    (aside,) = _set_aside(tmp_path, cfg)
    assert latest_checkpoint(aside) is not None, "the old run is kept, not deleted"
    assert not cfg.run_dir.exists()
    assert "starting afresh" in out.getvalue()


def test_an_unfinished_run_with_its_archived_log_is_resumed(tmp_path):
    cfg = _cfg(tmp_path)
    _checkpoint(cfg)
    _archive(cfg)
    assert resume_or_set_aside(cfg, Console(file=io.StringIO())) is True
    assert latest_checkpoint(cfg.run_dir) is not None and not _set_aside(tmp_path, cfg)


def test_resume_mode_disable_starts_afresh_beside_an_unfinished_run(tmp_path):
    """verl's ``trainer.resume_mode=disable``: refused before ("asyncrl resumes by itself"), so
    a verl YAML carrying it failed, and starting over meant deleting the run by hand."""
    from asyncrl.config import ConfigError
    from asyncrl.launch.preflight import check_startable

    cfg = load_config(
        overrides=["run_id=demo", f"output_dir='{tmp_path}'", "trainer.resume_mode=disable"]
    )
    _checkpoint(cfg)
    _archive(cfg)
    out = io.StringIO()
    assert resume_or_set_aside(cfg, Console(file=out, width=200)) is False
    (aside,) = _set_aside(tmp_path, cfg)
    assert latest_checkpoint(aside) is not None and not cfg.run_dir.exists()
    assert "(unfinished; trainer.resume_mode=disable) and starting afresh" in out.getvalue()
    # On a broker of the user's the earlier log stays under the run's topics: refused there.
    aside.rename(cfg.run_dir)
    cfg.kafka.bootstrap_servers = "127.0.0.1:9"
    with pytest.raises(ConfigError, match="trainer.resume_mode: disable, but .* another run_id"):
        check_startable(cfg, "run")
    check_startable(cfg, "train")  # a trainer started by hand resumes, whatever it says


def test_a_finished_run_is_moved_aside_even_with_its_log(tmp_path):
    cfg = _cfg(tmp_path)
    _checkpoint(cfg)
    _archive(cfg)
    (cfg.run_dir / "summary.json").write_text("{}")
    assert resume_or_set_aside(cfg, Console(file=io.StringIO())) is False
    assert len(_set_aside(tmp_path, cfg)) == 1 and not cfg.run_dir.exists()


def test_run_dir_without_checkpoint_is_left_alone(tmp_path):
    cfg = _cfg(tmp_path)
    (cfg.run_dir / "logs").mkdir(parents=True)
    assert resume_or_set_aside(cfg, Console(file=io.StringIO())) is False
    assert (cfg.run_dir / "logs").exists()


def test_the_group_session_is_short_on_the_embedded_broker_only(tmp_path):
    """Tansu answers a group join after about half the session timeout: the embedded broker
    gets 2 s (a worker's first prompt ~1 s after it subscribes, not ~3 s); a cluster gets
    Apache Kafka's minimum, 6 s, unless the config says otherwise."""
    cfg = _cfg(tmp_path)
    assert consumer_config(cfg.kafka, "k:9092", "g")["session.timeout.ms"] == 6000
    embedded = for_embedded_broker(cfg)
    assert consumer_config(embedded.kafka, "k:9092", "g")["session.timeout.ms"] == 2000
    assert cfg.kafka.session_timeout_ms is None, "the caller's config is not changed"
    chosen = load_config(overrides=["kafka.session_timeout_ms=9000"])
    assert for_embedded_broker(chosen).kafka.session_timeout_ms == 9000


def test_readers_nobody_waits_on_ask_the_broker_less_often(tmp_path):
    """The launcher's progress and archive readers wait longer per fetch than the roles' (an
    idle fetch costs Tansu a request per wait), never shorter than the config's own wait."""
    cfg = _cfg(tmp_path)
    role = consumer_config(cfg.kafka, "k:9092", "g")["fetch.wait.max.ms"]
    background = consumer_config(cfg.kafka, "k:9092", "g", background=True)["fetch.wait.max.ms"]
    assert role == cfg.kafka.fetch_wait_max_ms < background == BACKGROUND_FETCH_WAIT_MS
    slow = load_config(overrides=["kafka.fetch_wait_max_ms=500"]).kafka
    assert consumer_config(slow, "k:9092", "g", background=True)["fetch.wait.max.ms"] == 500


def test_a_failed_trainer_reports_what_the_workers_said_last(tmp_path):
    """A trainer that timed out waiting for samples fails because of a worker: the report
    carries every worker's last lines (also a worker started by hand), a worker's its own."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "trainer.log").write_text("step 3\nTimeoutError: only 3 of 4 samples arrived\n")
    (logs / "rollout-0.log").write_text("".join(f"line {i}\n" for i in range(40)))
    (logs / "rollout-2.log").write_text("waiting for prompts\n")
    (logs / "empty.log").write_text("")

    report = failure_report("trainer", 1, logs / "trainer.log")
    assert report.startswith("trainer exited with code 1; last lines of")
    assert "only 3 of 4 samples" in report
    assert "line 39" in report and "line 28" in report and "line 27" not in report
    assert f"last lines of {logs / 'rollout-2.log'}:\nwaiting for prompts" in report
    assert "empty.log" not in report

    worker = failure_report("rollout-0", 1, logs / "rollout-0.log")
    assert "line 39" in worker and "trainer.log" not in worker and "rollout-2" not in worker


def test_the_launchers_set_up_imports_no_torch_when_the_policy_is_cached(tmp_path):
    """The roles import torch and transformers from the fork server while the launcher sets
    the run up; the launcher importing them too (to look for a checkpoint, to load the
    cached policy) cost ~2 s of every ``asyncrl run`` (docs/design.md, "Processes")."""
    import json
    import subprocess
    import sys

    from asyncrl.models.cache import METRICS_FILE, policy_dir

    overrides = [
        "run_id=demo",
        f"output_dir='{tmp_path}'",
        f"actor_rollout_ref.model.cache_dir='{tmp_path / 'cache'}'",
    ]
    cfg = load_config(overrides=overrides)
    entry = policy_dir(cfg)
    entry.mkdir(parents=True)
    (entry / METRICS_FILE).write_text(json.dumps({"warmup_val_accuracy": 0.39}))
    (cfg.run_dir).mkdir(parents=True)
    (cfg.run_dir / "summary.json").write_text("{}")  # a finished run to move aside
    script = f"""
import io, sys
from rich.console import Console
from asyncrl.config import load_config
from asyncrl.launch.launcher import resume_or_set_aside
from asyncrl.launch.setup import prepare_policy
cfg = load_config(overrides={overrides!r})
out = io.StringIO()
resume_or_set_aside(cfg, Console(file=out))
prepare_policy(cfg, Console(file=out, width=200))
print(out.getvalue())
print("heavy:", sorted(m for m in ("torch", "transformers") if m in sys.modules))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "heavy: []" in done.stdout, done.stdout + done.stderr
    assert "held-out accuracy 0.390" in done.stdout
    assert _set_aside(tmp_path, cfg), "the finished run was moved aside"


def test_a_second_launcher_of_a_running_run_is_refused_before_it_touches_the_run(
    tmp_path, monkeypatch
):
    """`asyncrl run` twice on one run (a second terminal, `make run` again): the second took
    the live run for an unfinished one, restored its half-written archive into a broker of its
    own and trained a second trainer into the same checkpoints and archive. It is refused now,
    naming the first; once the first dies (SIGKILL here), the run can be launched again."""
    import subprocess
    import sys

    from asyncrl.launch import launcher

    cfg = _cfg(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "summary.json").write_text("{}")  # a second launcher moved this aside
    script = f"""
import time
from asyncrl.config import load_config
from asyncrl.launch.launcher import run_lock
with run_lock(load_config(overrides=["run_id=demo", "output_dir='{tmp_path}'"])):
    print("held", flush=True)
    time.sleep(120)
"""
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)

    class Launched(Exception):
        pass

    def launched() -> None:
        raise Launched

    monkeypatch.setattr(launcher, "check_startable", lambda cfg, role: None)
    monkeypatch.setattr(launcher, "start_role_server", launched)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        with pytest.raises(launcher.RunFailed, match=f"already running .*pid {first.pid}"):
            launcher.run(cfg, Console(file=io.StringIO()))
        assert (cfg.run_dir / "summary.json").exists() and not _set_aside(tmp_path, cfg)
    finally:
        first.kill()
        first.wait(30)
    with pytest.raises(Launched):  # its lock went with it
        launcher.run(cfg, Console(file=io.StringIO()))


def test_a_restarted_role_is_named_with_its_new_pid(tmp_path, monkeypatch):
    """`asyncrl run`'s roles are forked from a preloaded server, so ps shows each as that
    server's command line: the launcher's console is where a user finds which pid is the
    trainer (to py-spy it, to SIGTERM a worker); a restart named no pid."""
    import asyncrl.kafka
    from asyncrl.launch import supervise

    class NoSteps:
        def __init__(self, *_args, **_kw) -> None: ...

        def assign(self, _topic) -> None: ...

        def watermarks(self, _topic):
            return {0: (0, 0)}

        def poll(self, _timeout):
            return []

        def close(self) -> None: ...

    class Proc:
        def __init__(self, pid: int, code: int) -> None:
            self.pid, self.code = pid, code

        def poll(self) -> int:
            return self.code

    monkeypatch.setattr(asyncrl.kafka, "Reader", NoSteps)
    cfg = _cfg(tmp_path)
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "summary.json").write_text('{"step": 0}')
    out = io.StringIO()
    supervise.follow(
        cfg,
        "127.0.0.1:1",
        {"trainer": (Proc(7, -9), tmp_path / "trainer.log")},
        Console(file=out, width=200),
        tmp_path / "config.yaml",
        lambda _name, _cmd, log: (Proc(4242, 0), log),
    )
    assert "trainer exited with code -9; restarting it (1/3, pid 4242); it resumes" in (
        out.getvalue()
    )


def test_a_resume_that_changes_a_key_fixed_for_the_run_is_refused_naming_it(tmp_path):
    """`asyncrl run actor_rollout_ref.rollout.n=4` on an unfinished run started with 8 resumed
    it: groups of 4 trained after groups of 8, the audit clean, config.yaml rewritten; a
    changed model crash-looped the trainer on its checkpoint. Refused now, before anything
    starts, naming the key and the way to start afresh; a safe key resumes with its new value."""
    from asyncrl.config import ConfigError, dump_config
    from asyncrl.launch.launcher import _launch

    cfg = _cfg(tmp_path)
    dump_config(cfg, cfg.run_dir / "config.yaml")
    _archive(cfg)  # an unfinished run, to resume
    changed = load_config(
        overrides=["run_id=demo", f"output_dir='{tmp_path}'", "actor_rollout_ref.rollout.n=4"]
    )
    said = io.StringIO()
    with pytest.raises(ConfigError) as err:
        _launch(changed, Console(file=said, width=300), None)
    assert "holds an unfinished run" not in said.getvalue()  # it said it resumed, then refused
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("actor_rollout_ref.rollout.n: 4, but run 'demo'")
    assert "started with 8" in line and "trainer.resume_mode=disable" in line
    assert not list(tmp_path.glob("demo.*")), "the run is neither moved aside nor touched"

    from asyncrl.launch.resume_check import changed_fixed_keys

    saved = cfg.model_dump(mode="json")
    safe = load_config(
        overrides=[
            "run_id=demo",
            f"output_dir='{tmp_path}'",
            "actor_rollout_ref.actor.optim.lr=1e-4",
            "trainer.total_training_steps=500",
            "trainer.test_freq=2",
            "actor_rollout_ref.rollout.num_workers=2",
        ]
    )
    assert changed_fixed_keys(saved, safe) == []
    for key, value in [
        ("actor_rollout_ref.model.hidden_size", "64"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", "4"),
        ("async_training.partial_rollout", "true"),
        ("data.seed", "3"),
        ("kafka.topics.partitions.prompts", "2"),
    ]:
        other = load_config(overrides=[f"{key}={value}"])
        assert [c[0] for c in changed_fixed_keys(saved, other)] == [key]


def test_a_finished_run_on_a_kafka_cluster_launched_again_says_so_and_starts_nothing(tmp_path):
    """`asyncrl run` of a finished run on a broker of the user's said "resumed ... the trainer
    goes on from its last checkpoint", started every role (~10 s) and printed the old summary.
    Now one line says it has finished and what to do; nothing is started (the broker here
    does not exist: a launch that went on failed on it)."""
    import json

    from asyncrl.launch.launcher import _launch

    cfg = load_config(
        overrides=[
            "run_id=demo",
            f"output_dir='{tmp_path}'",
            "kafka.bootstrap_servers=127.0.0.1:9",
            "kafka.broker_down_timeout_s=1",
        ]
    )
    cfg.run_dir.mkdir(parents=True)
    done = {"step": 20, "reason": "total_training_steps reached", "val/accuracy": 0.66}
    (cfg.run_dir / "summary.json").write_text(json.dumps(done))
    out = io.StringIO()
    assert _launch(cfg, Console(file=out, width=400), None) == done
    said = " ".join(out.getvalue().split())
    assert "run 'demo' has finished (step 20: total_training_steps reached" in said
    assert "nothing to train" in said and "run_id= of its own" in said
    assert sorted(p.name for p in cfg.run_dir.iterdir()) == ["summary.json"]


def test_the_dry_run_shows_a_resume_that_changes_a_key_fixed_for_the_run(tmp_path):
    """`asyncrl run --dry-run` with a key the unfinished run cannot change said every check
    passed ("the run could start"); the launch then refused it. The check is a start-up check
    now: the dry run fails on it, and says when a launch would resume the run."""
    from asyncrl.config import dump_config
    from asyncrl.launch.preflight import startup_checks

    cfg = _cfg(tmp_path)
    dump_config(cfg, cfg.run_dir / "config.yaml")
    _archive(cfg)  # an unfinished run, to resume
    same = {c.key: c for c in startup_checks(cfg, "run")}
    assert same["run_id"].ok and "resumes the unfinished run" in same["run_id"].detail
    changed = load_config(
        overrides=["run_id=demo", f"output_dir='{tmp_path}'", "actor_rollout_ref.rollout.n=4"]
    )
    failed = {c.key: c.detail for c in startup_checks(changed, "run") if c.ok is False}
    assert list(failed) == ["actor_rollout_ref.rollout.n"]
    assert failed["actor_rollout_ref.rollout.n"].startswith("4, but run 'demo'")
    (cfg.run_dir / "summary.json").write_text("{}")  # finished: moved aside, not resumed
    assert not [c for c in startup_checks(changed, "run") if c.ok is False]


def test_the_run_summary_shows_a_figure_the_run_had_nothing_for_as_a_dash(tmp_path):
    """A run without syncs printed `sync_resumed_s_mean  None` in its summary table."""
    from asyncrl.launch.supervise import print_summary

    out = io.StringIO()
    summary = {"step": 4, "sync_resumed_s_mean": None, "wait_s_mean": 0.25}
    print_summary(summary, Console(file=out, width=120), tmp_path / "trainer.log")
    rows = {line.split()[1]: line.split()[3] for line in out.getvalue().splitlines() if "│" in line}
    assert rows == {"step": "4", "sync_resumed_s_mean": "-", "wait_s_mean": "0.250"}
