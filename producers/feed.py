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


def prompts_needed(cfg: RunConfig) -> int:
    """Enough prompts for every step, plus one version's full budget of look-ahead."""
    return cfg.trainer.total_training_steps * cfg.required_samples + cfg.max_samples_per_version


def feed_prompts(cfg: RunConfig, bootstrap: str, count: int | None = None) -> int:
    """Publish ``count`` prompts (default: prompts_needed), shuffled per epoch; returns count."""
    from asyncrl.tasks.arithmetic import make_splits

    train, _ = make_splits(cfg.data)
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
