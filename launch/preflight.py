"""Start-up checks: every value that can be found wrong before a process starts, is.

``check_startable(cfg, role)`` runs them and raises ConfigError naming each failing key;
``asyncrl run`` (the launcher), ``asyncrl train`` and ``asyncrl rollout`` call it before
starting anything, and ``asyncrl run --dry-run`` prints them: a bad value stops the command
at once, naming its key, instead of a role seconds into the run (and again at each restart).
The checks live by what they look at: ``preflight_agent`` (tools, interactions, the tool-call
format), ``preflight_files`` (the run's directory, the model, data and reward files) and
``preflight_machine`` (CUDA, extras, tracing, Kafka client settings, the rendezvous host) and
``preflight_ranks`` (a sharded trainer's ranks).

A check of the machine (CUDA, installed packages, files) runs where the process that needs it
runs: under ``launcher=ray`` the launcher leaves CUDA to the trainer's own ``asyncrl train``.
"""

from __future__ import annotations

from asyncrl.config import ConfigError, RunConfig
from asyncrl.launch.preflight_agent import interaction_checks, tool_checks
from asyncrl.launch.preflight_check import Check
from asyncrl.launch.preflight_files import (
    cache_dir_check,
    data_files_checks,
    model_length_checks,
    model_path_check,
    output_dir_check,
    reward_function_check,
)
from asyncrl.launch.preflight_machine import (
    cuda_checks,
    kafka_clients_check,
    kafka_security_checks,
    master_addr_check,
    package_check,
    tracing_check,
)
from asyncrl.launch.preflight_ranks import rank_checks
from asyncrl.launch.ray_placement import placement_checks

__all__ = ["ROLES", "Check", "check_startable", "dry_run", "idle_workers_note", "startup_checks"]

ROLES = ("run", "train", "rollout")


def _earlier_run(cfg: RunConfig) -> Check:
    """What the launch does with an earlier run in the run's directory, decided where the
    launcher decides it (``launch/resume.py``), so the dry run says what the launch will do."""
    from asyncrl.launch.resume import decide

    decision = decide(cfg)
    return Check(decision.key, decision.outcome != "refused", decision.line)


def _filter_metric(cfg: RunConfig) -> Check:
    """Dynamic sampling's metric is the reward, or a key a custom reward returns: the built-in
    rules return a float, so any other name would fail the trainer at its first sample."""
    from asyncrl.consumers.dynamic_sampling import REWARD_METRICS

    key, fg = "algorithm.filter_groups.metric", cfg.algorithm.filter_groups
    if not fg.enable or fg.metric in REWARD_METRICS:
        return Check(key, True, f"{fg.metric or 'score'}" if fg.enable else "unused")
    if cfg.custom_reward_function.path is None:
        return Check(
            key,
            False,
            f"{fg.metric!r}: the built-in reward returns a float, with no {fg.metric!r}: use "
            "score (or a custom_reward_function that returns it in a dict)",
        )
    return Check(key, None, f"{fg.metric!r}: your reward function must return it in a dict")


def startup_checks(cfg: RunConfig, role: str, rows: bool = False) -> list[Check]:
    """Every start-up check for ``role`` (run, train or rollout), passed or not; ``rows``:
    the data files' rows too (the dry run)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    here = role != "run" or cfg.launcher == "local"  # this process starts the one that needs it
    checks = [*tool_checks(cfg), *interaction_checks(cfg), model_path_check(cfg)]
    checks += model_length_checks(cfg)
    checks.append(reward_function_check(cfg, here))
    if role != "rollout":
        checks.append(_filter_metric(cfg))
        checks += data_files_checks(cfg, rows)
    checks += cuda_checks(cfg, role, here)
    if role != "rollout":
        checks += rank_checks(cfg, role, here)
    if role != "rollout" and "tensorboard" in cfg.trainer.logger:
        checks.append(package_check("trainer.logger", "tensorboard", "tensorboard"))
    if role == "run" and cfg.launcher == "ray":
        checks.append(package_check("launcher", "ray", "ray"))
        checks += placement_checks(cfg)
    checks.append(tracing_check(cfg))
    checks += kafka_security_checks(cfg)
    checks.append(kafka_clients_check(cfg))
    if role != "rollout":
        checks.append(output_dir_check(cfg))
    checks.append(cache_dir_check(cfg))
    checks.append(master_addr_check(cfg))
    if role == "run":
        checks.append(_earlier_run(cfg))
    return checks


def check_startable(cfg: RunConfig, role: str) -> list[Check]:
    """``startup_checks``, raising ConfigError naming every failing key."""
    checks = startup_checks(cfg, role)
    failed = [c for c in checks if c.ok is False]
    if failed:
        raise ConfigError(
            "cannot start: " + "; ".join(f"{c.key}: {c.detail}" for c in failed)
            if len(failed) == 1
            else "cannot start:\n" + "\n".join(f"  {c.key}: {c.detail}" for c in failed)
        )
    return checks


def idle_workers_note(cfg: RunConfig) -> str | None:
    """A warning when some workers can never generate: a version's sample budget is split among
    the workers a sample at a time, so past ``max_samples_per_version`` workers the rest get a
    share of 0 every version (docs/tuning.md, "Resource split": more workers stop paying there)."""
    workers = cfg.actor_rollout_ref.rollout.num_workers
    per_version = cfg.max_samples_per_version
    if workers <= per_version:
        return None
    return (
        f"rollout.num_workers={workers}, but a version admits at most {per_version} samples "
        "((1 + staleness_threshold) x trigger_parameter_sync_step x require_batches x "
        f"ppo_mini_batch_size) among its workers: {workers - per_version} worker(s) never "
        "get one to generate. Use fewer workers, or a larger version"
    )


def dry_run(config: str | None, overrides: list[str], role: str = "run") -> int:
    """``asyncrl run --dry-run``: the resolved config in asyncrl's names, the aliases applied,
    the keys ignored, and every start-up check; starts nothing. 0 when the run could start."""
    import yaml

    from asyncrl.config.load import load

    loaded = load(config, overrides)
    cfg = loaded.config()  # ConfigError: every problem, each naming its key
    report = loaded.report
    print(f"# resolved config (asyncrl's names, as {cfg.run_dir / 'config.yaml'} would hold it)")
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False).rstrip())
    sections = [
        ("aliases applied (verl's name -> asyncrl's)", report.alias_lines()),
        ("ignored (no effect in asyncrl)", report.ignored_lines()),
        ("values translated", report.notes),
    ]
    for title, lines in sections:
        print(f"# {title}: {len(lines) or 'none'}")
        for line in lines:
            print(f"  {line}")
    checks = startup_checks(cfg, role, rows=True)
    failed = [c for c in checks if c.ok is False]
    print(f"# start-up checks ({role}): {len(checks) - len(failed)} passed, {len(failed)} failed")
    for check in checks:
        print(f"  {check.line()}")
    if (idle := idle_workers_note(cfg)) is not None:
        print(f"# warning: {idle}")
    print("# dry run: nothing started" + ("" if not failed else "; the run would not start"))
    return 2 if failed else 0
