"""The prompt feed is idempotent: set-up run again (a restarted ``asyncrl run`` with the same
run id, or a set-up interrupted half-way) never puts a prompt on the topic twice."""

from __future__ import annotations

from collections import Counter

import pytest

from asyncrl.kafka import Publisher
from asyncrl.kafka.records import read_records
from asyncrl.producers.feed import feed_prompts
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.prompt import TAG, decode_prompt

pytestmark = pytest.mark.kafka


def test_feeding_again_writes_only_the_prompts_not_there_yet(run_cfg):
    bootstrap = run_cfg.kafka.bootstrap_servers
    with Publisher(run_cfg.kafka, bootstrap) as pub:  # garbage is no prompt, and stays
        pub.publish(run_cfg.topic("prompts"), "junk", b"\x00junk", {SCHEMA_HEADER: TAG})
    run_cfg.data.train_size = 30  # 50 prompts span two epochs: prompt ids repeat
    assert feed_prompts(run_cfg, bootstrap, count=40) == (40, 0)
    assert feed_prompts(run_cfg, bootstrap, count=40) == (0, 40)  # a restart: nothing new
    assert feed_prompts(run_cfg, bootstrap, count=50) == (10, 40)  # a longer run: the rest

    records = list(read_records(run_cfg, bootstrap, "prompts"))
    assert len(records) == 51
    fed = [decode_prompt(r.value) for r in records if r.key != "junk"]
    assert len({p.sample_id for p in fed}) == 50
    assert Counter(p.epoch for p in fed) == {0: 30, 1: 20}


def test_a_long_feed_reports_its_progress(run_cfg, monkeypatch):
    """A long run's feed writes every step's prompts up front (320K for 20K steps: ~50 s on
    the 2-core machine), and ``asyncrl run`` said nothing until it was done; it reports as it
    writes, and reads back what is fed already, for the launcher's live line."""
    from asyncrl.kafka import records

    monkeypatch.setattr(records, "REPORT_EVERY", 10)
    run_cfg.data.train_size = 30
    told: list[tuple[str, int]] = []
    with records.reporting_progress(lambda what, n: told.append((what, n))):
        feed_prompts(run_cfg, run_cfg.kafka.bootstrap_servers, count=25)
        feed_prompts(run_cfg, run_cfg.kafka.bootstrap_servers, count=45)
    topic = run_cfg.topic("prompts")
    assert [n for what, n in told if what == f"feeding {topic}"] == [10, 20, 10, 20]
    assert any(what == f"reading {topic}" for what, _ in told)  # the second feed's check


def test_a_run_directory_that_never_held_the_run_is_refused_in_front_of_its_log(
    make_run_cfg, quick_policy
):
    """On a Kafka cluster a run's log outlives it. ``asyncrl run`` of the same run_id from
    another output_dir (or after deleting the run's directory) found no checkpoint, voided
    every step on the log, a finished run's too, and trained on its samples again from the
    first policy; the audit still read clean. It is refused before anything is written."""
    from io import StringIO

    from rich.console import Console

    from asyncrl.config import ConfigError, dump_config
    from asyncrl.launch.setup import prepare

    cfg = make_run_cfg(*quick_policy, "data.train_size=16", "data.val_size=8")
    bootstrap = cfg.kafka.bootstrap_servers
    from asyncrl.schemas.step import TAG as STEP_TAG
    from asyncrl.schemas.step import StepRecord, encode_step

    with Publisher(cfg.kafka, bootstrap) as pub:  # not a run's: the set-up goes on
        pub.publish(cfg.topic("samples"), "junk", b"replayed or planted")
        pub.publish(cfg.topic("steps"), "junk", b"not a step", {SCHEMA_HEADER: STEP_TAG})
    prepare(cfg.model_copy(deep=True), bootstrap, Console(file=StringIO()))
    (cfg.run_dir / "config.yaml").unlink()
    step = StepRecord(cfg.run_id, 3, 1, 0.0, [], [], [], {})
    with Publisher(cfg.kafka, bootstrap) as pub:  # what a trainer leaves on the log
        pub.publish(cfg.topic("steps"), "3", encode_step(step), {SCHEMA_HEADER: STEP_TAG})
    with pytest.raises(ConfigError, match=f"run_id={cfg.run_id}: .* trained to step 3"):
        prepare(cfg, bootstrap, Console(file=StringIO()))
    assert not (cfg.run_dir / "config.yaml").exists()
    dump_config(cfg, cfg.run_dir / "config.yaml")  # the directory that started it: resumes
    resolved, _ = prepare(cfg, bootstrap, Console(file=StringIO()))
    assert resolved.run_id == cfg.run_id


def test_the_trainer_feeds_a_long_run_as_it_trains(make_run_cfg, quick_policy):
    """A run longer than data.feed_ahead_steps gets its first steps' prompts from the set-up
    and the rest from its trainer, one step at a time: the same sequence, each prompt once.
    Fed all up front, a 20K-step run wrote 320K prompts (~50 s) before its first step."""
    import io

    from rich.console import Console

    from asyncrl.launch.launcher import run
    from asyncrl.producers.feed import first_feed, prompts_needed
    from tests.helpers import check_log_invariants, read_topic

    cfg = make_run_cfg(
        *quick_policy,
        "trainer.total_training_steps=6",
        "data.feed_ahead_steps=2",
        "trainer.test_freq=0",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    assert first_feed(cfg) < prompts_needed(cfg)
    out = io.StringIO()
    run(cfg, Console(file=out, width=200))
    assert "the trainer feeds the rest, 2 steps ahead" in out.getvalue()

    prompts = list(read_records(cfg, cfg.kafka.bootstrap_servers, "prompts"))
    fed = [decode_prompt(r.value) for r in prompts]
    assert len({p.sample_id for p in fed}) == len(fed) == prompts_needed(cfg, 6 - 1 + 2)
    first_step = min(r.value.ts for r in read_topic(cfg, "steps"))
    before = [r for r in prompts if r.timestamp_ms / 1000 <= first_step]
    assert len(before) == first_feed(cfg)  # the set-up's; the trainer's came after
    # the trainer's prompts continue the set-up's sequence: the feed a set-up alone writes
    cfg_all = cfg.model_copy(deep=True)
    cfg_all.data.feed_ahead_steps = 0
    from asyncrl.producers.feed import feed_sequence, train_prompts

    expected = list(feed_sequence(cfg_all, train_prompts(cfg_all)[0], 0, len(fed)))
    assert {p.sample_id for p in fed} == {p.sample_id for p in expected}
    check_log_invariants(cfg)


def test_a_run_reads_its_prompts_once_at_start_up(make_run_cfg, quick_policy, monkeypatch):
    """A run read its whole prompts topic twice before its first step: the set-up checked
    which prompts were fed, then the trainer's FeedAhead checked again (it feeds through a
    later step). Until a trainer has trained, the set-up checks and the trainer reads nothing
    back (a fresh run's trainer read the 16K prompts the set-up had just written); after, the
    set-up of a resumed run leaves the check to its trainer, which tops up the rest."""
    from io import StringIO

    from rich.console import Console

    from asyncrl.launch.setup import prepare
    from asyncrl.producers import feed

    cfg = make_run_cfg(
        *quick_policy,
        "trainer.total_training_steps=50",
        "data.feed_ahead_steps=2",
        "data.train_size=16",
        "data.val_size=8",
    )
    bootstrap = cfg.kafka.bootstrap_servers
    reads: list[int] = []
    read = feed.fed_sample_ids
    monkeypatch.setattr(feed, "fed_sample_ids", lambda *a: reads.append(1) or read(*a))
    prepare(cfg.model_copy(deep=True), bootstrap, Console(file=StringIO()))  # a fresh run
    first = feed.first_feed(cfg)
    assert len(reads) == 1 and len(list(read_records(cfg, bootstrap, "prompts"))) == first
    out = StringIO()
    prepare(cfg.model_copy(deep=True), bootstrap, Console(file=out, width=200))  # not trained
    assert reads == [1, 1] and f"({first} were there already" in out.getvalue()
    with Publisher(cfg.kafka, bootstrap) as pub:  # its trainer: no read, then its top-ups
        fresh = feed.FeedAhead(cfg, bootstrap, pub)
        assert fresh.through(0) == 0 and reads == [1, 1]
        assert fresh.through(1) == feed.prompts_needed(cfg, 1 + 2) - first
    fed = [decode_prompt(r.value).sample_id for r in read_records(cfg, bootstrap, "prompts")]
    assert len(fed) == len(set(fed)) == feed.prompts_needed(cfg, 1 + 2)

    with Publisher(cfg.kafka, bootstrap) as pub:  # a sample: a trainer has trained
        pub.publish(cfg.topic("samples"), "s", b"")
    out = StringIO()
    prepare(cfg.model_copy(deep=True), bootstrap, Console(file=out, width=200))  # resumed
    assert (
        reads == [1, 1]
        and f"{len(fed)} prompts on {cfg.topic('prompts')} already" in out.getvalue()
    )
    with Publisher(cfg.kafka, bootstrap) as pub:  # the resumed trainer, at its step 3
        assert feed.FeedAhead(cfg, bootstrap, pub).through(3) == (
            feed.prompts_needed(cfg, 3 + 2) - len(fed)
        )
    assert len(reads) == 3


def test_the_trainer_does_not_read_the_data_files_the_set_up_read(
    make_run_cfg, quick_policy, tmp_path, monkeypatch
):
    """A run on data.train_files read and tokenized every row twice at start: in its set-up,
    then in its trainer's first feed check (7-22 s at 100K rows, the workers waiting). The
    set-up saves its prompts in the run directory; the trainer's feed loads them, and tops up
    with the same sequence the files give."""
    from io import StringIO

    from rich.console import Console

    from asyncrl.launch.setup import prepare
    from asyncrl.producers import feed
    from asyncrl.tasks import files

    small = ("data.train_size=16", "data.val_size=8")
    data = files.export_task(make_run_cfg(*small, create_topics=False).data, tmp_path / "data")
    cfg = make_run_cfg(
        *quick_policy,
        f"data.train_files={data['train']}",
        f"data.val_files={data['val']}",
        "trainer.total_training_steps=50",
        "data.feed_ahead_steps=2",
    )
    bootstrap = cfg.kafka.bootstrap_servers
    prepare(cfg.model_copy(deep=True), bootstrap, Console(file=StringIO()))
    read: list[str] = []  # the files' rows read, then tokenized (the length filter)
    for name in ("read_rows", "filter_overlong"):
        real = getattr(files, name)
        monkeypatch.setattr(files, name, lambda *a, f=real, n=name: read.append(n) or f(*a))
    with Publisher(cfg.kafka, bootstrap) as pub:  # its trainer: no read, then its top-ups
        trainer = feed.FeedAhead(cfg, bootstrap, pub)
        assert trainer.through(0) == 0 and trainer.through(1) > 0
    assert read == []
    fed = {decode_prompt(r.value) for r in read_records(cfg, bootstrap, "prompts")}
    train, _ = feed.train_prompts(cfg)
    assert read == ["read_rows", "filter_overlong"]  # the seams count the read
    assert fed == set(feed.feed_sequence(cfg, train, 0, len(fed)))
