"""``asyncrl bench NAME``: benchmarks that print their figures and ratios side by side from one
invocation.

Each benchmark is a module here with ``add_arguments(parser)`` (its description and flags) and
``main(args, console)`` (checks the flags' values, raising ``flags.FlagError``, then runs). The
command line imports a benchmark's module only once it is chosen, since most import torch.
"""

BENCHMARKS: dict[str, tuple[str, str]] = {
    "modes": (
        "asyncrl.bench.modes",
        "verl's mode table on the sim engine: colocated sync vs modes (a)-(d)",
    ),
    "sync-pause": (
        "asyncrl.bench.sync_pause",
        "sync pause and its hops: (c), (d), (d) in flight",
    ),
    "learn": (
        "asyncrl.bench.learn",
        "time to the target accuracy: colocated sync vs (c), (d), (d) in flight",
    ),
    "offpolicy": (
        "asyncrl.bench.offpolicy",
        "high staleness: decoupled PPO and dynamic sampling, on and off",
    ),
    "transport": (
        "asyncrl.bench.transport",
        "Arrow samples over Kafka vs raw bytes vs a Ray queue",
    ),
    "sync": (
        "asyncrl.bench.sync",
        "weight transfer: shared slots, in place, bucketed, per-tensor, file, memcpy",
    ),
    "tracing": ("asyncrl.bench.tracing", "samples/s with tracing off vs on"),
    "tools": (
        "asyncrl.bench.tools",
        "a calculator call: sandbox server vs fresh interpreter",
    ),
    "engine": (
        "asyncrl.bench.engine",
        "tokens/s of the engines: hf vs hf_cached vs hf_static",
    ),
    "tuning": (
        "asyncrl.bench.tuning",
        "time to the target accuracy over a staleness x sync cadence grid",
    ),
}
"""Each benchmark's name on the command line: its module, and its line in ``--help``."""
