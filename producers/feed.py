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
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import TYPE_CHECKING

from asyncrl.config import RunConfig
from asyncrl.kafka import Publisher
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


def prompts_needed(cfg: RunConfig) -> int:
    """Prompts to feed: ``FEED_MARGIN`` times every step's, plus a version's budget per
    partition; with dynamic sampling, every step's times the batches it may read to fill
    (``algorithm.filter_groups.max_num_gen_batches``, or ``FILTER_FEED`` without a limit)."""
    steps = cfg.trainer.total_training_steps * cfg.required_samples
    fg = cfg.algorithm.filter_groups
    if fg.enable:
        steps *= fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else FILTER_FEED
    partitions = cfg.kafka.topics.partitions["prompts"]
    return FEED_MARGIN * steps + partitions * cfg.max_samples_per_version


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
    from asyncrl.tasks.files import load_split

    split = load_split(cfg, "train", load_tokenizer(cfg))
    return [row.record() for row in split.rows], split


def feed_prompts(
    cfg: RunConfig,
    bootstrap: str,
    count: int | None = None,
    train: list[PromptRecord] | None = None,
) -> tuple[int, int]:
    """Make the first ``count`` prompts of the feed (default: prompts_needed) be on the topic,
    shuffled per epoch (unless data.shuffle is false); returns (written now, already there).
    ``train``: the prompts of :func:`train_prompts`, if already read."""
    if train is None:
        train, _ = train_prompts(cfg)
    count = prompts_needed(cfg) if count is None else count
    topic = cfg.topic("prompts")
    fed = fed_sample_ids(cfg, bootstrap)
    span = tracing.tracer().start_as_current_span(
        "feed prompts", attributes={"asyncrl.count": count}
    )
    from asyncrl.kafka import records

    report = records.progress_reporter()
    with span, Publisher(cfg.kafka, bootstrap) as pub:
        written = present = 0
        for epoch in range(math.ceil(count / len(train))):
            order = list(train)
            if cfg.data.shuffle:
                random.Random(cfg.data.seed * 1_000_003 + epoch).shuffle(order)
            for prompt in order[: count - written - present]:
                rec = dataclasses.replace(prompt, epoch=epoch)
                if rec.sample_id in fed:
                    present += 1
                    continue
                pub.publish(topic, rec.prompt_id, encode_prompt(rec), headers={SCHEMA_HEADER: TAG})
                written += 1
                if report is not None and written % records.REPORT_EVERY == 0:
                    report(f"feeding {topic}", written)
    return written, present
