"""The dataset feed: writes the training prompts to the ``prompts`` topic, epoch after epoch.

The topic is the data loader: rollout workers share it as one consumer group, and its
committed offsets are the loader's position, so a restarted worker resumes where it stopped.

The prompts are data.task's built-in training problems, or the rows of ``data.train_files``
(verl's parquet format, ``asyncrl.tasks.files``) whose prompt fits ``data.max_prompt_length``
tokens after the chat template.

Feeding is idempotent: the feed is a fixed sequence (shuffled per epoch from the data seed),
and a prompt already on the topic (same prompt id and epoch, i.e. the same sample id) is not
written again. So ``asyncrl run`` started again with the same run id, or a set-up interrupted
half-way and run again, feeds each prompt once and never creates a second sample of it.

The set-up feeds ``data.feed_ahead_steps`` steps' worth; the trainer (:class:`FeedAhead`)
writes the rest of the same sequence as it trains, that many steps ahead of its step, rather
than all at once: a long run's prompts are millions of records, which would take a minute of
start-up at 20K steps, be held by the broker, and be restored at every resume.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher
from asyncrl.kafka.interfaces import Sink
from asyncrl.producers import prepared
from asyncrl.schemas import SCHEMA_HEADER, DecodeError
from asyncrl.schemas.prompt import TAG, PromptRecord, decode_prompt, encode_prompt
from asyncrl.telemetry import tracing

if TYPE_CHECKING:
    from asyncrl.tasks.files import Split

FEED_MARGIN = 2
"""Times what the run consumes. Each worker fills its share of a version from the partitions
it owns, and owners change as workers come and go (3 workers on 4 partitions: the one with 2
partitions may have the smallest share); a tight feed let one worker run dry at the end while
prompts waited on another's partitions, and the last version never filled."""


FILTER_FEED = 4
"""With dynamic sampling and no ``max_num_gen_batches``: each step may read this many batches'
worth of samples (the rest of a step's groups filtered) before the feed runs dry."""


def prompts_needed(cfg: RunConfig, through_step: int | None = None) -> int:
    """Prompts to feed for the steps up to ``through_step`` (default: every step of the run):
    ``FEED_MARGIN`` times their samples, plus a version's budget per partition; with dynamic
    sampling, their samples times the batches a step may read to fill
    (``algorithm.filter_groups.max_num_gen_batches``, or ``FILTER_FEED`` without a limit)."""
    total = cfg.trainer.total_training_steps
    steps = min(total, total if through_step is None else through_step) * cfg.required_samples
    fg = cfg.algorithm.filter_groups
    if fg.enable:
        steps *= fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else FILTER_FEED
    partitions = cfg.kafka.topics.partitions["prompts"]
    return FEED_MARGIN * steps + partitions * cfg.max_samples_per_version


def first_feed(cfg: RunConfig) -> int:
    """Prompts the set-up feeds: ``data.feed_ahead_steps`` steps' worth (0: all of them)."""
    ahead = cfg.data.feed_ahead_steps
    return prompts_needed(cfg, ahead or None)


def feeds_ahead(cfg: RunConfig) -> bool:
    """Whether the trainer feeds the rest: the set-up's feed stops short of the run's end."""
    return first_feed(cfg) < prompts_needed(cfg)


def fed_sample_ids(cfg: RunConfig, bootstrap: str) -> set[str]:
    """Sample ids of the prompts already on the run's ``prompts`` topic (undecodable records,
    dead-lettered by the workers, are not prompts)."""
    from asyncrl.kafka.records import read_records

    fed = set()
    for rec in read_records(cfg, bootstrap, "prompts"):
        try:
            fed.add(decode_prompt(rec.value, rec.headers).sample_id)
        except DecodeError:
            continue
    return fed


def train_prompts(cfg: RunConfig) -> tuple[list[PromptRecord], Split | None]:
    """One epoch of training prompts (epoch 0), in order; with data.train_files, also what
    was read (rows in the files, over-long prompts left out)."""
    if not cfg.data.from_files:
        from asyncrl.tasks import splits

        train, _ = splits(cfg.data)
        return [PromptRecord(p.prompt_id, p.prompt, p.answer) for p in train], None
    from asyncrl.models.policy import load_tokenizer
    from asyncrl.producers.agent.data import load_split

    split = load_split(cfg, "train", load_tokenizer(cfg))
    return [row.record() for row in split.rows], split


def set_up_prompts(cfg: RunConfig) -> tuple[list[PromptRecord], prepared.Read | None]:
    """:func:`train_prompts` as the set-up gets them, with what the read counted (None: no
    data files). A resumed run's set-up loads those an earlier set-up of the run saved
    (``asyncrl.producers.prepared``), when they are current: the files' bytes are hashed,
    not parsed, checked and tokenized again (10 s at 100K rows on two cores). Otherwise read
    from the files and saved, for the trainer's feed and the next resume."""
    if (saved := prepared.load_read(cfg)) is not None:
        return saved
    train, split = train_prompts(cfg)
    if split is None:
        return train, None
    read = prepared.Read(split.total, split.too_long)
    prepared.save(cfg, train, read)
    return train, read


def trainer_prompts(cfg: RunConfig) -> list[PromptRecord]:
    """:func:`train_prompts` as the trainer's feed gets them: the set-up's, saved in the run
    directory (``asyncrl.producers.prepared``), when they are there and current, else read
    again (the data files read and tokenized a second time: 7-22 s at 100K rows)."""
    saved = prepared.load(cfg)
    return saved if saved is not None else train_prompts(cfg)[0]


def feed_sequence(
    cfg: RunConfig, train: list[PromptRecord], start: int = 0, stop: int | None = None
) -> Iterator[PromptRecord]:
    """Prompts ``start`` to ``stop`` (None: endless) of the feed: epoch after epoch of
    ``train``, each epoch shuffled from the data seed (unless data.shuffle is false), as
    verl's sampler shuffles by data.seed. The colocated baseline draws this order too."""
    per_epoch = len(train)
    begin = start // per_epoch
    epochs = itertools.count(begin) if stop is None else range(begin, math.ceil(stop / per_epoch))
    for epoch in epochs:
        order = list(train)
        if cfg.data.shuffle:
            random.Random(cfg.data.seed * 1_000_003 + epoch).shuffle(order)
        first = epoch * per_epoch
        end = None if stop is None else stop - first
        for prompt in order[max(start - first, 0) : end]:
            yield dataclasses.replace(prompt, epoch=epoch)


def _publish(pub: Sink, topic: str, rec: PromptRecord) -> None:
    pub.publish(topic, rec.prompt_id, encode_prompt(rec), headers={SCHEMA_HEADER: TAG})


def feed_prompts(
    cfg: RunConfig,
    bootstrap: str,
    count: int | None = None,
    train: list[PromptRecord] | None = None,
) -> tuple[int, int]:
    """Make the first ``count`` prompts of the feed (default: :func:`first_feed`) be on the
    topic; returns (written now, already there). ``train``: the prompts of
    :func:`train_prompts`, if already read."""
    if train is None:
        train, _ = train_prompts(cfg)
    count = first_feed(cfg) if count is None else count
    topic = cfg.topic("prompts")
    fed = fed_sample_ids(cfg, bootstrap)
    span = tracing.tracer().start_as_current_span(
        "feed prompts", attributes={"asyncrl.count": count}
    )
    from asyncrl.kafka.records import progress_counter

    counted = progress_counter(f"feeding {topic}")
    with span, Publisher(cfg.kafka, bootstrap) as pub:
        written = present = 0
        for rec in feed_sequence(cfg, train, 0, count):
            if rec.sample_id in fed:
                present += 1
                continue
            _publish(pub, topic, rec)
            written += 1
            counted(written)
    return written, present


class FeedAhead:
    """The trainer's part of the feed: before each step it makes the feed reach
    ``data.feed_ahead_steps`` steps past that step, writing the rest of the set-up's
    sequence through the trainer's own producer.

    A started (or restarted) trainer first checks the topic as the set-up does (a trainer
    that died half-way through a top-up left some of it), then keeps count. On a resumed run
    that has trained this is the only check (the set-up leaves it to the trainer:
    ``launch.setup.prepare``); on a run no trainer has trained yet the set-up has just
    checked and fed, and the trainer reads nothing back (:meth:`_only_the_set_ups`). A run
    whose topic holds no prompt at all is fed by no one (a trainer of a replayed stream of
    samples)."""

    def __init__(self, cfg: RunConfig, bootstrap: str, publisher: Sink) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.publisher = publisher
        self.topic = cfg.topic("prompts")
        self.fed: int | None = None
        """Prompts of the sequence known to be on the topic (None: not checked yet)."""
        self._train: list[PromptRecord] = []

    def through(self, step: int) -> int:
        """Feed the prompts up to ``step`` + ``data.feed_ahead_steps``; returns how many
        this call wrote."""
        target = prompts_needed(self.cfg, step + self.cfg.data.feed_ahead_steps)
        if self.fed is None:
            from asyncrl.kafka import count_records

            on_topic = count_records(self.cfg.kafka, self.bootstrap, self.topic)
            if not on_topic:
                self.fed = prompts_needed(self.cfg)  # never prepared: nothing to feed
                return 0
            self._train = trainer_prompts(self.cfg)
            if self._only_the_set_ups(on_topic):
                self.fed = on_topic
            else:
                written, _present = feed_prompts(self.cfg, self.bootstrap, target, self._train)
                self.fed = target
                return written
        if target <= self.fed:
            return 0
        for rec in feed_sequence(self.cfg, self._train, self.fed, target):
            _publish(self.publisher, self.topic, rec)
        written, self.fed = target - self.fed, target
        return written

    def _only_the_set_ups(self, on_topic: int) -> bool:
        """Whether the topic holds the set-up's feed and nothing else, so the check need not
        read it (reading back the 16K prompts the set-up has just written costs a fresh run's
        trainer 1.3-2.5 s on two cores; a million at a verl-sized batch). True when it holds
        :func:`first_feed` records and the samples topic none: no trainer has trained a step,
        so none topped the feed up (a top-up follows a step), and the set-up fed all of it
        with this config (it leaves the check to the trainer only once samples exist)."""
        from asyncrl.kafka import count_records

        samples = self.cfg.topic("samples")
        return on_topic == first_feed(self.cfg) and not count_records(
            self.cfg.kafka, self.bootstrap, samples
        )
