"""``asyncrl bench engine``: tokens/s of the hf engine (no cache), hf_cached, hf_static and
vllm (where it is installed), side by side.

For each model shape, the engines generate the same requests, one engine after the other in
this process, from the same weights and seed: ``batch`` prompts of random ids (lengths between
half of ``prompt_len`` and ``prompt_len``), each sampled at the rollout temperature for exactly
``new_tokens`` tokens (EOS does not stop them, so every engine makes the same number). Each
engine serves all of its generations, as a worker's does: a warm-up of two tokens at the full
batch comes first (allocators, kernels, hf_static's CUDA graph for the batch); each timed one
(the median of ``repeats``) runs from ``add`` to the last token, prefill included. Printed per
shape: seconds and tokens/s of each, each one's ratio over hf, and the largest |recorded logprob - the
trainer's recomputation| (:func:`asyncrl.consumers.grpo.token_logprobs`, one trajectory at a
time, the first ``LOGPROB_ROWS``) over each engine's tokens.

Shapes: ``demo`` is the run config's policy (the built-in model's shape, or the config.json of
``actor_rollout_ref.model.path``), the others Qwen2 shapes of ``asyncrl bench sync`` (``500M``
is Qwen2.5-0.5B's), all randomly initialised: throughput does not depend on the weights' values.
Unset sizes take each shape's default (``SMOKE``: a run of about a minute on a 2-core CPU; the
demo's batch is ``rollout.n x max_concurrent_samples``, what one worker generates at once). On
a CPU, ``rollout.torch_threads`` threads, as a rollout worker has; on a GPU, bf16 by default.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from asyncrl.bench import flags
from asyncrl.bench.sync import qwen2_config
from asyncrl.config import ConfigError, RunConfig, load_config

ENGINES: tuple[str, ...] = ("hf", "hf_cached", "hf_static")
if importlib.util.find_spec("vllm") is not None:  # make install VLLM=none leaves it out
    ENGINES += ("vllm",)
LOGPROB_ROWS = 8
"""Trajectories per engine whose logprobs are recomputed (a 0.5B recomputation is slow on CPU)."""
SMOKE: dict[str, tuple[int | None, int, int]] = {
    "demo": (None, 8, 12),
    "5M": (8, 32, 32),
    "50M": (4, 32, 16),
    "500M": (2, 16, 8),
}
"""Each shape's default (batch, prompt_len, new_tokens); batch None: rollout.n x
max_concurrent_samples."""
DEFAULT_SHAPES = ("demo", "500M")


def _model(cfg: RunConfig, shape: str, device: str, dtype: Any) -> tuple[Any, int]:
    """A randomly initialised causal LM of ``shape`` on ``device``, and its vocabulary size."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_cfg = cfg.actor_rollout_ref.model
    if shape != "demo":
        config = qwen2_config(shape)
    elif model_cfg.path is not None:
        config = AutoConfig.from_pretrained(model_cfg.path)
    else:
        from asyncrl.models.tiny import build_model, task_tokenizer

        vocab = len(task_tokenizer(cfg.data))
        tiny: Any = build_model(model_cfg, vocab, seed=0)
        return tiny.to(device=device, dtype=dtype), vocab
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval(), config.vocab_size


def _requests(batch: int, prompt_len: int, new_tokens: int, vocab: int) -> list[Any]:
    import random

    from asyncrl.producers.engines.base import GenRequest

    rng = random.Random(0)
    lengths = [rng.randint(max(1, prompt_len // 2), prompt_len) for _ in range(batch)]
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]
    return [GenRequest(str(i), p, new_tokens) for i, p in enumerate(prompts)]


def _engine(cfg: RunConfig, name: str, model: Any, max_len: int = 0) -> Any:
    """A fresh engine ``name`` over ``model`` (the config's sampling settings). vllm's prefix
    cache is off: every repeat sends the same prompts, which it would otherwise not prefill."""
    from asyncrl.producers.engines.factory import hf_engine

    rollout = cfg.actor_rollout_ref.rollout
    if name == "vllm":
        from asyncrl.producers.engines.vllm_engine import VLLMEngine, VLLMOptions

        return VLLMEngine(
            model,
            None,
            rollout.temperature,
            eos_token_id=-1,
            pad_token_id=0,
            seed=cfg.trainer.seed,
            options=VLLMOptions(
                max_model_len=max_len or None,
                enforce_eager=rollout.enforce_eager,
                enable_prefix_caching=False,
            ),
        )
    return hf_engine(
        name,
        model,
        None,
        temperature=rollout.temperature,
        eos_token_id=-1,  # never produced: every request makes new_tokens tokens
        pad_token_id=0,
        seed=cfg.trainer.seed,
        cuda_graphs=not rollout.enforce_eager,
    )


PROFILED = ("hf_cached", "hf_static")
"""The engines ``--profile`` looks into (hf's cost is known: it recomputes everything)."""
PROFILE_ROWS = 20


def _profile(engine: Any, reqs: list[Any], device: str) -> str:
    """torch.profiler's table of one generation of ``reqs``, costliest first: by time on the
    GPU where there is one (the kernels, the graph replays, the copies), else on the CPU."""
    from torch.profiler import ProfilerActivity, profile

    gpu = device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
    with profile(activities=activities) as prof:
        _generate(engine, reqs)
    key = "self_device_time_total" if gpu else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=PROFILE_ROWS)


def _generate(engine: Any, reqs: list[Any]) -> tuple[list[Any], float]:
    """``reqs`` through ``engine`` (idle before and after); (results, seconds)."""
    import torch

    t0 = time.perf_counter()
    with torch.no_grad():
        results = engine.generate(reqs)
    return results, time.perf_counter() - t0


def logprob_error(model: Any, results: list[Any], temperature: float) -> float:
    """Max |recorded logprob - token_logprobs'| over the first LOGPROB_ROWS trajectories,
    each recomputed alone (no batch mates)."""
    from asyncrl.consumers.grpo import rollout_logprob_errors

    rows = [(r.prompt_ids, r.response_ids, r.response_logprobs, 0.0) for r in results]
    return max(
        (
            float(rollout_logprob_errors(model, [row], 0, temperature).max())
            for row in rows[:LOGPROB_ROWS]
        ),
        default=0.0,
    )


def engine(
    config: str | None,
    overrides: list[str],
    console: Console,
    shapes: tuple[str, ...] = DEFAULT_SHAPES,
    batch: int | None = None,
    prompt_len: int | None = None,
    new_tokens: int | None = None,
    device: str = "auto",
    dtype: str | None = None,
    repeats: int = 3,
    profile: bool = False,
) -> dict[str, Any]:
    """Measure the engines at each shape; print one table and return the figures.
    ``profile``: then one more generation of each cached engine under torch's profiler, its
    costliest ops printed (where a decoding step's time goes)."""
    import torch

    unknown = [s for s in shapes if s not in SMOKE]
    if unknown:
        raise ConfigError(f"--shapes: no shape {', '.join(unknown)} (known: {', '.join(SMOKE)})")
    cfg = load_config(config, overrides)
    rollout = cfg.actor_rollout_ref.rollout
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(rollout.torch_threads)
    sizes = (batch, prompt_len, new_tokens)
    try:
        results = {
            s: _measure(cfg, s, sizes, device, dtype, repeats, console, profile) for s in shapes
        }
    finally:
        torch.set_num_threads(threads)
    _table(results, console)
    out_dir = Path(cfg.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"bench-engine-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=1))
    console.print(f"figures: {path}")
    return results


def _measure(
    cfg: RunConfig,
    shape: str,
    sizes: tuple[int | None, int | None, int | None],
    device: str,
    dtype: str,
    repeats: int,
    console: Console,
    profile: bool = False,
) -> dict[str, Any]:
    """The engines at one shape; ``sizes`` (batch, prompt_len, new_tokens), None: SMOKE's."""
    import torch

    rollout = cfg.actor_rollout_ref.rollout
    batch, prompt_len, new_tokens = sizes
    default_batch, default_prompt, default_new = SMOKE[shape]
    b = batch or default_batch or rollout.n * rollout.max_concurrent_samples
    p, n = prompt_len or default_prompt, new_tokens or default_new
    console.rule(f"{shape}: batch {b}, prompts of <= {p} tokens, {n} new tokens, {dtype}")
    model, vocab = _model(cfg, shape, device, getattr(torch, dtype))
    row: dict[str, Any] = {
        "params": sum(t.numel() for t in model.parameters()),
        "batch": b,
        "prompt_len": p,
        "new_tokens": n,
        "device": device,
        "dtype": dtype,
    }
    for name in ENGINES:
        engine = _engine(cfg, name, model, max_len=p + n)
        _generate(engine, _requests(b, p, 2, vocab))  # warm-up
        runs = [_generate(engine, _requests(b, p, n, vocab)) for _ in range(repeats)]
        out, seconds = sorted(runs, key=lambda r: r[1])[len(runs) // 2]  # the median
        tokens = sum(len(r.response_ids) for r in out)
        row[name] = {
            "s": seconds,
            "tokens": tokens,
            "tokens_per_s": tokens / seconds,
            "logprob_max_abs_diff": logprob_error(model, out, rollout.temperature),
        }
        console.log(f"{shape} {name}: {tokens} tokens in {seconds:.2f} s")
        if profile and name in PROFILED:
            console.rule(f"{shape} {name}: the costliest ops of one more generation")
            table = _profile(engine, _requests(b, p, n, vocab), device)
            console.print(table, markup=False, highlight=False, soft_wrap=True)
        engine.close()  # vLLM allows one live engine per process
    row["ratios"] = {
        name: row[name]["tokens_per_s"] / row["hf"]["tokens_per_s"] for name in ENGINES[1:]
    }
    return row


def _table(results: dict[str, dict[str, Any]], console: Console) -> None:
    first = next(iter(results.values()))
    table = Table(
        title=f"tokens/s, hf (no cache) vs {' vs '.join(ENGINES[1:])}, {first['dtype']} on "
        f"{first['device']}"
    )
    for col in ("shape", "params", "batch", "prompt+new", "engine", "s", "tokens/s"):
        table.add_column(col, justify="right")
    table.add_column("max |Δ logprob|", justify="right")
    for shape, r in results.items():
        for name in ENGINES:
            e = r[name]
            table.add_row(
                shape,
                f"{r['params'] / 1e6:.1f}M",
                str(r["batch"]),
                f"<={r['prompt_len']}+{r['new_tokens']}",
                name,
                f"{e['s']:.3f}",
                f"{e['tokens_per_s']:.{0 if e['tokens_per_s'] >= 100 else 1}f}",
                f"{e['logprob_max_abs_diff']:.1e}",
            )
    console.print(table)
    for shape, r in results.items():
        shown = [
            f"{name} / hf tokens/s = {x:.2f}x" if math.isfinite(x) else f"{name} / hf: -"
            for name, x in r["ratios"].items()
        ]
        console.print(f"{shape}: " + ", ".join(shown))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``asyncrl bench engine``: its description and flags (unset: each shape's smoke
    default)."""
    p.description = (
        "Tokens/s of the hf engine (no KV cache), hf_cached and hf_static (slotted cache, CUDA "
        "graphs on a GPU) on the same requests, at the demo model's shape and Qwen2 shapes "
        "(random weights), each one's ratio over hf, and each one's largest logprob "
        "difference from the trainer's recomputation."
    )
    p.add_argument(
        "--shapes",
        help="comma-separated model shapes, random weights: among demo (the config's policy), "
        "5M, 50M, 500M (Qwen2.5-0.5B's) (default demo,500M)",
    )
    p.add_argument(
        "--batch",
        type=int,
        help="requests generated at once (default: the demo's rollout.n x "
        "max_concurrent_samples, 2-8 for the other shapes)",
    )
    p.add_argument("--prompt-len", type=int, help="the longest prompt, in tokens")
    p.add_argument("--new-tokens", type=int, help="tokens generated per request")
    flags.add_device(p)
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed runs, one more generation of hf_cached and hf_static under "
        "torch's profiler; prints their costliest ops (GPU time on a GPU)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="the model's dtype (default: bfloat16 on a GPU, float32 on a CPU)",
    )


def main(args: argparse.Namespace, console: Console) -> None:
    """``asyncrl bench engine``: its flags checked, then the engines measured."""
    for flag, value in (
        ("--batch", args.batch),
        ("--prompt-len", args.prompt_len),
        ("--new-tokens", args.new_tokens),
    ):
        if value is not None:
            flags.at_least_one(flag, value)
    engine(
        args.config,
        args.overrides,
        console,
        shapes=tuple((args.shapes or "demo,500M").split(",")),
        batch=args.batch,
        prompt_len=args.prompt_len,
        new_tokens=args.new_tokens,
        device=flags.device(args),
        dtype=args.dtype,
        profile=args.profile,
    )
