"""Start-up checks: every value that can be found wrong before a process starts, is.

``check_startable(cfg, role)`` runs them and raises ConfigError naming each failing key;
``asyncrl run`` (the launcher), ``asyncrl train`` and ``asyncrl rollout`` call it before
starting anything, and ``asyncrl run --dry-run`` prints them. Without these, a bad tool config
crash-looped a rollout worker 16 s into a run and ``trainer.device=cuda`` on a machine without
CUDA failed the trainer 14 s in, with an AssertionError.

A check of the machine (CUDA, installed packages, files) runs where the process that needs it
runs: under ``launcher=ray`` the launcher leaves CUDA to the trainer's own ``asyncrl train``.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, RunConfig

ROLES = ("run", "train", "rollout")


@dataclass
class Check:
    key: str
    ok: bool | None
    """None: not checked here (``detail`` says where it is)."""
    detail: str

    def line(self) -> str:
        mark = {True: "ok  ", False: "FAIL", None: "--  "}[self.ok]
        return f"{mark} {self.key}: {self.detail}"


def _tool_checks(cfg: RunConfig) -> list[Check]:
    """The tool config loads; with multi-turn on, the policy's tokenizer can also end a tool
    call in ``multi_turn.format`` (the compact format stops at a ``]`` token, which the
    arithmetic task's tokenizer lacks: the roles would fail at start-up, again at each
    restart). A model that does not load is reported by its own check."""
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable and mt.tool_config_path is None:
        return [Check(key, True, "unused (multi_turn.enable=false)")]
    from asyncrl.producers.tools.registry import ToolConfigError, load_tools, shipped_tools_path

    path = Path(mt.tool_config_path).expanduser() if mt.tool_config_path else shipped_tools_path()
    try:
        tools = load_tools(path)
    except ToolConfigError as err:
        return [Check(key, False, str(err))]  # it names the file
    checks = [Check(key, True, f"{path}: tools {', '.join(sorted(tools))}")]
    if mt.enable:
        checks += _tool_call_format(cfg, tools)
    return checks


def _interaction_checks(cfg: RunConfig) -> list[Check]:
    """The interaction config loads (each class imports and is built, as every worker and the
    trainer's evaluation build it), and the built-in tasks' prompts, which carry no
    interaction_kwargs, can pick one: only where there is one. A data file's rows are checked
    with the rows (``tasks.files.checked_rows``)."""
    from asyncrl.producers.agent.interaction import KEY, load_interactions
    from asyncrl.producers.tools.registry import ConfigFileError

    path = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if path is None:
        return []
    try:
        names = list(load_interactions(path))
    except ConfigFileError as err:
        return [Check(KEY, False, str(err))]  # it names the file and the entry
    if not cfg.data.from_files and len(names) > 1:
        return [
            Check(
                KEY,
                False,
                f"{path}: interactions {', '.join(names)}, and data.task={cfg.data.task}'s "
                "prompts name none (extra_info.interaction_kwargs.name): keep one, or train "
                "on data files whose rows name theirs",
            )
        ]
    return [Check(KEY, True, f"{path}: interactions {', '.join(names)}")]


HERMES_CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
"""A hermes call: its markup and JSON must survive the tokenizer for a model to write one."""


def _spells(tokenizer: Any, text: str) -> None:
    """ValueError if ``text`` has characters the tokenizer turns into its unknown token (the
    built-in model's, which knows digits and operators): the model cannot write it."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    unk = tokenizer.unk_token_id
    if unk is not None and unk in ids:
        raise ValueError(
            f"the tokenizer cannot write a tool call {text!r} (it reads back as "
            f"{tokenizer.decode(ids)[:40]!r}...); the built-in model writes format=compact"
        )


def _tool_call_format(cfg: RunConfig, tools: dict[str, Any]) -> list[Check]:
    from asyncrl.models.policy import load_tokenizer
    from asyncrl.producers.agent.loop import stop_token_ids
    from asyncrl.producers.agent.parser import make_parser

    key = "actor_rollout_ref.rollout.multi_turn.format"
    fmt = cfg.actor_rollout_ref.rollout.multi_turn.format
    try:
        tokenizer = load_tokenizer(cfg)
    except Exception:  # a bad model: its own check says so
        return []
    try:
        stop_token_ids(tokenizer, make_parser(fmt, tools))
        if fmt == "hermes":
            _spells(tokenizer, HERMES_CALL)
    except ValueError as err:
        if cfg.actor_rollout_ref.model.path:
            whose = f"{cfg.actor_rollout_ref.model.path}'s tokenizer"
        elif fmt == "hermes":  # no built-in tokenizer spells JSON
            whose = f"data.task={cfg.data.task}'s tokenizer"
        else:  # the built-in tokenizers are the tasks' characters
            whose = f"data.task={cfg.data.task}'s tokenizer; data.task=calculator has the tokens"
        return [Check(key, False, f"{fmt}: {err} ({whose})")]
    return [Check(key, True, f"{fmt}: the tokenizer ends a tool call")]


def _cuda(cfg: RunConfig, role: str, here: bool) -> list[Check]:
    """The keys that need CUDA in the processes ``role`` starts (a worker does not need the
    trainer's GPU, nor the trainer a worker's)."""
    wants: dict[str, bool] = {}
    if role != "rollout":
        wants["trainer.device"] = cfg.trainer.device == "cuda"
        wants["sync.backend"] = cfg.sync.backend == "nccl"
    if role != "train":
        wants["actor_rollout_ref.rollout.device"] = cfg.actor_rollout_ref.rollout.device == "cuda"
    if not any(wants.values()):
        if role == "rollout":
            return []
        return [Check("trainer.device", True, f"{cfg.trainer.device} (no CUDA needed)")]
    if not here:
        return [
            Check(k, None, "checked by the trainer's or worker's own process (launcher=ray)")
            for k, want in wants.items()
            if want
        ]
    import torch

    available = torch.cuda.is_available()
    why = (
        f"{torch.cuda.device_count()} GPU(s)"
        if available
        else f"CUDA is not available here (torch {torch.__version__}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"
    )
    value = {"sync.backend": "nccl"}
    return [
        Check(k, available, f"{value.get(k, 'cuda')}: {why}") for k, want in wants.items() if want
    ]


def _package(key: str, module: str, extra: str) -> Check:
    if importlib.util.find_spec(module) is None:
        return Check(key, False, f"needs {module}: pip install 'asyncrl[{extra}]'")
    return Check(key, True, f"{module} is installed")


def _tracing(cfg: RunConfig) -> Check:
    """The span exporter can be made (OTEL_TRACES_EXPORTER names one asyncrl has, the gRPC
    exporter is installed for OTEL_EXPORTER_OTLP_PROTOCOL=grpc); for OTLP, whether a
    collector answers (the dry run said "ok" of a run that would then trace nothing)."""
    from asyncrl.telemetry import tracing

    if not tracing.enabled_by(cfg):
        return Check("tracing.enabled", True, "off")
    problem = tracing.exporter_problem(cfg)
    if problem is not None:
        return Check("tracing.exporter", False, problem)
    kinds = tracing.exporter_kinds(cfg)
    detail = ",".join(kinds)
    if (missing := tracing.missing_collector(cfg)) is not None:  # the run still starts
        others = [kind for kind in kinds if kind != "otlp"]  # what init_tracing keeps
        outcome = f"sends its spans to {', '.join(others)} only" if others else "traces nothing"
        detail += (
            f"; no OTLP collector answers at {missing} now: unless one does when the run "
            f"starts, each process warns and {outcome}"
        )
    return Check("tracing.exporter", True, detail)


def _kafka_security(cfg: RunConfig) -> list[Check]:
    from asyncrl.kafka import MissingSecret, security_settings

    sec = cfg.kafka.security
    checks = []
    try:
        security_settings(cfg.kafka)
        checks.append(Check("kafka.security.protocol", True, sec.protocol))
    except MissingSecret as err:
        checks.append(Check("kafka.security.sasl_password_env", False, str(err)))
    for name in ("ssl_ca_location", "ssl_certificate_location", "ssl_key_location"):
        value = getattr(sec, name)
        if value and sec.protocol.endswith("SSL") and not Path(value).is_file():
            checks.append(Check(f"kafka.security.{name}", False, f"{value}: no such file"))
    return checks


def _kafka_clients(cfg: RunConfig) -> Check:
    """librdkafka's own checks of the client settings (``kafka.extra`` and the kafka.* values
    they are made from), made without a broker."""
    from asyncrl.kafka import MissingSecret
    from asyncrl.kafka.settings import client_settings_problem

    try:
        problem = client_settings_problem(cfg.kafka)
    except MissingSecret:  # its own check says so
        return Check("kafka.extra", None, "not checked: the SASL password is not set")
    if problem is not None:
        key, text = problem
        return Check(key, False, f"librdkafka refuses the client settings: {text}")
    return Check("kafka.extra", True, "librdkafka accepts the client settings")


RUN_SUBDIRS = ("checkpoints", "logs", "log")
"""What a run writes under its directory; one already there may be elsewhere (a link, a mount)."""


def _output_dir(cfg: RunConfig) -> Check:
    """The run's directory, and those of its subdirectories already there: a read-only
    ``checkpoints`` (a link to another disk) crashed the trainer at its lock with a traceback,
    restarted ``trainer.max_restarts`` times."""
    problem = _unwritable_dir(cfg.run_dir)
    if problem:
        return Check("output_dir", False, f"{cfg.run_dir}: {problem}")
    for path in (cfg.run_dir / sub for sub in RUN_SUBDIRS):
        if path.is_dir():
            problem = _unwritable_dir(path)
        elif path.exists() or path.is_symlink():  # a file, a link to nowhere
            problem = "not a directory"
        if problem:
            return Check("output_dir", False, f"{path}: {problem}")
    return Check("output_dir", True, f"{cfg.run_dir} (writable)")


def _cache_dir(cfg: RunConfig) -> Check:
    """The demo policy is cached there once warm-started (a minute of work lost otherwise)."""
    key = "actor_rollout_ref.model.cache_dir"
    if cfg.actor_rollout_ref.model.path is not None:
        return Check(key, True, "unused (model.path is set)")
    from asyncrl.models.cache import policy_dir

    where = policy_dir(cfg).parent
    problem = _unwritable_dir(where)
    if problem:
        return Check(key, False, f"{where}: {problem}")
    return Check(key, True, f"{where} (writable)")


def _unwritable_dir(path: Path) -> str | None:
    """Why a directory could not be made or written at ``path`` (None: it can). The nearest
    existing ancestor must be a directory in which one can create a directory: tried, then
    removed (``os.access`` says yes to root in /proc)."""
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".asyncrl-check-", dir=parent))
    except OSError as err:
        return f"cannot create a directory in {parent} ({err.strerror or err})"
    return None


def _earlier_run(cfg: RunConfig) -> Check:
    """What the launch does with an earlier run in the run's directory, decided where the
    launcher decides it (``launch/resume.py``): --dry-run said ok to a resume that changed a
    key the run cannot change, which the launch then refused."""
    from asyncrl.launch.resume import decide

    decision = decide(cfg)
    return Check(decision.key, decision.outcome != "refused", decision.line)


def _master_addr(cfg: RunConfig) -> Check:
    """The weight collective's rendezvous host: a name that does not resolve left every
    process retrying it silently (c10d logs only)."""
    key, addr = "sync.master_addr", cfg.sync.master_addr
    try:
        socket.getaddrinfo(addr, None)
    except (OSError, UnicodeError) as err:
        return Check(key, False, f"{addr!r} does not resolve ({err})")
    return Check(key, True, f"{addr} resolves")


def _model_path(cfg: RunConfig) -> Check:
    from asyncrl.models.policy import PATH_KEY, check_model_path

    path = cfg.actor_rollout_ref.model.path
    if path is None:
        return Check(PATH_KEY, True, "unset: the built-in tiny model")
    problem = check_model_path(cfg)
    return Check(PATH_KEY, problem is None, problem or f"{path}: a Hugging Face checkpoint")


def _model_length(cfg: RunConfig) -> list[Check]:
    """A prompt and its response fit the checkpoint's positions (vLLM refuses a longer
    max_model_len too): a GPT-2-style model with learned positions failed the trainer and
    the workers with IndexError at their first long sequence, and the run after 3 restarts."""
    from asyncrl.models.policy import check_model_path, max_positions

    path = cfg.actor_rollout_ref.model.path
    if path is None or check_model_path(cfg) is not None:
        return []
    declared = max_positions(path, cfg.actor_rollout_ref.model.override_config)
    if declared is None:
        return []
    name, limit = declared
    data = cfg.data
    longest = data.max_prompt_length + data.max_response_length
    key = "data.max_response_length"
    if longest <= limit:
        return [Check(key, True, f"prompt and response, {longest} tokens, within {name}={limit}")]
    return [
        Check(
            key,
            False,
            f"data.max_prompt_length + data.max_response_length = {data.max_prompt_length} + "
            f"{data.max_response_length} = {longest} tokens, more than the model takes "
            f"({name}={limit} in {path}/config.json or actor_rollout_ref.model.override_config)"
            ": shorten them",
        )
    ]


def _data_files(cfg: RunConfig, rows: bool = False) -> list[Check]:
    """Each file there, parquet, with the prompt (data.prompt_key) and reward columns: what the
    launcher's read of the rows would stop on, found from the files' footers before it starts.
    ``rows`` (the dry run): every row too, malformed values, no rows, a data_source no reward
    scores, and each prompt through the policy's tokenizer (chat messages with no chat
    template, every prompt over data.max_prompt_length): a real run finds those in its set-up
    (``tasks.files.load_split``), which reads the rows anyway: not read twice there."""
    if not cfg.data.from_files:
        return []
    from asyncrl.models.policy import check_model_path, load_tokenizer
    from asyncrl.producers.agent.data import checked_rows, load_split
    from asyncrl.tasks.files import check_file

    tokenizer = None
    if rows and check_model_path(cfg) is None:  # a bad model.path fails its own check
        tokenizer = load_tokenizer(cfg)
    checks = []
    for split, paths in (("train", cfg.data.train_paths), ("val", cfg.data.val_paths)):
        key = f"data.{split}_files"
        problems = [p for p in (check_file(path, cfg.data.prompt_key) for path in paths) if p]
        if problems:
            checks.append(Check(key, False, "; ".join(problems)))
            continue
        detail = ", ".join(paths)
        if rows:
            try:
                read = checked_rows(cfg, split)
                detail += f" ({len(read)} rows"
                if tokenizer is not None:
                    too_long = load_split(cfg, split, tokenizer, read).too_long
                    detail += (
                        f", {too_long} longer than data.max_prompt_length="
                        f"{cfg.data.max_prompt_length} tokens after the chat template: left out"
                        if too_long
                        else ""
                    )
                detail += ")"
            except ConfigError as err:
                checks.append(Check(key, False, str(err).removeprefix(f"{key}: ")))
                continue
        checks.append(Check(key, True, detail))
    return checks


def _reward_function(cfg: RunConfig, here: bool) -> Check:
    crf = cfg.custom_reward_function
    if crf.path is None:
        return Check("custom_reward_function.path", True, "unset: the task's built-in rule")
    if not here:
        return Check("custom_reward_function.path", None, "checked by each rollout worker")
    from asyncrl.producers.reward import check_reward_function

    problem = check_reward_function(cfg)
    if problem is not None:
        return Check(problem[0], False, problem[1])
    return Check("custom_reward_function.path", True, f"{crf.path}: {crf.name} loads")


def _filter_metric(cfg: RunConfig) -> Check:
    """Dynamic sampling's metric is the reward, or a key a custom reward returns: the built-in
    rules return a float, so any other name failed the trainer at its first sample."""
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
    checks = [*_tool_checks(cfg), *_interaction_checks(cfg), _model_path(cfg)]
    checks += _model_length(cfg)
    checks.append(_reward_function(cfg, here))
    if role != "rollout":
        checks.append(_filter_metric(cfg))
        checks += _data_files(cfg, rows)
    checks += _cuda(cfg, role, here)
    if role != "rollout" and "tensorboard" in cfg.trainer.logger:
        checks.append(_package("trainer.logger", "tensorboard", "tensorboard"))
    if role == "run" and cfg.launcher == "ray":
        checks.append(_package("launcher", "ray", "ray"))
    checks.append(_tracing(cfg))
    checks += _kafka_security(cfg)
    checks.append(_kafka_clients(cfg))
    if role != "rollout":
        checks.append(_output_dir(cfg))
    checks.append(_cache_dir(cfg))
    checks.append(_master_addr(cfg))
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
