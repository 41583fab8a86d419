"""The workloads of ``asyncrl bench modes``: the sim engine's long-tail one, and the seed's.

``long-tail``: round numbers (``max_response_length=256``, 4 ms per decoding step,
one replica of 64 sequences per unit, 15 ms of training per sample), the structure of verl's
mode table at a size where one step is about a second.

``seed`` (default): verl's 128-GPU Qwen2.5-Math-7B table (seeds ``001``, H20, max response 28K
tokens, ``rollout.n=16``, 512 prompts per step), time-scaled by ``time_scale`` (0.01: the
seed's 356.3 s colocated step takes 3.56 s). Every modelled cost comes from a figure of the
seed; nothing is fitted to the speedups it reports, but the choice between the sim's two
engine models was made by comparing theirs with them (item 4):

1. Trainer, async (64 GPUs): ``step - gen`` of the 64:64 row, 150.63 - 33.14 = 117.49 s per
   512 samples (update_actor 113.16 s and 4.33 s of the rest of a step; old_log_prob is the
   rollout's, as in the seed).
2. Trainer, colocated (128 GPUs): ``step - gen`` of the colocated row, 356.30 - 177.85 =
   178.45 s per 512 samples (old_log_prob 53.92 + update_actor 113.81 + 10.72 s of the rest).
3. Rollout throughput of one unit (64 GPUs): 512 prompts x 16 in 150.72 s, the gen phase of
   the seed's 64-GPU colocated run (same model, data and lengths); the 64:64 run's rollouter,
   its bottleneck, delivered the same 512 every 150.63 s. So ``capacity`` tokens per
   ``decode_step_s`` make a step's expected tokens in 150.72 s.
4. The long tail: the 128-GPU colocated gen phase, 177.85 s, is 2.36x the throughput time of
   two units (75.36 s): the batch waits for its longest responses. The sim engine runs
   ``scheduling=fcfs`` (at most ``capacity`` sequences decode, the rest queue first come first
   served: vLLM when its KV cache bounds the batch, as 28K-token responses do), and
   ``capacity`` and ``decode_step_s`` are set so that a whole step's batch on two units (all
   submitted at once, as colocated verl does) takes 177.85 s. ``sim.scheduling=shared``
   (every sequence advances each step, a step slows above ``capacity``) is solved the same
   way; it was the default until 2026-11-24 and reproduces the seed's rows less well
   (docs/benchmarks.md).
5. Lengths: 28K tokens -> ``max_response_length=128``, the sim's long-tail shape with 2% of
   the responses at 80-100% of the maximum (a DAPO-like clip ratio: the long chains of
   thought), the rest exponential with mean 15% (4.3K of 28K tokens): 4.6K on average, and
   28% of the samples (16 responses each) holding a long one. The seed gives no length
   distribution; this share is the one choice not read from its figures (picked after a
   first run at the sim's default 10% showed that it decides modes b-d, before running 2%;
   the fit of items 3-4 follows any ``sim.long_tail_fraction`` given). Checked afterwards:
   mode (b), whose step is the window's tail, takes 285 s under ``fcfs`` (1.26x) and 265-273
   s under ``shared`` (1.29-1.33x) where the seed's takes 231.34 (1.58x; docs/benchmarks.md).
6. Batch structure as the seed's: ``require_batches=4``, ``trigger_parameter_sync_step=4``,
   ``staleness_threshold=0.5``, n=16, with 32 samples per step (512 / 16: mini-batches of 2).
"""

from __future__ import annotations

import heapq
import statistics
from dataclasses import dataclass, field

from asyncrl.config import RunConfig, load_config
from asyncrl.producers.engines.sim import target_length

Setup = tuple[int, int, float, bool]
"""(trigger_parameter_sync_step, require_batches, staleness_threshold, partial_rollout)"""

# The seed's 128-GPU 7B figures (seeds 001): row -> (s per step, total s at 400 steps).
SEED_ROWS: dict[str, tuple[float, float]] = {
    "colocated sync": (356.30, 40 * 3600 + 48 * 60),  # 1d 16h 48m
    "(b) stream off-policy": (231.34, 25 * 3600 + 53 * 60),  # 1d 1h 53m
    "(d) partial rollout": (150.63, 17 * 3600 + 22 * 60),  # 17h 22m
    "(d) staleness 0.1": (171.30, 19 * 3600 + 59 * 60),  # 19h 59m
    "(d) staleness 0.3": (146.11, 17 * 3600 + 20 * 60),  # 17h 20m
}
COLOCATED_GEN_S = 177.85
"""128-GPU colocated: the gen phase of a step (step 356.30 = gen + old_log_prob 53.92 +
update_actor 113.81 + 10.72 s of the rest)."""
ASYNC_GEN_S = 33.14
"""64:64, mode (d): the trainer's wait for samples per step (step 150.63, update 113.16)."""
UNIT_GEN_S = 150.72
"""64-GPU colocated: the gen phase of the same 512 x 16 batch, on one unit."""
STEP_SAMPLES = 512
SEED_UPDATE_S: dict[str, float] = {
    "(b) stream off-policy": 98.77,
    "(d) partial rollout": 113.16,
    "(d) staleness 0.1": 109.12,
    "(d) staleness 0.3": 103.22,
}
"""The async rows' update_actor per step, on the same 64 trainer GPUs: the one figure of each
run that measures how many tokens it trained (each run's responses grew as its policy did)."""


def seed_speedup(row: str) -> float | None:
    """The seed's speedup of ``row`` over colocated sync (400-step totals); None: not run."""
    if row not in SEED_ROWS:
        return None
    return SEED_ROWS["colocated sync"][1] / SEED_ROWS[row][1]


def seed_speedup_equal_tokens(row: str) -> float | None:
    """``seed_speedup`` with the row's run scaled to the tokens of the 64:64 mode (d) run, the
    one this workload models: its time times 113.16 / its update_actor. The stream run's
    updates took 98.77 s, so its responses were ~13% shorter, and its 1.58x is 1.38x at the
    modelled lengths. Colocated: 1.0; None: the seed has no such row."""
    if row == "colocated sync":
        return 1.0
    speedup = seed_speedup(row)
    if speedup is None or row not in SEED_UPDATE_S:
        return None
    ref = SEED_UPDATE_S["(d) partial rollout"]
    return speedup * SEED_UPDATE_S[row] / ref


@dataclass(frozen=True)
class Workload:
    name: str
    overrides: list[str]
    """Config of every setup (the user's overrides included, the fitted values last)."""
    batch: int
    """Samples per step: the colocated train_batch_size, one sync window of the async modes."""
    mini_batch: int
    """ppo_mini_batch_size (samples); a setup's local update is require_batches of them."""
    colocated_train_s_per_sample: float
    """Modelled colocated training time per sample (both units)."""
    setups: dict[str, Setup]
    ablation: dict[str, Setup] = field(default_factory=dict)
    time_scale: float | None = None
    """Seconds here per second of the seed (None: not seed-shaped)."""
    default_steps: int = 20
    notes: list[str] = field(default_factory=list)
    """How the model was derived, printed under the table."""


COMMON = [
    "actor_rollout_ref.rollout.name=sim",
    # Each setup sets its own; this one only lets a user's in_flight_update=true load (the
    # colocated baseline and the fit ignore both keys).
    "async_training.partial_rollout=true",
    "trainer.target_accuracy=null",
    "trainer.test_freq=0",
    "trainer.save_freq=0",
    "output_dir=runs/bench",
]
LONG_TAIL_BASE = [
    *COMMON,
    "data.max_response_length=256",
    "actor_rollout_ref.rollout.n=4",
    # 32 samples x 4 = 128 sequences may be in flight for a replica of 64: the engine queues
    # the rest, as vLLM does, so the budget, not this limit, decides how full it runs.
    "actor_rollout_ref.rollout.max_concurrent_samples=32",
    "sim.capacity=64",
    "sim.decode_step_s=0.004",
    "sim.train_s_per_sample=0.015",
]


def long_tail(overrides: list[str]) -> Workload:
    """32 samples per step, mini-batches of 8, trigger 4 (a window = 4 updates of 8)."""
    return Workload(
        name="long-tail",
        overrides=[*LONG_TAIL_BASE, *overrides],
        batch=32,
        mini_batch=8,
        colocated_train_s_per_sample=0.015 / 2,  # both units: half the time per sample
        setups={
            "(a) on-policy pipeline": (1, 4, 0.0, False),
            "(b) stream off-policy": (4, 1, 0.0, False),
            "(c) stale samples": (4, 1, 0.5, False),
            "(d) partial rollout": (4, 1, 0.5, True),
        },
        ablation={f"(d) staleness {s}": (4, 1, s, True) for s in (0.1, 0.3)},
    )


SEED_BATCH = 32
SEED_BASE = [
    *COMMON,
    "data.max_response_length=128",
    "actor_rollout_ref.rollout.n=16",
    # verl's rollouter allows 16 samples per server (64 of them here): the budget decides.
    f"actor_rollout_ref.rollout.max_concurrent_samples={2 * SEED_BATCH}",
    "sim.scheduling=fcfs",
    "sim.long_tail_fraction=0.02",
    "sim.short_mean_fraction=0.15",
]


def active_per_step(lengths: list[int]) -> list[int]:
    """Sequences active at each decoding step of a batch submitted at once, every one
    advancing each step (``scheduling=shared``): a response of length L is active L steps."""
    ordered = sorted(lengths)
    out, i = [], 0
    for step in range(1, ordered[-1] + 1):
        while ordered[i] < step:
            i += 1
        out.append(len(ordered) - i)
    return out


def shared_batch_steps(active: list[int], capacity: int) -> float:
    """A batch's time in units of ``decode_step_s`` under ``scheduling=shared``."""
    return sum(max(1.0, a / capacity) for a in active)


def fcfs_batch_steps(lengths: list[int], capacity: int) -> float:
    """A batch's time in units of ``decode_step_s`` under ``scheduling=fcfs``: ``capacity``
    slots, each sequence (in submission order) taking the first slot that frees up."""
    slots = [0] * min(capacity, len(lengths))
    for length in lengths:
        heapq.heappush(slots, heapq.heappop(slots) + length)
    return float(max(slots))


def batch_steps(lengths: list[int], capacity: int, scheduling: str) -> float:
    """A batch submitted at once, in units of ``decode_step_s``, under ``scheduling``."""
    if scheduling == "fcfs":
        return fcfs_batch_steps(lengths, capacity)
    return shared_batch_steps(active_per_step(lengths), capacity)


@dataclass(frozen=True)
class SeedFit:
    capacity: int
    decode_step_s: float
    step_tokens: float
    """Mean response tokens of a step (``batch x n`` responses)."""
    colocated_gen_s: float
    """Modelled gen phase of a colocated step (two units), scaled."""
    unit_gen_s: float
    """A step's tokens at one unit's full throughput, scaled."""


def fit_rollout(cfg: RunConfig, batch: int, time_scale: float, draws: int = 16) -> SeedFit:
    """``capacity`` and ``decode_step_s`` for items 3-4 of the module doc, on ``draws``
    batches of the configured length distribution (the requests' lengths are functions of
    their ids, so the fit is the same every time)."""
    n, max_len = cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length
    batches = [
        [
            target_length(f"fit-{k}-{i}#{j}", max_len, cfg.sim)
            for i in range(batch)
            for j in range(n)
        ]
        for k in range(draws)
    ]
    tokens = statistics.mean(sum(b) for b in batches)
    target = COLOCATED_GEN_S / UNIT_GEN_S
    scheduling = cfg.sim.scheduling

    def two_units(capacity: int) -> float:  # a batch on two units, in decoding steps
        return statistics.mean(batch_steps(b, 2 * capacity, scheduling) for b in batches)

    def ratio(capacity: int) -> float:  # colocated gen / unit throughput time: grows with it
        return two_units(capacity) * capacity / tokens

    lo, hi = 1, batch * n
    while lo < hi:  # the smallest capacity whose ratio reaches the seed's
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if ratio(mid) < target else (lo, mid)
    capacity = min((lo, max(lo - 1, 1)), key=lambda c: abs(ratio(c) - target))
    steps = two_units(capacity)
    step_s = COLOCATED_GEN_S * time_scale / steps
    return SeedFit(
        capacity=capacity,
        decode_step_s=step_s,
        step_tokens=tokens,
        colocated_gen_s=steps * step_s,
        unit_gen_s=tokens * step_s / capacity,
    )


def seed(config: str | None, overrides: list[str], time_scale: float = 0.01) -> Workload:
    """The seed-shaped workload (module doc), fitted to the configured length distribution."""
    b = SEED_BATCH
    base = [*SEED_BASE, *overrides]
    cfg = load_config(config, base)
    fit = fit_rollout(cfg, b, time_scale)
    scheduling = cfg.sim.scheduling
    async_train = (SEED_ROWS["(d) partial rollout"][0] - ASYNC_GEN_S) * time_scale / b
    colocated_train = (SEED_ROWS["colocated sync"][0] - COLOCATED_GEN_S) * time_scale / b
    fitted = [
        f"sim.capacity={fit.capacity}",
        f"sim.decode_step_s={fit.decode_step_s:.6g}",
        f"sim.train_s_per_sample={async_train:.6g}",
    ]
    s = time_scale
    notes = [
        f"seed-shaped: 1 s of the seed = {s:g} s here; {b} samples x n=16 per step "
        f"(512 x 16 in the seed), max_response_length 128 (28K)",
        f"rollout: capacity {fit.capacity} per unit, {fit.decode_step_s * 1e3:.2f} ms per "
        f"decoding step ({scheduling}): a step's {fit.step_tokens:.0f} tokens take "
        f"{fit.unit_gen_s / s:.1f} s on one unit at full throughput (seed: {UNIT_GEN_S}), "
        f"{fit.colocated_gen_s / s:.1f} s as one colocated batch on two (seed: {COLOCATED_GEN_S})",
        f"trainer: {async_train * b / s:.2f} s per step async (seed: 150.63 - {ASYNC_GEN_S}), "
        f"{colocated_train * b / s:.2f} s colocated (seed: 356.30 - {COLOCATED_GEN_S})",
    ]
    return Workload(
        name="seed",
        overrides=[*base, *fitted],
        batch=b,
        mini_batch=b // 16,  # require_batches 4 x trigger 4 mini-batches per step, as the seed's
        colocated_train_s_per_sample=colocated_train,
        setups={
            "(a) on-policy pipeline": (1, 16, 0.0, False),
            "(b) stream off-policy": (4, 4, 0.0, False),
            "(c) stale samples": (4, 4, 0.5, False),
            "(d) partial rollout": (4, 4, 0.5, True),
        },
        ablation={f"(d) staleness {x}": (4, 4, x, True) for x in (0.1, 0.3)},
        time_scale=s,
        default_steps=6,
        notes=notes,
    )
