"""The dataset feed: writes the training prompts to the ``prompts`` topic, epoch after epoch.

The topic is the data loader: rollout workers share it as one consumer group, and its
committed offsets are the loader's position, so a restarted worker resumes where it stopped.

Feeding is idempotent: the feed is a fixed sequence (shuffled per epoch from the data seed),
and a prompt already on the topic (same prompt id and epoch, i.e. the same sample id) is not
written again. So ``asyncrl run`` started again with the same run id, or a set-up interrupted
half-way and run again, feeds each prompt once and never creates a second sample of it.
"""

from __future__ import annotations

import math
import random

from asyncrl.ops import tracing
from asyncrl.ops.config import RunConfig
from asyncrl.ops.kafka import Publisher
from asyncrl.schemas import SCHEMA_HEADER, DecodeError
from asyncrl.schemas.prompt import TAG, PromptRecord, decode_prompt, encode_prompt

FEED_MARGIN = 2
"""Times what the run consumes. Each worker fills its share of a version from the partitions
it owns, and owners change as workers come and go (3 workers on 4 partitions: the one with 2
partitions may have the smallest share); a tight feed let one worker run dry at the end while
prompts waited on another's partitions, and the last version never filled."""


def prompts_needed(cfg: RunConfig) -> int:
    """Prompts to feed: ``FEED_MARGIN`` times every step's, plus a version's budget per partition."""
    steps = cfg.trainer.total_training_steps * cfg.required_samples
    partitions = cfg.kafka.topics.partitions["prompts"]
    return FEED_MARGIN * steps + partitions * cfg.max_samples_per_version


def fed_sample_ids(cfg: RunConfig, bootstrap: str) -> set[str]:
    """Sample ids of the prompts already on the run's ``prompts`` topic (undecodable records,
    dead-lettered by the workers, are not prompts)."""
    from asyncrl.ops.inspect_log import read_records

    fed = set()
    for rec in read_records(cfg, bootstrap, "prompts"):
        try:
            fed.add(decode_prompt(rec.value, rec.headers).sample_id)
        except DecodeError:
            continue
    return fed


def feed_prompts(cfg: RunConfig, bootstrap: str, count: int | None = None) -> tuple[int, int]:
    """Make the first ``count`` prompts of the feed (default: prompts_needed) be on the topic,
    shuffled per epoch; returns (written now, already there)."""
    from asyncrl.tasks import splits

    train, _ = splits(cfg.data)
    count = prompts_needed(cfg) if count is None else count
    topic = cfg.topic("prompts")
    fed = fed_sample_ids(cfg, bootstrap)
    span = tracing.tracer().start_as_current_span(
        "feed prompts", attributes={"asyncrl.count": count}
    )
    with span, Publisher(cfg.kafka, bootstrap) as pub:
        written = present = 0
        for epoch in range(math.ceil(count / len(train))):
            order = list(train)
            random.Random(cfg.data.seed * 1_000_003 + epoch).shuffle(order)
            for problem in order[: count - written - present]:
                rec = PromptRecord(problem.prompt_id, problem.prompt, problem.answer, epoch)
                if rec.sample_id in fed:
                    present += 1
                    continue
                pub.publish(topic, rec.prompt_id, encode_prompt(rec), headers={SCHEMA_HEADER: TAG})
                written += 1
    return written, present
