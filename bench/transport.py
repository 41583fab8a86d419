"""``asyncrl bench transport``: what moving samples through Kafka costs, next to the alternatives.

A sample is one prompt's group of 16 trajectories (GRPO's n), each with L response tokens
(L = 1K, 8K, 32K) and their logprobs and mask: the unit a rollout worker publishes and the
trainer consumes. For each size, measured one after the other in this process:

- ``arrow + kafka``: our path: ``encode_sample`` (Arrow IPC) -> ``Publisher`` -> broker ->
  ``Reader`` with ``decode_sample``. The samples' token fields are numpy arrays, as a worker's
  trajectories hold them (it copies the engine's token lists into arrays once, when a
  trajectory finishes); ``decode_sample`` gives the trainer read-only numpy views of the
  message, which ``build_batch`` copies into the step's padded tensors.
- ``raw bytes + kafka``: confluent-kafka producing and consuming byte strings of exactly the
  Arrow messages' sizes, no encoding at all: the broker and client's own limit.
- ``ray queue + pickle``: verl's fully-async transport: a Ray actor queue to which the producer
  puts the group as a dict of torch tensors (serialized by Ray with cloudpickle) and from which
  the consumer gets it. Left out, with a note, when ray is not installed (``asyncrl[ray]``).

Each variant writes all N samples, then reads all N back (a trainer catching up with a burst),
timed end to end, its clients started before the clock: a Kafka variant first sends one message
through (the connections, the idempotent producer's id and the topic's metadata took 0.5-1 s on
Tansu: a long-lived worker's start-up, not its throughput), the Ray queue one group.
Encode/decode microseconds per sample are measured separately, without I/O;
bytes per token is the serialized size over the group's response tokens (raw payload: 4-byte
id + 4-byte logprob + 1-byte mask = 9 bytes per token).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig, load_config

GROUP = 16
SIZES = (1024, 8192, 32768)
SAMPLES = {1024: 1000, 8192: 160, 32768: 40}
"""Samples per size: about a second of each Kafka variant on a 2-core machine (more of Ray's),
about 190 MB of messages at 8K and 32K tokens."""
VARIANTS = ("arrow + kafka", "raw bytes + kafka", "ray queue + pickle")


def make_sample(tokens: int, index: int, rng: np.random.Generator) -> Any:
    """A finished sample of GROUP trajectories of ``tokens`` response tokens each, its token
    fields numpy arrays as a worker's trajectories hold them."""
    from asyncrl.schemas.sample import Sample, Trajectory

    trajectories = [
        Trajectory(
            response_ids=rng.integers(0, 32_000, tokens, dtype=np.int32),
            response_logprobs=(rng.random(tokens, dtype=np.float32) * -4),
            reward=float(rng.random() < 0.5),
            response_mask=np.ones(tokens, np.int8),
            segment_starts=[0],
            segment_versions=[0],
        )
        for _ in range(GROUP)
    ]
    return Sample(
        sample_id=f"bench-{tokens}-{index}",
        prompt_id=f"p{index}",
        worker_id=0,
        prompt_ids=rng.integers(0, 32_000, 64, dtype=np.int32),
        ground_truth="42",
        trajectories=trajectories,
    )


def as_tensors(sample: Any) -> dict[str, Any]:
    """The group as a verl-style dict of padded tensors (what a Ray queue would carry)."""
    import torch

    trajs = sample.trajectories
    return {
        "prompt_ids": torch.from_numpy(sample.prompt_ids.copy()),
        "response_ids": torch.from_numpy(np.stack([t.response_ids for t in trajs])),
        "logprobs": torch.from_numpy(np.stack([t.response_logprobs for t in trajs])),
        "mask": torch.from_numpy(np.stack([t.response_mask for t in trajs])),
        "rewards": torch.tensor([t.reward for t in trajs], dtype=torch.float32),
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

    tokens = len(samples[0].trajectories[0].response_ids)
    headers = {SCHEMA_HEADER: TAG}
    with (
        Reader(cfg.kafka, bootstrap, decode_sample) as reader,
        Publisher(cfg.kafka, bootstrap) as pub,
    ):

        def read() -> list[Any]:
            records = reader.poll(1.0)
            for rec in records:
                if len(rec.value.trajectories[0].response_ids) != tokens:
                    raise RuntimeError(f"{topic}: sample {rec.key} came back changed")
            return records

        reader.assign(topic, {0: 0})
        pub.publish(topic, "warm-up", encode_sample(samples[0]), headers=headers)
        pub.flush()
        _until(1, read, topic)  # started: see the module doc
        t0 = time.perf_counter()
        for s in samples:
            pub.publish(topic, s.sample_id, encode_sample(s), headers=headers)
        pub.flush()
        _until(len(samples), read, topic)
    return time.perf_counter() - t0


def _raw_kafka(cfg: RunConfig, bootstrap: str, topic: str, payloads: list[bytes]) -> float:
    from confluent_kafka import Consumer, Message, Producer, TopicPartition

    from asyncrl.kafka import consumer_config, producer_config

    consumer = Consumer(consumer_config(cfg.kafka, bootstrap, None))
    consumer.assign([TopicPartition(topic, 0, 0)])
    producer = Producer(producer_config(cfg.kafka, bootstrap))

    def produce(key: bytes, payload: bytes) -> None:
        while True:
            try:
                producer.produce(topic, value=payload, key=key)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)

    def flush() -> None:
        if producer.flush(60):
            raise RuntimeError(f"{topic}: messages left undelivered")

    def consume() -> list[Message]:
        first = consumer.poll(1.0)  # consume(n, t) alone would wait all of t for n
        if first is None:
            return []
        more = consumer.consume(num_messages=499, timeout=0)
        return [m for m in (first, *more) if m.error() is None and len(m.value() or b"") > 0]

    try:
        produce(b"warm-up", payloads[0])
        flush()
        _until(1, consume, topic)  # started: see the module doc
        t0 = time.perf_counter()
        for i, payload in enumerate(payloads):
            produce(str(i).encode(), payload)
        flush()
        _until(len(payloads), consume, topic)
    finally:
        consumer.close()
    return time.perf_counter() - t0


def _until(n: int, read: Callable[[], list[Any]], what: str, limit_s: float = 300.0) -> None:
    """Call ``read`` until it has returned ``n`` items in all."""
    t0, got = time.perf_counter(), 0
    while got < n:
        got += len(read())
        if time.perf_counter() - t0 > limit_s:
            raise TimeoutError(f"{what}: not done within {limit_s:.0f} s")


def _ray_queue(groups: list[dict[str, Any]]) -> float:
    from ray.util.queue import Queue

    queue = Queue(maxsize=0)
    queue.put(groups[0])  # started: see the module doc
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
            rng = np.random.default_rng(tokens)
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench transport``: its description (it takes no flags of its own)."""
    p.description = (
        "Samples/s, MB/s, encode/decode time and bytes per token of our Arrow samples through "
        "Kafka, next to raw byte strings and a Ray actor queue of pickled tensors."
    )


def main(args: argparse.Namespace, console: Console) -> None:
    transport(args.config, args.overrides, console)
