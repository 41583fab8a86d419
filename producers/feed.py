"""The dataset feed: writes the training prompts to the ``prompts`` topic, epoch after epoch.

The topic is the data loader: rollout workers share it as one consumer group, and its
committed offsets are the loader's position, so a restarted worker resumes where it stopped.
"""

from __future__ import annotations

import math
import random

from asyncrl.ops import tracing
from asyncrl.ops.config import RunConfig
from asyncrl.ops.kafka import Publisher
from asyncrl.schemas import SCHEMA_HEADER
from asyncrl.schemas.prompt import TAG, PromptRecord, encode_prompt

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


def feed_prompts(cfg: RunConfig, bootstrap: str, count: int | None = None) -> int:
    """Publish ``count`` prompts (default: prompts_needed), shuffled per epoch; returns count."""
    from asyncrl.tasks import splits

    train, _ = splits(cfg.data)
    count = prompts_needed(cfg) if count is None else count
    topic = cfg.topic("prompts")
    span = tracing.tracer().start_as_current_span(
        "feed prompts", attributes={"asyncrl.count": count}
    )
    with span, Publisher(cfg.kafka, bootstrap) as pub:
        written = 0
        for epoch in range(math.ceil(count / len(train))):
            order = list(train)
            random.Random(cfg.data.seed * 1_000_003 + epoch).shuffle(order)
            for problem in order[: count - written]:
                rec = PromptRecord(problem.prompt_id, problem.prompt, problem.answer, epoch)
                pub.publish(topic, rec.prompt_id, encode_prompt(rec), headers={SCHEMA_HEADER: TAG})
                written += 1
    return written
