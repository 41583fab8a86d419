"""``asyncrl bench NAME``: the benchmarks of bench/, measured side by side from one command."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from asyncrl.cli.args import config_args
from asyncrl.cli.find_run import table_console


def engine_args(p: argparse.ArgumentParser) -> None:
    """``bench engine``'s sizes; unset, each shape's smoke default (bench/engine.py)."""
    p.add_argument(
        "--shapes",
        help="engine and sync: comma-separated model shapes, random weights: engine among demo "
        "(the config's policy), 5M, 50M, 500M (Qwen2.5-0.5B's), default demo,500M; sync among "
        "5M, 50M, 500M, default 50M,500M",
    )
    p.add_argument(
        "--batch",
        type=int,
        help="engine only: requests generated at once (default: the demo's rollout.n x "
        "max_concurrent_samples, 2-8 for the other shapes)",
    )
    p.add_argument("--prompt-len", type=int, help="engine only: the longest prompt, in tokens")
    p.add_argument("--new-tokens", type=int, help="engine only: tokens generated per request")
    p.add_argument(
        "--device",
        help="engine and sync: cpu, cuda, cuda:N (default: auto, a GPU when there is one)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="engine only: after the timed runs, one more generation of hf_cached and "
        "hf_static under torch's profiler; prints their costliest ops (GPU time on a GPU)",
    )
    p.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="engine only: the model's dtype (default: bfloat16 on a GPU, float32 on a CPU)",
    )


def add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="measurements printed side by side from one invocation",
        description="modes: verl's mode table on the sim engine (--workload seed, the seed's "
        "128-GPU figures time-scaled, or long-tail): colocated sync vs (a) on-policy pipeline, (b) "
        "stream off-policy, (c) stale samples, (d) partial rollout, and a staleness ablation; "
        "time, idle ratios, speedup next to the seed's, efficiency. "
        "sync-pause: the sim engine's long-tail workload in mode (c), mode (d, partial "
        "rollout) and mode (d) with in-flight weight updates; prints how long syncs waited for "
        "the workers to pause, the throughput of each, and where a sync's time goes, hop by hop "
        "(from the control events on the log). "
        "learn: wall time to the target held-out accuracy, colocated sync (with one torch thread "
        "and with every core: the faster is the baseline) vs async (c) vs (d) "
        "vs (d) with in-flight weight updates, and the accuracy curves on one plot (PNG). "
        "offpolicy: the same high-staleness run (staleness 2, trigger 4, partial rollout) "
        "without correction, with decoupled PPO (proximal log-probs, token importance weights), "
        "with dynamic sampling (filter_groups) and with both: accuracy curves, staleness, "
        "mismatch KL, weights and filtered groups side by side. "
        "transport: samples/s, MB/s, encode/decode time and bytes per token of our Arrow samples "
        "through Kafka, next to raw byte strings and a Ray actor queue of pickled tensors. "
        "sync: weight transfer time and GB/s between two processes (shared-memory slots, the "
        "trainer's weights read in place, bucketed, per-tensor, a safetensors file) next to an "
        "in-memory copy of the same bytes; with --device cuda, the CUDA IPC handoffs and gloo "
        "next to a device-to-device copy; and "
        "the time of each checksum format (sha256, on-device) over the same weights. "
        "tracing: samples/s of the sim workload with OpenTelemetry tracing off, then on. "
        "tools: latency of a calculator call, one at a time and a step's burst, with the "
        "sandbox server forking a child per call vs a fresh interpreter per call. "
        "engine: tokens/s of the hf engine (no KV cache), hf_cached and hf_static (slotted "
        "cache, CUDA graphs on a GPU) on the same requests, at the demo model's shape and "
        "Qwen2 shapes (random weights), each one's ratio over hf, and each one's largest "
        "logprob difference from the trainer's recomputation. "
        "tuning: time to the target accuracy over a grid of staleness_threshold x "
        "trigger_parameter_sync_step (the config's async setup), next to colocated sync.",
    )
    p.add_argument(
        "name",
        choices=[
            "modes",
            "sync-pause",
            "learn",
            "offpolicy",
            "transport",
            "sync",
            "tracing",
            "tools",
            "engine",
            "tuning",
        ],
        help="which benchmark",
    )
    p.add_argument(
        "--seeds",
        type=int,
        help="learn and tuning: run every setup with this many trainer.seed values (from the "
        "config's, one more each) and compare medians (default 1)",
    )
    p.add_argument(
        "--staleness",
        default=None,
        help="comma-separated async_training.staleness_threshold values; tuning: the grid's "
        "(default 0.5,1,2); modes: the mode (d) ablation's (default 0.1,0.3, the seed's)",
    )
    p.add_argument(
        "--trigger",
        help="tuning only: comma-separated async_training.trigger_parameter_sync_step values "
        "(default 1,2,4)",
    )
    p.add_argument(
        "--workload",
        choices=["seed", "long-tail"],
        help="modes only: the sim workload; seed (default): the seed's 128-GPU Qwen2.5-7B "
        "figures, time-scaled; long-tail: round numbers (bench/workloads.py)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        help="modes --workload seed: seconds here per second of the seed (default 0.01)",
    )
    engine_args(p)
    config_args(p)


def cmd_bench(args: argparse.Namespace) -> int:
    from asyncrl.bench.learn import learn
    from asyncrl.bench.modes import modes
    from asyncrl.bench.offpolicy import offpolicy
    from asyncrl.bench.sync import sync
    from asyncrl.bench.sync_pause import sync_pause
    from asyncrl.bench.tools import tools
    from asyncrl.bench.tracing import tracing_cost
    from asyncrl.bench.transport import transport

    benchmarks = {
        "sync-pause": sync_pause,
        "learn": learn,
        "offpolicy": offpolicy,
        "transport": transport,
        "tracing": tracing_cost,
        "tools": tools,
    }
    lists = _bench_option_problem(args) or _bench_lists(args)
    if isinstance(lists, str):
        print(f"asyncrl bench {args.name}: {lists}", file=sys.stderr)
        return 2
    staleness = lists.get("staleness")
    seeds = 1 if args.seeds is None else args.seeds
    if args.name == "modes":
        modes(
            args.config,
            args.overrides,
            table_console(),
            workload=args.workload or "seed",
            time_scale=0.01 if args.time_scale is None else args.time_scale,
            staleness=staleness,
        )
        return 0
    if args.name == "engine":
        from asyncrl.bench.engine import engine

        engine(
            args.config,
            args.overrides,
            table_console(),
            shapes=tuple((args.shapes or "demo,500M").split(",")),
            batch=args.batch,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            device=args.device or "auto",
            dtype=args.dtype,
            profile=args.profile,
        )
        return 0
    if args.name == "learn":
        learn(args.config, args.overrides, table_console(), seeds=seeds)
        return 0
    if args.name == "tuning":
        from asyncrl.bench.tuning import STALENESS, TRIGGER, tuning

        grid = staleness or STALENESS
        trigger = lists.get("trigger") or TRIGGER
        tuning(args.config, args.overrides, table_console(), seeds, grid, trigger)
        return 0
    if args.name == "sync":
        from asyncrl.bench.sync import DEFAULT_SHAPES

        shapes = tuple(args.shapes.split(",")) if args.shapes else DEFAULT_SHAPES
        sync(args.config, args.overrides, table_console(), shapes, device=args.device or "auto")
        return 0
    benchmarks[args.name](args.config, args.overrides, table_console())
    return 0


BENCH_OPTIONS: dict[str, tuple[str, ...]] = {
    "seeds": ("learn", "tuning"),
    "staleness": ("modes", "tuning"),
    "trigger": ("tuning",),
    "workload": ("modes",),
    "time_scale": ("modes",),
    "shapes": ("engine", "sync"),
    "batch": ("engine",),
    "prompt_len": ("engine",),
    "new_tokens": ("engine",),
    "device": ("engine", "sync"),
    "profile": ("engine",),
    "dtype": ("engine",),
}
"""Each ``asyncrl bench`` option and the benchmarks that read it: given to another, it would be
ignored without a word (``bench learn --trigger 2`` ran learn's own setups), so it is refused."""


BENCH_LISTS: dict[str, tuple[type, float, str, str]] = {
    "staleness": (float, 0, "numbers", "0.5,1,2"),
    "trigger": (int, 1, "whole numbers", "1,2,4"),
}
"""The comma-separated ``asyncrl bench`` options: dest -> (type, least value, what, example)."""


def _bench_lists(args: argparse.Namespace) -> dict[str, tuple[Any, ...]] | str:
    """The comma-separated options given, parsed (dest -> values; the one parse the benchmarks
    get), or what is wrong with one, in one line naming the flag and the value."""
    out: dict[str, tuple[Any, ...]] = {}
    for dest, (kind, low, what, example) in BENCH_LISTS.items():
        text = getattr(args, dest)
        if text is None:
            continue
        flag, values = f"--{dest}", []
        for part in text.split(","):
            try:
                value = kind(part)
            except ValueError:
                value = None
            if value is None or not low <= value < float("inf"):
                return (
                    f"{flag} takes comma-separated {what} of at least {low:g} "
                    f"(e.g. {example}), not {part.strip()!r}"
                )
            values.append(value)
        out[dest] = tuple(values)
    return out


def _bench_option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``asyncrl bench``'s options, in one line, or None: an option the
    benchmark does not read, or a value no run could take (the comma-separated ones:
    :func:`_bench_lists`). Checked before any run starts, so a slip does not surface after
    the baseline ran for minutes."""
    for dest, benches in BENCH_OPTIONS.items():
        given = getattr(args, dest)
        if given is not None and given is not False and args.name not in benches:
            flag = "--" + dest.replace("_", "-")
            return f"{flag} applies to {' and '.join(benches)}, not {args.name}"
    if args.time_scale is not None and args.workload == "long-tail":
        return "--time-scale applies to --workload seed (long-tail is in seconds already)"
    for flag, value in (
        ("--seeds", args.seeds),
        ("--batch", args.batch),
        ("--prompt-len", args.prompt_len),
        ("--new-tokens", args.new_tokens),
    ):
        if value is not None and value < 1:
            return f"{flag} must be at least 1 (got {value})"
    if args.time_scale is not None and not 0 < args.time_scale < float("inf"):
        return f"--time-scale must be above 0 (got {args.time_scale:g})"
    return _device_problem(args.device) if args.device is not None else None


def _device_problem(device: str) -> str | None:
    """``--device`` that torch would refuse deep in the benchmark, with a traceback: a name it
    does not know, or CUDA where torch sees none (or fewer devices than the index)."""
    match = re.fullmatch(r"auto|cpu|cuda(?::(\d+))?", device)
    if match is None:
        return f"--device takes auto, cpu, cuda or cuda:N, not {device!r}"
    if device.startswith("cuda"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(match.group(1) or 0) >= count:
            return f"--device {device}: torch sees {count} CUDA device(s) here"
    return None
