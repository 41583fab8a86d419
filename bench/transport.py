"""``asyncrl bench transport``: what moving samples through Kafka costs, next to the alternatives.

A sample is one prompt's group of 16 trajectories (GRPO's n), each with L response tokens
(L = 1K, 8K, 32K) and their logprobs and mask: the unit a rollout worker publishes and the
trainer consumes. For each size, measured one after the other in this process:

- ``arrow + kafka``: our path: ``encode_sample`` (Arrow IPC) -> ``Publisher`` -> broker ->
  ``Reader`` with ``decode_sample``.
- ``raw bytes + kafka``: confluent-kafka producing and consuming byte strings of exactly the
  Arrow messages' sizes, no encoding at all: the broker and client's own limit.
- ``ray queue + pickle``: verl's fully-async transport: a Ray actor queue to which the producer
  puts the group as a dict of torch tensors (serialized by Ray with cloudpickle) and from which
  the consumer gets it. Left out, with a note, when ray is not installed (``asyncrl[ray]``).

Each variant writes all N samples, then reads all N back (a trainer catching up with a burst),
timed end to end. Encode/decode microseconds per sample are measured separately, without I/O;
bytes per token is the serialized size over the group's response tokens (raw payload: 4-byte
id + 4-byte logprob + 1-byte mask = 9 bytes per token).
"""

from __future__ import annotations

import json
import pickle
import random
import statistics
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig, load_config

GROUP = 16
SIZES = (1024, 8192, 32768)
SAMPLES = {1024: 200, 8192: 40, 32768: 12}
"""Samples per size: a few seconds of each variant on a 2-core machine."""
VARIANTS = ("arrow + kafka", "raw bytes + kafka", "ray queue + pickle")


def make_sample(tokens: int, index: int, rng: random.Random) -> Any:
    """A finished sample of GROUP trajectories of ``tokens`` response tokens each."""
    from asyncrl.schemas.sample import Sample, Trajectory

    trajectories = [
        Trajectory(
            response_ids=[rng.randrange(32_000) for _ in range(tokens)],
            response_logprobs=[-rng.random() * 4 for _ in range(tokens)],
            reward=float(rng.random() < 0.5),
            response_mask=[1] * tokens,
            segment_starts=[0],
            segment_versions=[0],
        )
        for _ in range(GROUP)
    ]
    return Sample(
        sample_id=f"bench-{tokens}-{index}",
        prompt_id=f"p{index}",
        worker_id=0,
        prompt_ids=[rng.randrange(32_000) for _ in range(64)],
        ground_truth="42",
        trajectories=trajectories,
    )


def as_tensors(sample: Any) -> dict[str, Any]:
    """The group as a verl-style dict of padded tensors (what a Ray queue would carry)."""
    import torch

    return {
        "prompt_ids": torch.tensor(sample.prompt_ids, dtype=torch.int32),
        "response_ids": torch.tensor(
            [t.response_ids for t in sample.trajectories], dtype=torch.int32
        ),
        "logprobs": torch.tensor(
            [t.response_logprobs for t in sample.trajectories], dtype=torch.float32
        ),
        "mask": torch.tensor([t.response_mask for t in sample.trajectories], dtype=torch.int8),
        "rewards": torch.tensor([t.reward for t in sample.trajectories], dtype=torch.float32),
        "sample_id": sample.sample_id,
    }


def _per_sample_us(fn, items: list[Any]) -> float:
    t0 = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - t0) / len(items) * 1e6


def _arrow_kafka(cfg: RunConfig, bootstrap: str, topic: str, samples: list[Any]) -> float:
    from asyncrl.kafka import Publisher, Reader
    from asyncrl.schemas import SCHEMA_HEADER
    from asyncrl.schemas.sample import TAG, decode_sample, encode_sample

    with Reader(cfg.kafka, bootstrap, decode_sample) as reader:
        reader.assign(topic, {0: 0})
        reader.poll(0.5)  # connected and fetching before the clock starts
        t0 = time.perf_counter()
        with Publisher(cfg.kafka, bootstrap) as pub:
            for s in samples:
                pub.publish(topic, s.sample_id, encode_sample(s), headers={SCHEMA_HEADER: TAG})
        got = 0
        while got < len(samples):
            for rec in reader.poll(1.0):
                if len(rec.value.trajectories[0].response_ids) != len(
                    samples[0].trajectories[0].response_ids
                ):
                    raise RuntimeError(f"{topic}: sample {rec.key} came back changed")
                got += 1
            _deadline(t0, topic)
    return time.perf_counter() - t0


def _raw_kafka(cfg: RunConfig, bootstrap: str, topic: str, payloads: list[bytes]) -> float:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from asyncrl.kafka import consumer_config, producer_config

    consumer = Consumer(consumer_config(cfg.kafka, bootstrap, None))
    consumer.assign([TopicPartition(topic, 0, 0)])
    consumer.consume(num_messages=1, timeout=0.5)  # connected before the clock starts
    producer = Producer(producer_config(cfg.kafka, bootstrap))
    t0 = time.perf_counter()
    for i, payload in enumerate(payloads):
        while True:
            try:
                producer.produce(topic, value=payload, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"{topic}: messages left undelivered")
    got = 0
    try:
        while got < len(payloads):
            first = consumer.poll(1.0)  # consume(n, t) alone would wait all of t for n
            more = consumer.consume(num_messages=499, timeout=0) if first is not None else []
            for msg in [first, *more] if first is not None else []:
                if msg.error() is None and len(msg.value() or b"") > 0:
                    got += 1
            _deadline(t0, topic)
    finally:
        consumer.close()
    return time.perf_counter() - t0


def _ray_queue(groups: list[dict[str, Any]]) -> float:
    from ray.util.queue import Queue

    queue = Queue(maxsize=0)
    queue.put(0)  # the queue actor is up before the clock starts
    queue.get(timeout=60)
    t0 = time.perf_counter()
    for g in groups:
        queue.put(g)
    for _ in groups:
        got = queue.get(timeout=120)
        if got["response_ids"].shape != groups[0]["response_ids"].shape:
            raise RuntimeError("ray queue: a group came back changed")
    elapsed = time.perf_counter() - t0
    queue.shutdown()
    return elapsed


def _deadline(t0: float, what: str, limit_s: float = 300.0) -> None:
    if time.perf_counter() - t0 > limit_s:
        raise TimeoutError(f"{what}: not done within {limit_s:.0f} s")


def transport(
    config: str | None,
    overrides: list[str],
    console: Console,
    sizes: tuple[int, ...] = SIZES,
    samples: dict[int, int] | None = None,
) -> dict[str, Any]:
    """Measure every variant at every size; print one table and return the figures."""
    from asyncrl.kafka.topics import create_topics
    from asyncrl.launch.broker import ensure_broker
    from asyncrl.schemas.sample import decode_sample, encode_sample

    cfg = load_config(config, overrides)
    counts = {**SAMPLES, **(samples or {})}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    ray: ModuleType | None
    try:
        import ray
    except ImportError:
        ray = None
        console.print("ray not installed: pip install 'asyncrl[ray]' for the Ray queue column")
    bootstrap, broker = ensure_broker(cfg.kafka)
    results: dict[str, dict[str, Any]] = {}
    try:
        if ray is not None:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        for tokens in sizes:
            n = counts[tokens]
            console.rule(f"{GROUP} x {tokens} tokens, {n} samples")
            rng = random.Random(tokens)
            batch = [make_sample(tokens, i, rng) for i in range(n)]
            encoded = [encode_sample(s) for s in batch]
            group_tokens = GROUP * tokens
            wire = statistics.mean(len(e) for e in encoded)
            row: dict[str, Any] = {"samples": n, "bytes_per_sample": wire}
            topics = {v: f"bench-transport-{stamp}-{tokens}-{i}" for i, v in enumerate(VARIANTS)}
            create_topics(cfg, bootstrap, {t: 1 for t in list(topics.values())[:2]})

            console.log("arrow + kafka")
            s = _arrow_kafka(cfg, bootstrap, topics["arrow + kafka"], batch)
            row["arrow + kafka"] = _figures(
                n,
                s,
                wire,
                encode_us=_per_sample_us(encode_sample, batch[:20]),
                decode_us=_per_sample_us(lambda e: decode_sample(e, None), encoded[:20]),
                bytes_per_token=wire / group_tokens,
            )
            console.log("raw bytes + kafka")
            s = _raw_kafka(cfg, bootstrap, topics["raw bytes + kafka"], encoded)
            row["raw bytes + kafka"] = _figures(n, s, wire, 0.0, 0.0, wire / group_tokens)
            if ray is not None:
                console.log("ray queue + pickle")
                groups = [as_tensors(x) for x in batch]
                pickled = [pickle.dumps(g) for g in groups[:20]]
                s = _ray_queue(groups)
                row["ray queue + pickle"] = _figures(
                    n,
                    s,
                    statistics.mean(len(p) for p in pickled),
                    # building the tensors is part of the sender's encode, as Arrow's is
                    encode_us=_per_sample_us(lambda x: pickle.dumps(as_tensors(x)), batch[:20]),
                    decode_us=_per_sample_us(pickle.loads, pickled),
                    bytes_per_token=statistics.mean(len(p) for p in pickled) / group_tokens,
                )
            results[str(tokens)] = row
    finally:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        if broker is not None:
            broker.stop()

    _print(results, console)
    out = Path(cfg.output_dir) / f"bench-transport-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    console.print(f"figures: {out}")
    return results


def _figures(
    n: int, seconds: float, size: float, encode_us: float, decode_us: float, bytes_per_token: float
) -> dict[str, float]:
    return {
        "seconds": seconds,
        "samples_per_s": n / seconds,
        "mb_per_s": n * size / seconds / 1e6,
        "encode_us": encode_us,
        "decode_us": decode_us,
        "bytes_per_token": bytes_per_token,
    }


def _print(results: dict[str, dict[str, Any]], console: Console) -> None:
    table = Table(title=f"samples of {GROUP} trajectories: write N, read N back")
    for col in ("tokens", "way", "samples/s", "MB/s", "encode us", "decode us", "bytes/token"):
        table.add_column(col, justify="right")
    for tokens, row in results.items():
        for v in VARIANTS:
            if v not in row:
                continue
            f = row[v]
            table.add_row(
                tokens,
                v,
                f"{f['samples_per_s']:.1f}",
                f"{f['mb_per_s']:.0f}",
                f"{f['encode_us']:.0f}" if f["encode_us"] else "-",
                f"{f['decode_us']:.0f}" if f["decode_us"] else "-",
                f"{f['bytes_per_token']:.2f}",
            )
    console.print(table)
    for tokens, row in results.items():
        arrow = row["arrow + kafka"]["samples_per_s"]
        line = f"{tokens} tokens: arrow+kafka / raw kafka = {arrow / row['raw bytes + kafka']['samples_per_s']:.2f}"
        if "ray queue + pickle" in row:
            line += f", arrow+kafka / ray queue = {arrow / row['ray queue + pickle']['samples_per_s']:.2f}"
        console.print(line)
