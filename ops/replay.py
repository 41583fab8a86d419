"""``asyncrl replay step N``: re-run one training step from the log and its checkpoint.

The step's record on ``steps`` says exactly which samples (partition, offset) formed its batch;
the checkpoint of step N-1 holds the model and optimizer it started from. Re-running the
update on those samples must reproduce the recorded loss and grad norm and, on CPU with the
trainer's thread count, the checkpoint of step N bit for bit. Overrides (learning rate, clip
ratio, loss aggregation, ...) re-run the same step with other settings and show what changes:
the debugging loop for "why did the loss spike at step 812?". The step record also carries the
checksum of the weights the step started from, so a replay knows it starts from the right state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from asyncrl.config import RunConfig
from asyncrl.kafka.records import read_records
from asyncrl.schemas.sample import Sample, decode_sample
from asyncrl.schemas.step import StepRecord, decode_step

COMPARED = ("actor/lr", "actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl")
OFFPOLICY_COMPARED = (
    "rollout_corr/kl",
    "rollout_corr/rollout_is_mean",
    "rollout_corr/rollout_rs_masked_fraction",
    "fully_async/stale_tokens/masked_ratio",
)
"""Compared too when the step recorded them (its off-policy options were on)."""


class ReplayError(RuntimeError):
    pass


def _ckpt(cfg: RunConfig, step: int) -> Path:
    from asyncrl.consumers.checkpoint import checkpoint_dir

    return checkpoint_dir(cfg.run_dir, step)


STEP_READS = ("steps", "samples")
"""The run topics ``replay_step`` reads: all an archived log's broker needs restored."""


def find_step(cfg: RunConfig, bootstrap: str, step: int) -> StepRecord:
    """The standing record of ``step``: the last one on the log. A trainer restarted from an
    earlier checkpoint writes the step again, and its record (and checkpoint) replace the
    void one of the trainer that died (TrainerResumed)."""
    found = None
    numbers = set()
    for rec in read_records(cfg, bootstrap, "steps"):
        record = decode_step(rec.value, rec.headers)
        numbers.add(record.step)
        if record.step == step:
            found = record
    if found is None:
        held = f"steps {min(numbers)}-{max(numbers)}" if numbers else "no step yet"
        raise ReplayError(f"step {step} is not on {cfg.topic('steps')} (it holds {held})")
    return found


def fetch_samples(cfg: RunConfig, bootstrap: str, record: StepRecord) -> list[Sample]:
    """The step's samples, in the order of its batch, read at their recorded offsets."""
    wanted = set(zip(record.partitions, record.offsets, strict=True))
    found: dict[tuple[int, int], Sample] = {}
    start = min(record.offsets)
    for rec in read_records(cfg, bootstrap, "samples", start, max(record.offsets) + 1):
        if (rec.partition, rec.offset) in wanted:
            found[(rec.partition, rec.offset)] = decode_sample(rec.value, rec.headers)
    missing = wanted - set(found)
    if missing:
        raise ReplayError(f"samples of step {record.step} missing from the log: {sorted(missing)}")
    samples = [found[key] for key in zip(record.partitions, record.offsets, strict=True)]
    if [s.sample_id for s in samples] != record.sample_ids:
        raise ReplayError(f"step {record.step}: the samples at the recorded offsets differ")
    return samples


def _recorded(cfg: RunConfig) -> RunConfig | None:
    """The run's own config (its saved config.yaml), without the replay's overrides; None
    where the run has none."""
    from asyncrl.config import load_config

    saved = cfg.run_dir / "config.yaml"
    return load_config(saved) if saved.exists() else None


def _recorded_lr(cfg: RunConfig, run: RunConfig | None, record: StepRecord) -> float | None:
    """The rate the step ran at (its ``actor/lr``) where the replay's rate settings are the
    run's own (``run``, its saved config), else None: the replay's schedule. A run
    resumed with another ``trainer.total_training_steps`` ran its earlier steps on another
    cosine or warm-up schedule than its saved config gives, and their replay differed in the
    weights with nothing changed."""
    lr = record.metrics.get("actor/lr")
    if lr is None or run is None:
        return None
    same = (
        run.actor_rollout_ref.actor.optim == cfg.actor_rollout_ref.actor.optim
        and run.trainer.total_training_steps == cfg.trainer.total_training_steps
    )
    return lr if same else None


def _run_policy(cfg: RunConfig, run: RunConfig | None) -> RunConfig:
    """``cfg`` building the run's own policy: the fields of the warm start's cache key
    (``actor_rollout_ref.model.*``, ``data.*``) the run's (``run``), where it is kept
    (``model.cache_dir``, ``model.path``, ...) the replay's. Its trainer's first policy, the
    reference of ``actor.use_kl_loss`` and step 1's start, came from them, which a run keeps
    for its life (``launch/resume_check.FIXED``): a ``data.*`` override, which a replay warns
    changes nothing, warm-started another policy for them."""
    from asyncrl.models.cache import NOT_IN_CACHE_KEY

    if run is None:
        return cfg
    model = cfg.actor_rollout_ref.model.model_copy(
        update={k: v for k, v in run.actor_rollout_ref.model if k not in NOT_IN_CACHE_KEY["model"]}
    )
    data = cfg.data.model_copy(
        update={k: v for k, v in run.data if k not in NOT_IN_CACHE_KEY["data"]}
    )
    actor_rollout_ref = cfg.actor_rollout_ref.model_copy(update={"model": model})
    return cfg.model_copy(update={"actor_rollout_ref": actor_rollout_ref, "data": data})


def replay_step(
    cfg: RunConfig, bootstrap: str, step: int, console: Console, ranks: int | None = None
) -> dict[str, Any]:
    """Re-run ``step`` with ``cfg``'s settings on ``ranks`` trainer ranks (None: as many as
    ran it, which its checkpoint records); print and return recorded vs replayed."""
    from asyncrl.consumers.checkpoint import load_checkpoint
    from asyncrl.consumers.schedule import set_step_lr
    from asyncrl.consumers.update import grpo_update, reference_policy
    from asyncrl.models.warm_start import load_policy
    from asyncrl.sync.checksum import weights_checksum

    record = find_step(cfg, bootstrap, step)
    samples = fetch_samples(cfg, bootstrap, record)
    before = _ckpt(cfg, step - 1)
    if step > 1 and not before.exists():
        raise ReplayError(
            f"no checkpoint of step {step - 1} in {before.parent}: replaying step {step} needs "
            "the state it started from (run with trainer.save_freq=1 and keep_checkpoints large "
            "enough)"
        )
    torch.set_num_threads(cfg.trainer.torch_threads)
    run = _recorded(cfg)
    policy_cfg = _run_policy(cfg, run)
    # Step 1 starts from the warm start; a later one from its checkpoint, loaded over the model
    model, tokenizer = load_policy(policy_cfg, warm=step == 1)
    # actor.use_kl_loss: the trainer's first policy (step 1's start, copied before it trains)
    ref_model = reference_policy(
        policy_cfg, torch.device("cpu"), start=model if step == 1 else None
    )
    optim = cfg.actor_rollout_ref.actor.optim
    optimizer = torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay)
    if step > 1:
        try:
            load_checkpoint(before, model, optimizer)
        except RuntimeError as err:  # another model (model.path, override_config): 40 lines
            first = str(err).strip().splitlines()[:2]
            raise ReplayError(
                f"the checkpoint of step {step - 1} does not load into the model these settings "
                f"build ({' '.join(line.strip() for line in first)}): is this the run's own "
                "config, with its actor_rollout_ref.model.*?"
            ) from None
        for group in optimizer.param_groups:  # the replay's settings, not the checkpoint's
            group["weight_decay"] = optim.weight_decay
    set_step_lr(optimizer, optim, step, cfg.trainer.total_training_steps)  # the step's rate
    recorded_lr = _recorded_lr(cfg, run, record)
    if recorded_lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = recorded_lr
    recorded = record.weights_checksum
    if recorded and weights_checksum(model, like=recorded) != recorded:
        raise ReplayError(
            f"the weights loaded for step {step} differ from those it started from (checksum "
            f"recorded on {cfg.topic('steps')}): is this the run's own config and run_dir?"
        )
    ran_on = _ranks_of(cfg, step)
    ranks = ranks or ran_on
    if ranks > 1:  # spawned ranks, each its shard (the weights above: the checksum's)
        from asyncrl.ops.replay_sharded import replay_on_ranks

        replayed, current = replay_on_ranks(
            cfg, policy_cfg, step, record.version, samples, ranks, recorded_lr
        )
    else:
        model.train()
        replayed = grpo_update(
            model,
            optimizer,
            samples,
            cfg,
            torch.device("cpu"),
            tokenizer.pad_token_id,
            version=record.version,  # the token ages of max_token_version_lag
            ref_model=ref_model,
        )
        current = model.state_dict()

    result: dict[str, Any] = {
        "step": step,
        "version": record.version,
        "metrics": {},
        "ranks": ranks,
        "ran_on": ran_on,
    }
    table = Table(title=f"replay of step {step} (version {record.version}, {len(samples)} samples)")
    for col in ("metric", "recorded", "replayed", "difference"):
        table.add_column(col, justify="right")
    for key in (*COMPARED, *(k for k in OFFPOLICY_COMPARED if k in record.metrics)):
        old, new = record.metrics.get(key), replayed.get(key)
        result["metrics"][key] = {"recorded": old, "replayed": new}
        diff = None if old is None or new is None else new - old
        table.add_row(
            key,
            "-" if old is None else f"{old:.6g}",
            "-" if new is None else f"{new:.6g}",
            "-" if diff is None else f"{diff:+.3g}",
        )
    after = _ckpt(cfg, step)
    if after.exists():
        saved = _weights_of(after, model)
        max_diff = max((current[k] - v).abs().max().item() for k, v in saved.items())
        result["weights_max_abs_diff"] = max_diff
        result["weights_equal"] = all(torch.equal(current[k], v) for k, v in saved.items())
        table.add_row(
            "weights after the step",
            "checkpoint",
            "bit-identical" if result["weights_equal"] else "differ",
            f"max |Δ| {max_diff:.3g}",
        )
    console.print(table)
    if ranks != ran_on and "weights_max_abs_diff" in result:
        console.print(
            f"step {step} ran on {ran_on} trainer rank(s) and is replayed on {ranks}: the "
            "ranks' gradients add up in another order, so the replay cannot be bit-identical "
            f"(max |Δ| of the weights {result['weights_max_abs_diff']:.3g}); replay it with "
            f"--ranks {ran_on} for a bit-identical one"
        )
    return result


def _ranks_of(cfg: RunConfig, step: int) -> int:
    """The trainer ranks that ran ``step``: those that wrote its checkpoint (else the one it
    started from); 1 without either."""
    from asyncrl.consumers.dcp_read import world_size_of

    for path in (_ckpt(cfg, step), _ckpt(cfg, step - 1)):
        if (path / "state.json").is_file():
            return world_size_of(path)
    return 1


def _weights_of(path: Path, like: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of the checkpoint at ``path``, one process's or sharded (read whole into a
    copy of ``like``)."""
    import copy

    from asyncrl.consumers.checkpoint import is_sharded
    from asyncrl.consumers.dcp_read import read_weights

    if not is_sharded(path):
        weights: dict[str, torch.Tensor] = torch.load(path / "model.pt", weights_only=True)
        return weights
    model = copy.deepcopy(like)
    read_weights(path, model)
    return model.state_dict()


def replay_topic(
    cfg: RunConfig,
    bootstrap: str,
    name: str,
    target_run_id: str,
    console: Console,
    start: int = 0,
    end: int | None = None,
    versions: tuple[int, int] | None = None,
    sample_ids: set[str] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    target_bootstrap: str | None = None,
) -> int:
    """Re-publish a selection of ``samples`` or ``partials`` into run ``target_run_id``'s topic
    (on ``target_bootstrap``, default the source's broker: a run's archive is served by a
    throwaway broker, and the target run lives on a broker of its own).

    The records keep their key, bytes and headers (plus ``replayed-from``: the source topic;
    their versions are the source run's), in offset order, so a trainer of the target
    run is fed the recorded stream: an off-policy re-training from the log. Selection: offsets
    ``[start, end)``, then optionally a version range (a sample's ``param_version``, inclusive)
    and a set of sample ids: those not found are named after the copy, and none found is a
    ReplayError. Returns the number of records published.
    """
    from asyncrl.kafka import HEADER_REPLAYED_FROM, Publisher
    from asyncrl.kafka.topics import create_run_topics
    from asyncrl.schemas.partial import decode_partial

    if name not in ("samples", "partials"):
        raise ReplayError(f"replay topic takes samples or partials, not {name!r}")
    target = cfg.model_copy(update={"run_id": target_run_id})
    target_bootstrap = target_bootstrap or bootstrap
    if target_run_id == cfg.run_id and target_bootstrap == bootstrap:
        raise ReplayError("the target run must differ from the source run")
    create_run_topics(target, target_bootstrap)
    filtered = versions is not None or sample_ids is not None
    published = 0
    found: set[str] = set()
    with Publisher(cfg.kafka, target_bootstrap) as pub:
        records = read_records(
            cfg, bootstrap, name, start, end, since_ms=since_ms, until_ms=until_ms
        )
        for rec in records:
            if filtered:
                if name == "samples":
                    sample = decode_sample(rec.value, rec.headers)
                else:
                    sample = decode_partial(rec.value, rec.headers).sample
                if versions is not None and not versions[0] <= sample.param_version <= versions[1]:
                    continue
                if sample_ids is not None and sample.sample_id not in sample_ids:
                    continue
                found.add(sample.sample_id)
            # this run's versions, which the target's trainer never granted (consumers/batcher.py)
            headers: dict[str, str | bytes] = {**rec.headers, HEADER_REPLAYED_FROM: cfg.topic(name)}
            pub.publish(target.topic(name), rec.key, rec.value, headers=headers)
            published += 1
    console.print(f"replayed {published} records of {cfg.topic(name)} into {target.topic(name)}")
    missing = sorted((sample_ids or set()) - found)
    if missing:  # named, so that a typo in --sample-ids is not a silent partial copy
        narrowed = (
            start
            or versions is not None
            or any(bound is not None for bound in (end, since_ms, until_ms))
        )
        where = cfg.topic(name) + (" in the selection read" if narrowed else "")
        named = ", ".join(missing[:10]) + (
            f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        )
        if not found:
            raise ReplayError(f"none of the {len(missing)} sample ids asked is on {where}: {named}")
        console.print(f"{len(missing)} of the sample ids asked not on {where}: {named}")
    return published
