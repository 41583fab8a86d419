"""``asyncrl replay step N | topic T``: re-run a training step from the log and its checkpoint,
or re-publish a run's records into another run; the arguments checked before the run's log is
opened (a throwaway broker serves an archived one)."""

from __future__ import annotations

import argparse
import re
import sys

from asyncrl.cli.args import Subcommands, config_args, offset, output_dir_arg
from asyncrl.cli.find_run import closed_loopback, load_run, log_broker
from asyncrl.cli.run_log import time_range
from asyncrl.consumers.exit_codes import ExitCode


def add_replay(sub: Subcommands) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run a training step from the log and its checkpoint, or re-publish a run's "
        "records into another run",
        description="replay topic samples|partials --to-run OTHER: re-publishes a selection "
        "(offsets, --versions, --sample-ids) into another run's topic, to feed its trainer the "
        "recorded stream. replay step N: loads the checkpoint step N started from, fetches exactly "
        "the samples of step N from the samples topic, re-runs the update and compares loss, "
        "grad norm and the resulting weights with what was recorded. Overrides (e.g. "
        "actor_rollout_ref.actor.optim.lr=1e-3) re-run the step with other settings (one the "
        "recorded samples fix, as actor_rollout_ref.rollout.n, is named in a warning). The run: "
        "run_id=RUN or a word RUN after the target, or --config runs/<run_id>/config.yaml; its "
        "saved config names its broker, and a finished `asyncrl run` is read from its archived "
        "log (OUTPUT_DIR/RUN/log) unless kafka.bootstrap_servers is given.",
    )
    p.add_argument("what", choices=["step", "topic"], help="what to replay")
    p.add_argument("target", help="step: the step number (1-based); topic: samples or partials")
    p.add_argument(
        "--ranks",
        type=_ranks,
        help="step: trainer ranks to re-run it on (default: as many as ran it, the one count "
        "that reproduces its weights bit for bit; another says by how much they differ)",
    )
    p.add_argument("--to-run", help="topic: the run_id whose topic receives the records")
    p.add_argument(
        "--to-bootstrap",
        metavar="HOST:PORT",
        help="topic: the broker of the --to-run run (default: the source run's; needed when "
        "the source is read from its archive, as an `asyncrl run` with its embedded broker is)",
    )
    p.add_argument("--from", dest="start", type=offset, default=0, help="topic: first offset")
    p.add_argument("--to", dest="end", type=offset, default=None, help="topic: stop before offset")
    p.add_argument(
        "--since",
        help="topic: records at or after this time (ISO 8601, HH:MM:SS in UTC, or epoch ms)",
    )
    p.add_argument("--until", help="topic: records before this time")
    p.add_argument("--versions", help="topic: param_version range, e.g. 3..7")
    p.add_argument(
        "--sample-ids",
        help="topic: comma-separated sample ids (those not on the topic are named; none: exit 1)",
    )
    output_dir_arg(p)
    config_args(p, reads_run=True)


def cmd_replay(args: argparse.Namespace) -> int:
    from rich.console import Console

    from asyncrl.ops.replay import STEP_READS, ReplayError, replay_step, replay_topic

    cfg = load_run(args)
    try:
        if args.what == "step":
            step = _replay_step_number(args.target)
            _replayable_overrides(args.overrides)
            idle = _no_effect_on_replay(args.overrides)
            if idle:
                print(
                    f"asyncrl replay: warning: {', '.join(idle)}: no effect on a replayed step "
                    "(its samples, rewards and the model it started from are the run's); the "
                    "update's settings are actor_rollout_ref.actor.*, algorithm.*",
                    file=sys.stderr,
                )
            with log_broker(cfg, args, "replay", STEP_READS) as bootstrap:
                replay_step(cfg, bootstrap, step, Console(), ranks=args.ranks)
        else:
            if args.target not in ("samples", "partials"):
                raise ReplayError(f"replay topic takes samples or partials, not {args.target!r}")
            if not args.to_run:
                raise ReplayError("replay topic needs --to-run RUN_ID")
            versions = _version_range(args.versions) if args.versions else None
            closed = args.to_bootstrap and closed_loopback(args.to_bootstrap)
            if closed:  # the broker-down timeout later, naming kafka.bootstrap_servers
                raise ReplayError(
                    f"nothing listens at {closed} (--to-bootstrap): start run {args.to_run}'s "
                    "broker (`asyncrl broker --port PORT`), or name the one it runs on"
                )
            ids = None if args.sample_ids is None else _sample_ids(args.sample_ids)
            try:
                since, until = time_range(args)
            except ValueError as err:
                raise ReplayError(str(err)) from None
            # From the run's log (its archive, or its broker); into the target run's broker:
            # --to-bootstrap, else the source's, which must then be up
            with log_broker(cfg, args, "replay topic") as bootstrap:
                target = args.to_bootstrap
                if target is None and bootstrap != cfg.kafka.bootstrap_servers:
                    raise ReplayError(
                        f"{cfg.run_id} is read from its archive ({bootstrap}, a broker that "
                        "ends with this command): name the broker of run "
                        f"{args.to_run} with --to-bootstrap HOST:PORT"
                    )
                replay_topic(
                    cfg, bootstrap, args.target, args.to_run, Console(), args.start, args.end,
                    versions, ids, since, until, target,
                )  # fmt: skip
    except ReplayError as err:
        print(f"asyncrl replay: {err}", file=sys.stderr)
        return ExitCode.FAILED
    return ExitCode.OK


def _replay_step_number(text: str) -> int:
    """``replay step N``'s N, checked before the run's log is opened (a throwaway broker for
    an archive): a whole number, 1 or more."""
    from asyncrl.ops.replay import ReplayError

    if not text.isdigit() or int(text) < 1:
        raise ReplayError(f"replay step takes a step number (1, 2, ...), not {text!r}")
    return int(text)


def _ranks(text: str) -> int:
    """``--ranks N``: a whole number, 1 or more."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"takes a number of ranks (1, 2, ...), not {text!r}")
    return int(text)


MODEL_SHAPE = re.compile(
    r"actor_rollout_ref\.model\.(hidden_size|num_hidden_layers|num_attention_heads|"
    r"intermediate_size|warmup_\w+)$"
)
"""The built-in policy's shape and warm start: a step's checkpoint holds the model it ran on."""


def _replayable_overrides(overrides: list[str]) -> None:
    """``replay step N key=value`` re-runs the update with other settings, on the model the
    step's checkpoint holds: an override that builds another model
    (``actor_rollout_ref.model.hidden_size=64``) is refused, naming the key."""
    from asyncrl.config.overrides import override_key
    from asyncrl.ops.replay import ReplayError

    for override in overrides:
        key = override_key(override)
        if MODEL_SHAPE.match(key):
            raise ReplayError(
                f"{key}: replay step runs the step on the model its checkpoint holds, so the "
                "model's shape and warm start are the run's; override the update instead "
                "(actor_rollout_ref.actor.*, algorithm.*)"
            )


NO_EFFECT_ON_REPLAY = re.compile(
    r"(actor_rollout_ref\.rollout\.(?!temperature$)|data\.(?!max_response_length$)|"
    r"custom_reward_function\.|algorithm\.(filter_groups|overlong_buffer)\.|"
    r"async_training\.(staleness_threshold|trigger_parameter_sync_step|require_batches|"
    r"partial_rollout|use_trainer_do_validate|in_flight_update|max_version_lag)$|"
    r"kafka\.topics\.partitions\.)"
)
"""Keys the recorded samples fix (generation, data, scoring, batching, the topics they are on):
a replay re-runs the update on them. rollout.temperature (the log-probs' temperature) and
data.max_response_length (the loss's default scale) do change it. Not derived from the keys a
resumed run may not change (``launch/resume_check.FIXED``): most of these may change on a
resume (they shape the samples to come), and some fixed ones change a replay
(actor.ppo_mini_batch_size); a test holds each fixed key to a warning, a refusal or a reason."""


def _no_effect_on_replay(overrides: list[str]) -> list[str]:
    """The overrides of ``replay step N`` that cannot change it (``actor_rollout_ref.rollout.n``:
    the recorded samples fix it), to warn of."""
    from asyncrl.config.overrides import override_key
    from asyncrl.config.verl_keys import VERL_KEYS

    idle = []
    for key in map(override_key, overrides):
        rule = VERL_KEYS.get(key)  # verl's rollout.response_length is data.max_response_length
        if NO_EFFECT_ON_REPLAY.match(rule.target if rule and rule.target else key):
            idle.append(key)
    return idle


def _version_range(text: str) -> tuple[int, int]:
    """``--versions 3..7`` (or ``3``) as an inclusive range; another form is a ReplayError."""
    from asyncrl.ops.replay import ReplayError

    lo, _, hi = text.partition("..")
    if not lo.isdigit() or not (hi or lo).isdigit() or int(lo) > int(hi or lo):
        raise ReplayError(
            f"--versions takes a range LOW..HIGH such as 3..7, or one version, not {text!r}"
        )
    return int(lo), int(hi or lo)


def _sample_ids(text: str) -> set[str]:
    """``--sample-ids a,b``'s ids, each stripped (``"a, b"`` names b). One naming no id (``""``,
    from an empty shell variable) is an error, not the whole topic."""
    from asyncrl.ops.replay import ReplayError

    ids = {sid.strip() for sid in text.split(",")} - {""}
    if not ids:
        raise ReplayError(
            f"--sample-ids names no sample id ({text!r}): give them comma-separated, as a,b"
        )
    return ids
