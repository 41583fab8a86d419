"""The colocated baseline's prompt order against the async run's feed, without a broker."""

from __future__ import annotations

import itertools

from asyncrl.config import RunConfig, load_config
from asyncrl.consumers.colocated import prompt_stream
from asyncrl.producers.feed import feed_sequence, train_prompts

N = 300  # past the first epoch of a 200-prompt split: the second epoch's shuffle counts too


def _first(cfg: RunConfig) -> tuple[list[str], list[str]]:
    """The first N prompt ids of the baseline and of the async run's feed."""
    train, _ = train_prompts(cfg)
    baseline = [p.prompt_id for p in itertools.islice(prompt_stream(cfg, train), N)]
    return baseline, [p.prompt_id for p in feed_sequence(cfg, train, 0, N)]


def test_the_baseline_trains_on_the_prompts_in_the_async_feeds_order():
    """The baseline shuffled by trainer.seed, the feed by data.seed: the same prompts in
    another order, noise in every side-by-side comparison of the two."""
    cfg = load_config(None, ["data.train_size=200", "trainer.seed=7"])
    baseline, fed = _first(cfg)
    assert baseline == fed
    other_trainer = load_config(None, ["data.train_size=200", "trainer.seed=8"])
    assert _first(other_trainer)[0] == baseline  # trainer.seed seeds the sampling, not the order
    other_data = load_config(None, ["data.train_size=200", "data.seed=1", "trainer.seed=7"])
    moved, fed_moved = _first(other_data)
    assert moved == fed_moved != baseline


def test_the_baseline_keeps_the_file_order_without_data_shuffle():
    cfg = load_config(None, ["data.train_size=200", "data.shuffle=false"])
    train, _ = train_prompts(cfg)
    baseline, fed = _first(cfg)
    assert baseline == fed == [p.prompt_id for p in train] + [p.prompt_id for p in train][:100]
