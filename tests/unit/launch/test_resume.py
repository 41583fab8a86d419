"""What ``asyncrl run`` does with an earlier run in its directory (``launch/resume.py``): every
outcome of the one decision the launcher and the dry run share, from run directories built
in tmp_path, with no broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asyncrl.config import dump_config, load_config
from asyncrl.consumers.checkpoint import TrainerState, save_checkpoint
from asyncrl.launch.log_archive import ArchivedRecord, PartitionFile, log_dir
from asyncrl.launch.preflight import dry_run, startup_checks
from asyncrl.launch.resume import decide

CLUSTER = "kafka.bootstrap_servers=127.0.0.1:9"
"""A broker of the user's (nothing listens there: the decision asks it nothing)."""

DONE = {"step": 20, "reason": "total_training_steps reached"}


def _overrides(tmp_path: Path, *extra: str) -> list[str]:
    return ["run_id=demo", f"output_dir='{tmp_path}'", *extra]


def _earlier_run(tmp_path: Path, holds: set[str]) -> None:
    """The run directory an earlier launch left: its config.yaml (with rollout.n=8), a
    checkpoint of step 3, an archived log, a summary.json."""
    cfg = load_config(overrides=_overrides(tmp_path))
    cfg.run_dir.mkdir(parents=True)
    if "config" in holds:
        dump_config(cfg, cfg.run_dir / "config.yaml")
    if "checkpoint" in holds:
        model = torch.nn.Linear(2, 2)
        state = TrainerState(step=3, version=3, batcher={}, metrics={})
        save_checkpoint(cfg.run_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), state)
    if "log" in holds:
        f = PartitionFile(log_dir(cfg) / cfg.topic("samples") / "0.log")
        f.append(ArchivedRecord(0, 0, b"k", b"v", []))
        f.close()
    if "summary" in holds:
        (cfg.run_dir / "summary.json").write_text(json.dumps(DONE))


CHANGED = "actor_rollout_ref.rollout.n=4"
DISABLE = "trainer.resume_mode=disable"
ALL = {"config", "checkpoint", "log"}

# (id, what the run directory holds, overrides, outcome, key named, in its line)
TABLE = [
    ("nothing there", set(), [], "fresh", "run_id", "starts afresh"),
    ("logs only", {"config"}, [], "fresh", "run_id", "starts afresh"),
    ("unfinished", ALL, [], "resume", "run_id", "from step 3, its archived log restored"),
    ("unfinished, no checkpoint yet", {"config", "log"}, [], "resume", "run_id", "its start"),
    ("unfinished, a fixed key changed", ALL, [CHANGED], "refused", CHANGED[:-2], "started with 8"),
    ("finished", ALL | {"summary"}, [], "set_aside", "run_id", "finished at step 20"),
    ("finished, a fixed key changed", ALL | {"summary"}, [CHANGED], "set_aside", "run_id", ""),
    ("log lost", {"config", "checkpoint"}, [], "set_aside", "run_id", "log was lost"),
    ("disable", ALL, [DISABLE], "set_aside", "run_id", "unfinished; trainer.resume_mode=disable"),
    ("disable, a fixed key changed", ALL, [DISABLE, CHANGED], "set_aside", "run_id", "disable"),
    ("disable, nothing to set aside", {"config"}, [DISABLE], "fresh", "run_id", "afresh"),
    # a Kafka cluster keeps the run's log: nothing is moved aside
    ("cluster: nothing there", set(), [CLUSTER], "fresh", "run_id", "starts afresh"),
    ("cluster: unfinished", ALL, [CLUSTER], "resume", "run_id", "from step 3 (no fixed key"),
    ("cluster: no checkpoint yet", {"config"}, [CLUSTER], "resume", "run_id", "from its start"),
    ("cluster: no config.yaml", {"checkpoint"}, [CLUSTER], "fresh", "run_id", "afresh"),
    ("cluster: a fixed key changed", ALL, [CLUSTER, CHANGED], "refused", CHANGED[:-2], "run_id="),
    ("cluster: finished", ALL | {"summary"}, [CLUSTER], "finished", "run_id", "nothing to train"),
    ("cluster: finished, key", ALL | {"summary"}, [CLUSTER, CHANGED], "finished", "run_id", ""),
    ("cluster: disable", ALL, [CLUSTER, DISABLE], "refused", "trainer.resume_mode", "(step_"),
    (
        "cluster: disable, finished",
        ALL | {"summary"},
        [CLUSTER, DISABLE],
        "refused",
        "trainer.resume_mode",
        "another run_id",
    ),
    ("cluster: disable, no checkpoint", {"config"}, [CLUSTER, DISABLE], "resume", "run_id", ""),
    ("cluster: disable, no run", set(), [CLUSTER, DISABLE], "fresh", "run_id", "afresh"),
]


@pytest.mark.parametrize(
    ("holds", "overrides", "outcome", "key", "said"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_each_earlier_run_gets_one_outcome_the_dry_run_shows_as_is(
    tmp_path, holds, overrides, outcome, key, said
):
    _earlier_run(tmp_path, holds)
    cfg = load_config(overrides=_overrides(tmp_path, *overrides))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    decision = decide(cfg)
    assert (decision.outcome, decision.key) == (outcome, key), decision.line
    assert said in decision.line
    assert "\n" not in decision.line
    assert decision.restore_log == (outcome == "resume" and CLUSTER not in overrides)
    assert decision.step == (3 if outcome == "resume" and "checkpoint" in holds else None)
    assert decision.finished == ("summary" in holds)
    assert decision.summary == (DONE if "summary" in holds else {})
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    # the dry run's line is the decision (a refusal fails it, naming the key)
    (check,) = [c for c in startup_checks(cfg, "run") if c.detail == decision.line]
    assert (check.key, check.ok) == (key, outcome != "refused")
    assert not [c for c in startup_checks(cfg, "train") if c.detail == decision.line]


def _dry_run_lines(tmp_path: Path, capsys, *overrides: str, key: str = "run_id") -> list[str]:
    """The dry run's check lines about the earlier run (run_id, trainer.resume_mode, or
    ``key``)."""
    dry_run(None, _overrides(tmp_path, *overrides))
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    checks = [line for line in lines if line.startswith(("ok ", "FAIL ", "-- "))]
    return [line for line in checks if any(f" {k}:" in line for k in (key, "trainer.resume_mode"))]


@pytest.mark.parametrize(
    ("holds", "overrides", "launch_says"),
    [
        (ALL | {"summary"}, [], "moved the earlier run in"),
        ({"config", "summary"}, [CLUSTER, DISABLE], "has finished (step 20"),
    ],
    ids=["finished", "cluster: disable, finished, its checkpoints deleted"],
)
def test_the_dry_run_says_what_the_launch_does_with_a_finished_run(
    tmp_path, capsys, holds, overrides, launch_says
):
    """`asyncrl run --dry-run` of a finished run said nothing of it (the launch moved it
    aside), or, with trainer.resume_mode=disable on a cluster and no checkpoint left, "the
    run starts afresh" where the launch said it had finished and started nothing."""
    import io

    from rich.console import Console

    from asyncrl.launch.launcher import _launch, resume_or_set_aside

    _earlier_run(tmp_path, holds)
    (line,) = _dry_run_lines(tmp_path, capsys, *overrides)
    assert "afresh" not in line or "moves the earlier run" in line, line
    said = io.StringIO()
    cfg = load_config(overrides=_overrides(tmp_path, *overrides))
    if cfg.kafka.bootstrap_servers is None:
        resume_or_set_aside(cfg, Console(file=said, width=400))
        assert line.startswith("ok   run_id: moves the earlier run in")
    else:
        assert _launch(cfg, Console(file=said, width=400), None) == DONE
        assert line.startswith("ok   run_id: run 'demo' has finished (step 20")
    assert launch_says in " ".join(said.getvalue().split())


def test_the_dry_run_of_resume_mode_disable_on_a_cluster_with_no_checkpoint_says_it_resumes(
    tmp_path, capsys
):
    """A run on a cluster killed before its first checkpoint, launched again with
    trainer.resume_mode=disable: the dry run said both "the run starts afresh" and "resumes
    the unfinished run"; the launch resumes it (from its start, on the log it left, a key it
    cannot change refused): the dry run says that, once."""
    _earlier_run(tmp_path, {"config"})
    (line,) = _dry_run_lines(tmp_path, capsys, CLUSTER, DISABLE)
    assert line.startswith("ok   run_id: resumes the unfinished run in")
    assert "from its start (no checkpoint)" in line
    key = CHANGED.partition("=")[0]
    (refused,) = _dry_run_lines(tmp_path, capsys, CLUSTER, DISABLE, CHANGED, key=key)
    assert refused.startswith("FAIL actor_rollout_ref.rollout.n: 4, but run 'demo'")


@pytest.mark.parametrize("overrides", [[], [CLUSTER], [CLUSTER, DISABLE]])
def test_a_summary_cut_short_is_a_finished_run_to_the_decision(tmp_path, overrides):
    """The launcher looked for summary.json again once it had moved the run aside, to say how
    to go on from a finished run's policy: the decision says the run had finished, read or
    not, so the directory is read once."""
    _earlier_run(tmp_path, ALL)
    cfg = load_config(overrides=_overrides(tmp_path, *overrides))
    (cfg.run_dir / "summary.json").write_text('{"step": 20, "rea')
    decision = decide(cfg)
    assert (decision.finished, decision.summary) == (True, {}), decision.outcome


@pytest.mark.parametrize("overrides", [[], [CLUSTER]], ids=["embedded", "cluster"])
def test_a_summary_cut_short_reads_as_a_finished_run(tmp_path, capsys, overrides):
    """A trainer killed while it wrote summary.json (after its RunFinished) left it cut
    short: `asyncrl run` of the run stopped with a JSONDecodeError traceback, on the embedded
    broker after it had moved the run aside."""
    import io

    from rich.console import Console

    from asyncrl.launch.launcher import _launch, resume_or_set_aside

    _earlier_run(tmp_path, ALL)
    cfg = load_config(overrides=_overrides(tmp_path, *overrides))
    (cfg.run_dir / "summary.json").write_text('{"step": 20, "rea')
    (line,) = _dry_run_lines(tmp_path, capsys, *overrides)
    said = io.StringIO()
    console = Console(file=said, width=400)
    if overrides:
        assert "has finished (its summary.json does not read)" in line
        assert _launch(cfg, console, None) == {}
        assert "has finished (its summary.json does not read; " in said.getvalue()
    else:
        assert "aside to demo.<time> (it had finished) and starts afresh" in line
        assert resume_or_set_aside(cfg, console) is False
        assert "(it had finished) and starting afresh" in " ".join(said.getvalue().split())
        assert not cfg.run_dir.exists()


def test_resume_mode_disable_on_a_finished_cluster_run_does_not_advise_auto_to_resume_it(
    tmp_path, capsys
):
    """trainer.resume_mode=disable beside a finished run's checkpoints on a cluster is refused;
    the refusal said "or set trainer.resume_mode=auto to resume it", and with auto the launch
    says the run has finished and trains nothing."""
    import io

    from rich.console import Console

    from asyncrl.launch.launcher import _launch

    _earlier_run(tmp_path, ALL | {"summary"})
    key = "trainer.resume_mode"
    (line,) = _dry_run_lines(tmp_path, capsys, CLUSTER, DISABLE, key=key)
    assert line.startswith("FAIL trainer.resume_mode: disable, but")
    assert "to resume it" not in line and "another run_id=" in line
    assert "has finished, step 20: total_training_steps reached; auto trains nothing" in line
    said = io.StringIO()
    auto = load_config(overrides=_overrides(tmp_path, CLUSTER))
    assert _launch(auto, Console(file=said, width=400), None) == DONE
    assert "nothing to train" in said.getvalue()


def test_asyncrl_prepare_refuses_resume_mode_disable_beside_checkpoints_as_asyncrl_run_does(
    tmp_path, capsys
):
    """Role by role (`asyncrl prepare`, then `asyncrl train`, docs/cluster.md), with
    trainer.resume_mode=disable beside the checkpoints of a run whose log stays on the
    cluster, the set-up went on and the trainer resumed the run: the key neither did what
    verl's does (a fresh start) nor was refused, as `asyncrl run` refuses it."""
    from asyncrl.cli import main
    from asyncrl.launch.broker import free_port

    _earlier_run(tmp_path, ALL)
    where = _overrides(tmp_path, f"kafka.bootstrap_servers='127.0.0.1:{free_port()}'")
    setup = [*where, "kafka.broker_down_timeout_s=1", "sync.master_port=29500"]
    assert main(["prepare", *setup, DISABLE]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("asyncrl prepare: trainer.resume_mode: disable, but"), err
    assert "holds checkpoints of an earlier run" in err and "\n" not in err
