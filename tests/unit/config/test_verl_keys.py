"""verl's keys load (issue 19, point 4): a verl launch script's overrides and verl's fully async
YAML are accepted, aliased, ignored with a warning, or refused with a reason, never rejected as
a bare "extra input"; unknown keys name the nearest valid key and their file; Hydra's syntax;
``asyncrl run --dry-run``; start-up checks that fail before anything starts, naming the key."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from asyncrl.config import ConfigError, dump_config, load_config, verl_keys
from asyncrl.config.keys import our_key
from asyncrl.config.load import load
from asyncrl.launch.preflight import check_startable, startup_checks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "verl"
DAPO = FIXTURES / "dapo_7b_math_fsdp2_8_8.overrides"
FULLY_ASYNC_YAML = FIXTURES / "fully_async_ppo_trainer.yaml"


def _lines(path: Path) -> list[str]:
    return [x for x in path.read_text().splitlines() if x.strip() and not x.startswith("#")]


@pytest.fixture
def empty_config(tmp_path: Path) -> Path:
    """A config file setting nothing, so every decision comes from what a test passes."""
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    return path


def _counts(decisions) -> dict[str, int]:
    kinds = ("accepted", "aliased", "ignored", "refused", "unknown")
    return {k: sum(d.kind == k for d in decisions) for k in kinds}


# Refused because asyncrl lacks the feature today (dataset files, a Hugging Face model); each
# that becomes one of asyncrl's own keys moves from refused to accepted.
MAY_BECOME_OURS = [
    "data.train_files",
    "data.val_files",
    "data.prompt_key",
    "actor_rollout_ref.model.path",
    "actor_rollout_ref.model.override_config.max_position_embeddings",
]


def test_every_override_of_verls_dapo_script_is_classified(empty_config: Path) -> None:
    overrides = _lines(DAPO)
    assert len(overrides) == 83
    loaded = load(empty_config, overrides)
    counts = _counts(loaded.report.decisions)
    print(f"\nverl DAPO fully async script, {len(overrides)} overrides: {counts}")
    ours = sum(our_key(k) is not None for k in MAY_BECOME_OURS)
    # accepted: actor.use_dynamic_bsz, ppo_max_token_len_per_gpu, trainer.resume_mode (it was
    # ignored at auto), clip_ratio_*, kl_loss_*, entropy_coeff, optim.lr_warmup_steps,
    # rollout.val_kwargs.temperature, top_p, top_k, rollout.name=vllm with its knobs
    # gpu_memory_utilization, enable_chunked_prefill, max_num_batched_tokens, and
    # trainer.nnodes, trainer.n_gpus_per_node (the trainer's ranks): asyncrl's
    assert counts == {
        "accepted": 36 + ours,
        # aliased: DAPO's overlong_buffer_cfg.* and max_resp_len (algorithm.overlong_buffer),
        # trainer.default_local_dir (output_dir, refused unless its last part is the run_id)
        "aliased": 10,
        # ignored: actor.strategy=fsdp2, fsdp_config.fsdp_size=2, reward_manager=dapo, ...
        "ignored": 32,
        "refused": 5 - ours,
        "unknown": 0,
    }
    if loaded.report.of("refused"):
        with pytest.raises(ConfigError) as err:
            load_config(empty_config, overrides)
        message = str(err.value)
        assert "Extra inputs are not permitted" not in message
        for d in loaded.report.of("refused"):
            assert f"{d.key}=" in message and "not supported by asyncrl" in message
    assert "actor_rollout_ref.rollout.name" in {d.key for d in loaded.report.of("accepted")}
    ignored = {d.key: d.why for d in loaded.report.of("ignored")}
    for key in (
        "actor_rollout_ref.actor.strategy",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size",
    ):
        assert "the same updates as asyncrl's trainer" in ignored[key]
    with pytest.raises(ConfigError, match="actor.strategy=megatron .*accepted: fsdp or fsdp2"):
        load_config(empty_config, ["actor_rollout_ref.actor.strategy=megatron"])
    aliased = {d.key: (d.target, d.result) for d in loaded.report.of("aliased")}
    assert aliased["actor_rollout_ref.actor.grad_clip"] == (
        "actor_rollout_ref.actor.optim.grad_clip",
        1.0,
    )
    # 51200 samples, capped by 10 epochs of data.train_size=2000, in steps of 32 x 4 samples
    assert aliased["rollout.total_rollout_steps"] == ("trainer.total_training_steps", 156)
    assert aliased["rollout.test_freq"] == ("trainer.test_freq", 40)  # 10 versions x 4 steps


def test_the_dapo_script_loads_once_its_refused_keys_are_dropped(empty_config: Path) -> None:
    loaded = load(empty_config, _lines(DAPO))
    refused = {d.key for d in loaded.report.of("refused")}
    kept = [o for o in _lines(DAPO) if o.lstrip("+").partition("=")[0] not in refused]
    cfg = load_config(empty_config, kept)
    assert cfg.output_dir.startswith("/home/user/verl/ckpts/DAPO/")  # default_local_dir
    assert cfg.trainer.save_freq == 0  # verl's -1 (never)
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.actor.clip_range == (0.2, 0.28)  # DAPO's clip-higher
    assert cfg.actor_rollout_ref.actor.clip_ratio_c == 10.0
    assert cfg.trainer.total_training_steps == 156
    assert cfg.trainer.logger == ["console", "tensorboard"]


def test_verls_fully_async_yaml_loads_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    loaded = load(FULLY_ASYNC_YAML)
    counts = _counts(loaded.report.decisions)
    print(f"\nverl fully_async_ppo_trainer.yaml, {len(loaded.report.decisions)} keys: {counts}")
    assert counts == {"accepted": 7, "aliased": 5, "ignored": 11, "refused": 0, "unknown": 0}
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        cfg = load_config(FULLY_ASYNC_YAML)
    assert cfg.async_training.staleness_threshold == 0.1
    assert cfg.async_training.trigger_parameter_sync_step == 4
    assert cfg.async_training.use_trainer_do_validate is False  # the rollout side validates
    assert cfg.sync.bucket_size_mb == 4096  # checkpoint_engine.device_buffer_size_M
    assert cfg.trainer.total_training_steps == 100 // 8  # total_rollout_steps // (8 x 1)
    assert cfg.trainer.test_freq == 4  # every version = 4 steps
    warning = caplog.text
    for key in ("defaults=", "hydra.searchpath=", "rollout.n_gpus_per_node=8", "rollout.n=4"):
        assert f"ignored {key}" in warning
    assert str(FULLY_ASYNC_YAML) in warning
    dump_config(cfg, tmp_path / "config.yaml")
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert "rollout" not in resolved and "checkpoint_engine" not in resolved["async_training"]
    assert resolved["sync"]["bucket_size_mb"] == 4096


def test_the_fully_async_keys_the_issue_names(empty_config: Path) -> None:
    cfg = load_config(empty_config, ["async_training.compute_prox_log_prob=true"])
    assert cfg.async_training.compute_prox_log_prob
    cfg = load_config(
        empty_config,
        [
            "async_training.use_trainer_do_validate=true",
            "async_training.checkpoint_engine.enable=false",
            "async_training.checkpoint_engine.device_buffer_size_M=128",
            "async_training.checkpoint_engine.overlap_broadcast_and_consume=true",
        ],
    )
    assert cfg.sync.bucket_size_mb == 128


def test_total_epochs_counts_the_rows_of_your_data_files(
    empty_config: Path, tmp_path: Path
) -> None:
    """verl's trainer.total_epochs with data.train_files: an epoch was data.train_size (2000,
    the built-in task's) prompts whatever the files held: 2 epochs of 64 rows at 8 prompts a
    step ran 500 steps, not 16."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = []
    for name, n in (("a", 64), ("b", 16)):
        paths.append(tmp_path / f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist([{"x": i} for i in range(n)]), paths[-1])
    val = f"data.val_files={paths[1]}"
    one = [f"data.train_files={paths[0]}", "actor_rollout_ref.actor.ppo_mini_batch_size=8", val]
    cfg = load_config(empty_config, [*one, "trainer.total_epochs=2"])
    assert cfg.trainer.total_training_steps == 2 * 64 // 8
    both = [f"data.train_files=[{paths[0]},{paths[1]}]", "rollout.total_epochs=1", *one[1:]]
    assert load_config(empty_config, both).trainer.total_training_steps == 80 // 8
    task = ["actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.total_epochs=2"]
    assert load_config(empty_config, task).trainer.total_training_steps == 2 * 2000 // 8


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.total_rollout_steps=-5", "a count of at least 1 is needed, not -5"),
        ("rollout.total_rollout_steps=0", "a count of at least 1 is needed, not 0"),
        ("rollout.total_rollout_steps=1.7", "a whole number is needed, not 1.7"),
        ("rollout.total_rollout_steps=true", "a whole number is needed, not true"),
        ("trainer.total_epochs=0", "a count of at least 1 is needed, not 0"),
        ("rollout.test_freq=2.5", "a whole number is needed, not 2.5"),
        ("rollout.test_freq=true", "a whole number is needed, not true"),
    ],
)
def test_a_verl_count_that_is_not_one_is_refused_naming_the_key(
    empty_config: Path, override: str, message: str
) -> None:
    """int() took them: total_rollout_steps of -5, 0, 1.7 or true ran one step, total_epochs=0
    one step, rollout.test_freq=2.5 validated every 8 steps (2 x 4) and true every 4. Found by
    a tuning walkthrough."""
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=\S+ \(command line\): cannot convert") as err:
        load_config(empty_config, ["async_training.trigger_parameter_sync_step=4", override])
    assert message in str(err.value)


def test_verls_null_counts_leave_asyncrls_keys_as_they_are(empty_config: Path) -> None:
    """verl's YAML has total_rollout_steps: null (count from the epochs) and a launch script may
    null test_freq: with no number at all this was "min() arg is an empty sequence" or an int()
    TypeError. Now null sets nothing, as verl's null does; a cap beside it still applies."""
    nulls = ["rollout.total_rollout_steps=null", "rollout.test_freq=null"]
    cfg = load_config(empty_config, ["trainer.total_training_steps=50", *nulls])
    assert (cfg.trainer.total_training_steps, cfg.trainer.test_freq) == (50, 5)
    capped = ["actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.total_epochs=1"]
    assert load_config(empty_config, [*nulls, *capped]).trainer.total_training_steps == 2000 // 8
    assert (
        load_config(
            empty_config, ["rollout.total_rollout_steps=2e3", *capped[:1]]
        ).trainer.total_training_steps
        == 250
    )


def test_verls_gsm8k_truncation_error_loads_with_data_files(
    empty_config: Path, tmp_path: Path
) -> None:
    """verl's gsm8k/math scripts set data.truncation='error' beside
    data.filter_overlong_prompts=True: refused, saying asyncrl keeps a long prompt's last
    tokens, which a prompt of data.train_files never had (it is left out, never cut)."""
    files = [
        f"data.train_files={tmp_path / 't.parquet'}",
        f"data.val_files={tmp_path / 'v.parquet'}",
    ]
    verl = ["data.truncation=error", "data.filter_overlong_prompts=true"]
    load_config(empty_config, [*files, *verl])
    with pytest.raises(ConfigError, match=r"data.truncation=error .*accepted: left, or error with"):
        load_config(empty_config, verl)  # a built-in task's prompt is cut: its last tokens
    with pytest.raises(ConfigError, match="data.truncation=right"):
        load_config(empty_config, [*files, "data.truncation=right"])


def test_verls_rollout_correction_and_dapo_keys_are_asyncrls_own(empty_config: Path) -> None:
    """Issue 17: verl's decoupled-mode rollout correction and DAPO's filter_groups, as a verl
    launch script sets them (the mode (d) recipe of verl's fully async README); verl's bypass
    mode is the one thing refused."""
    overrides = [
        "async_training.compute_prox_log_prob=True",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0",
        "algorithm.rollout_correction.rollout_is_batch_normalize=False",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.01",
        "algorithm.rollout_correction.bypass_mode=False",
        "algorithm.rollout_correction.loss_type=ppo_clip",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=acc",
        "algorithm.filter_groups.max_num_gen_batches=10",
    ]
    loaded = load(empty_config, overrides)
    assert _counts(loaded.report.decisions)["accepted"] == 9
    cfg = load_config(empty_config, overrides)
    rc, fg = cfg.algorithm.rollout_correction, cfg.algorithm.filter_groups
    assert (rc.rollout_is, rc.rollout_rs, rc.rollout_rs_threshold) == ("token", "seq_mean_k3", 0.01)
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "acc", 10)
    with pytest.raises(ConfigError, match="bypass_mode=true"):
        load_config(empty_config, [*overrides, "algorithm.rollout_correction.bypass_mode=true"])


def test_an_unknown_key_names_the_nearest_key_and_its_file(
    tmp_path: Path, empty_config: Path
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(empty_config, ["trainer.total_training_stepz=3"])
    assert (
        "unknown key trainer.total_training_stepz (command line): nearest valid key: "
        "trainer.total_training_steps"
    ) in str(err.value)
    bad = tmp_path / "mine.yaml"
    bad.write_text("async_training:\n  staleness_treshold: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert (
        f"unknown key async_training.staleness_treshold ({bad}): nearest valid key: "
        "async_training.staleness_threshold"
    ) in str(err.value)


def test_hydra_add_and_override_syntax(empty_config: Path) -> None:
    cfg = load_config(
        None,
        [
            "+trainer.total_training_steps=7",
            "++actor_rollout_ref.actor.grad_clip=0.5",
            "~trainer.target_accuracy",  # default.yaml sets 0.9
            "++kafka.extra.socket.timeout.ms=1000",
        ],
    )
    assert cfg.trainer.total_training_steps == 7
    assert cfg.actor_rollout_ref.actor.optim.grad_clip == 0.5
    assert cfg.trainer.target_accuracy is None
    assert cfg.kafka.extra == {"socket.timeout.ms": 1000}


def test_defaults_and_hydra_sections_are_ignored_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "verl_style.yaml"
    path.write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "hydra:\n  run:\n    dir: outputs/${now:%Y-%m-%d}\n"  # Hydra's own resolver: not read
        "trainer:\n  total_training_steps: 3\n"
    )
    loaded = load(path)
    assert loaded.config().trainer.total_training_steps == 3
    ignored = {d.key: d.why for d in loaded.report.of("ignored")}
    assert "Hydra defaults list is not read" in ignored["defaults"]
    assert "hydra.run.dir" in ignored
    assert "defaults=[ppo_trainer, _self_]" in (loaded.report.warning() or "")


def test_interpolations_resolve_or_fail_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "interp.yaml"
    path.write_text(
        "data:\n  max_prompt_length: 12\n  max_response_length: ${data.max_prompt_length}\n"
        "actor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: ${oc.select:nope.key, 4}\n"
        "    optim:\n      lr: ${..clip_ratio}\n"  # relative: actor.clip_ratio (default 0.2)
        "run_id: run-${trainer.total_training_steps}\n"  # asyncrl's default, in a string
    )
    cfg = load_config(path)
    assert cfg.data.max_response_length == 12
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert cfg.actor_rollout_ref.actor.optim.lr == 0.2
    assert cfg.run_id == "run-100"
    for line, message in [
        ("trainer:\n  seed: ${oc.eval:1+1}\n", "resolver 'oc.eval' is not supported"),
        ("trainer:\n  seed: ${no.such.key}\n", "${no.such.key} is not set"),
        ("trainer:\n  seed: ${trainer.seed}\n", "refers to itself"),
    ]:
        path.write_text(line)
        with pytest.raises(ConfigError) as err:
            load_config(path)
        assert f"trainer.seed ({path}): interpolation" in str(err.value)
        assert message in str(err.value)


def test_verl_values_of_our_keys_are_translated_or_refused(
    empty_config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        cfg = load_config(empty_config, ["trainer.save_freq=-1", "trainer.logger=[console,wandb]"])
    assert cfg.trainer.save_freq == 0 and cfg.trainer.logger == ["console"]
    assert "ignored wandb" in caplog.text and "verl's -1 (never)" in caplog.text
    with pytest.raises(ConfigError, match="rollout.name=sglang .*no SGLang/TensorRT-LLM engine"):
        load_config(empty_config, ["actor_rollout_ref.rollout.name=sglang"])
    with pytest.raises(ConfigError, match="optim.optimizer=SGD .*asyncrl's optimizer is AdamW"):
        load_config(empty_config, ["actor_rollout_ref.actor.optim.optimizer=SGD"])
    cfg = load_config(empty_config, ["actor_rollout_ref.actor.optim.optimizer=AdamW"])
    assert cfg.actor_rollout_ref.actor.optim.lr == 3e-4


def test_verls_other_advantage_estimators_are_refused_with_a_reason(empty_config: Path) -> None:
    """verl's PPO scripts (algorithm.adv_estimator=gae) stopped on pydantic's "Input should be
    'grpo' (got 'gae')", without the key=value as written, nor why."""
    for value, why in (("gae", "PPO with a critic"), ("rloo", "does not compute")):
        with pytest.raises(ConfigError) as err:
            load_config(empty_config, [f"algorithm.adv_estimator={value}"])
        message = str(err.value)
        assert (
            f"algorithm.adv_estimator={value} (command line): not supported by asyncrl: {value} is"
        ) in message
        assert why in message and "only estimator is grpo" in message
        assert "Input should be" not in message
    assert load_config(empty_config, ["algorithm.adv_estimator=grpo"]).algorithm.adv_estimator


def test_a_verl_config_that_leaves_the_estimator_unset_is_told_grpo_runs(
    empty_config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's default estimator is gae (PPO with a critic): a verl script or YAML that does
    not set algorithm.adv_estimator trained PPO in verl and GRPO in asyncrl, without a word."""
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        load_config(FULLY_ASYNC_YAML)
    lines = [x for x in caplog.text.splitlines() if "algorithm.adv_estimator" in x]
    assert len(lines) == 1, caplog.text
    assert "verl's default is gae" in lines[0] and "asyncrl runs grpo" in lines[0]
    verl_key = "actor_rollout_ref.rollout.n_gpus_per_node=8"  # verl's own, ignored
    assert any("adv_estimator" in n for n in load(empty_config, [verl_key]).report.notes)
    for quiet in (  # the estimator set, or asyncrl's own keys only: nothing to say
        load(empty_config, [verl_key, "algorithm.adv_estimator=grpo"]),
        load(None),
        load("calculator", ["trainer.save_freq=-1"]),
    ):
        assert not any("adv_estimator" in n for n in quiet.report.notes)


def test_verls_null_and_empty_values_of_refused_keys_are_ignored(tmp_path: Path) -> None:
    """A copy of verl's ppo_trainer.yaml holds data.tokenizer: null, model.custom_chat_template:
    null, model.override_config: {}, rollout.engine_kwargs.vllm: {}, ...: each was refused as
    an option asyncrl lacks, though null and {} say the option is not used."""
    path = tmp_path / "verl.yaml"
    path.write_text(
        "data:\n  tokenizer: null\n  custom_cls:\n    path: null\n    name: null\n"
        "actor_rollout_ref:\n  model:\n    custom_chat_template: null\n    override_config: {}\n"
        "  rollout:\n    quantization: null\n    engine_kwargs:\n      vllm: {}\n"
        "trainer:\n  default_local_dir: null\n"
    )
    loaded = load(path)
    assert not loaded.problems
    # override_config is asyncrl's, default_local_dir an alias of output_dir (null: as it is)
    assert _counts(loaded.report.decisions)["ignored"] == 6
    why = {d.key: d.why for d in loaded.report.of("ignored")}
    assert why["data.tokenizer"].startswith("null: not used (another value is refused: ")
    with pytest.raises(ConfigError, match="data.tokenizer=/models/tok .*not supported by asyncrl"):
        load_config(path, ["data.tokenizer=/models/tok"])
    with pytest.raises(ConfigError, match="did you mean actor_rollout_ref.actor.optim.lr"):
        load_config(path, ["actor_rollout_ref.actor.optim.lrr=null"])  # a typo: no verl null


def test_dapos_overlong_buffer_keys_reach_the_reward_shaping(empty_config: Path) -> None:
    """recipe/dapo's scripts set reward_model.overlong_buffer.enable=True (DAPO's length
    penalty): it was ignored as "the reward model's settings", so the run trained without it;
    it is algorithm.overlong_buffer now (producers/scoring.py applies it)."""
    buffer = [
        "data.max_response_length=8192",
        "reward_model.overlong_buffer.len=4096",
        "reward_model.overlong_buffer.penalty_factor=1",
    ]
    cfg = load_config(empty_config, ["reward_model.overlong_buffer.enable=True", *buffer])
    assert cfg.algorithm.overlong_buffer.enable and cfg.algorithm.overlong_buffer.len == 4096
    cfg = load_config(empty_config, ["reward_model.overlong_buffer.enable=False", *buffer])
    assert not cfg.algorithm.overlong_buffer.enable


def test_every_key_of_verls_ppo_trainer_config_is_known() -> None:
    keys = _lines(FIXTURES / "ppo_trainer_keys.txt")
    assert len(keys) > 500
    unknown = [k for k in keys if our_key(k) is None and verl_keys.lookup(k) is None]
    assert not unknown


def test_no_key_of_verls_ppo_trainer_config_reads_as_a_typo(empty_config: Path) -> None:
    """verl's own actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 (and .seed=42) was refused
    as "no such key: did you mean actor_rollout_ref.actor.fsdp_config.dtype?": the whole dotted
    keys are alike, their last parts are not."""
    for key in _lines(FIXTURES / "ppo_trainer_keys.txt"):
        loaded = load(empty_config, [f"{key}=12345"])
        assert not [p for p in loaded.problems if "did you mean" in p], key
    with pytest.raises(ConfigError, match="did you mean actor_rollout_ref.actor.fsdp_config.dtype"):
        load_config(empty_config, ["actor_rollout_ref.actor.fsdp_config.dtyp=bf16"])


def test_dry_run_prints_everything_and_starts_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *[sys.executable, "-m", "asyncrl", "run", "--dry-run"],
            *["run_id=dry", f"output_dir={tmp_path / 'runs'}", "kafka.bootstrap_servers=x:1"],
            *["actor_rollout_ref.actor.grad_clip=0.5", "trainer.project_name=DAPO"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "ASYNCRL_DEBUG"},
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    resolved = yaml.safe_load(text.split("# aliases applied")[0])
    assert resolved["actor_rollout_ref"]["actor"]["optim"]["grad_clip"] == 0.5
    assert "grad_clip" not in resolved["actor_rollout_ref"]["actor"]
    assert (
        "actor_rollout_ref.actor.grad_clip=0.5 (command line) -> "
        "actor_rollout_ref.actor.optim.grad_clip=0.5" in text
    )
    assert "trainer.project_name=DAPO (command line): experiment naming" in text
    assert "# start-up checks (run)" in text and "ok   trainer.device" in text
    assert "nothing started" in text
    assert not (tmp_path / "runs").exists()  # no run directory, so no broker, no process


def _bad_tool_configs(tmp_path: Path) -> list[Path]:
    unparsable = tmp_path / "tools.yaml"
    unparsable.write_text("tools: [\n")
    no_tools = tmp_path / "empty_tools.yaml"
    no_tools.write_text("other: 1\n")
    return [tmp_path / "missing.yaml", unparsable, no_tools]


def test_a_bad_tool_config_fails_at_start_up_naming_the_key(tmp_path: Path) -> None:
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    for path in _bad_tool_configs(tmp_path):
        cfg = load_config(
            None, ["actor_rollout_ref.rollout.multi_turn.enable=true", f"{key}={path}"]
        )
        for role in ("run", "train", "rollout"):
            with pytest.raises(ConfigError, match=f"{key}: {path}"):
                check_startable(cfg, role)


def test_a_bad_tool_config_stops_the_role_command_at_once(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            *[sys.executable, "-m", "asyncrl", "rollout", "kafka.bootstrap_servers=127.0.0.1:1"],
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'missing.yaml'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "ASYNCRL_DEBUG"},
    )
    assert out.returncode == 2
    assert (
        "asyncrl rollout: cannot start: actor_rollout_ref.rollout.multi_turn.tool_config_path"
        in (out.stderr)
    )


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch as the checks see it on a machine without CUDA (also on a GPU machine)."""
    cuda = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda, __version__="x"))


def test_cuda_without_cuda_fails_at_start_up_naming_the_key(
    no_cuda: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, ["trainer.device=cuda"])
    for role in ("run", "train"):
        with pytest.raises(ConfigError, match="trainer.device: cuda: CUDA is not available"):
            check_startable(cfg, role)
    check_startable(cfg, "rollout")  # a worker does not need the trainer's GPU
    workers = load_config(None, ["actor_rollout_ref.rollout.device=cuda"])
    for role in ("run", "rollout"):
        with pytest.raises(ConfigError, match="rollout.device: cuda: CUDA is not available"):
            check_startable(workers, role)
    check_startable(workers, "train")  # nor the trainer a worker's
    ray = load_config(None, ["trainer.device=cuda", "launcher=ray"])
    deferred = [c for c in startup_checks(ray, "run") if c.key == "trainer.device"]
    assert deferred[0].ok is None  # the trainer's own `asyncrl train` checks, on its node

    from asyncrl.launch import launcher

    def no_broker(*_args: object) -> None:
        raise AssertionError("the launcher started a broker before checking the config")

    monkeypatch.setattr(launcher, "ensure_broker", no_broker)
    with pytest.raises(ConfigError, match="trainer.device"):
        launcher.run(cfg)


def test_vllm_memory_and_scheduling_knobs_are_the_vllm_engines_or_ignored(
    empty_config: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """verl's quickstart sets rollout.gpu_memory_utilization=0.4: the vllm engine's keys load
    as asyncrl's own; the knobs it has no use for change how fast an engine generates, never
    what, so they load with a warning."""
    knobs = [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.enable_chunked_prefill=True",
        "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
        "actor_rollout_ref.rollout.free_cache_engine=True",
    ]
    with caplog.at_level(logging.WARNING, logger="asyncrl.config"):
        cfg = load_config(empty_config, knobs)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.gpu_memory_utilization, rollout.max_num_batched_tokens) == (0.4, 10240)
    assert "1 key(s) ignored" in caplog.text  # free_cache_engine
    with pytest.raises(ConfigError, match="rollout.quantization=fp8"):  # this one changes what
        load_config(empty_config, ["actor_rollout_ref.rollout.quantization=fp8"])


def test_verls_checkpoint_directory_names_the_run_directory(empty_config: Path) -> None:
    """trainer.default_local_dir (checkpoints/<project>/<experiment>) was refused outright; it
    is output_dir, or its parent where its last part is the run_id."""
    key = "trainer.default_local_dir"
    cfg = load_config(empty_config, [f"{key}=/ckpts/DAPO/exp1", "run_id=exp1"])
    assert (cfg.output_dir, cfg.run_dir) == ("/ckpts/DAPO", Path("/ckpts/DAPO/exp1"))
    cfg = load_config(empty_config, [f"{key}=/ckpts/DAPO/exp-1.5b"])
    assert cfg.run_dir == Path("/ckpts/DAPO/exp-1.5b/demo")


def test_tool_response_truncate_side_is_verls_left_which_keeps_the_start(
    empty_config: Path,
) -> None:
    """verl's left keeps a long tool response's start (text[:max]) and right its end; asyncrl,
    which keeps the start, accepted right ("changes nothing") and refused left."""
    key = "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side"
    loaded = load(empty_config, [f"++{key}=left"])
    assert [d.kind for d in loaded.report.decisions if d.key == key] == ["ignored"]
    for side in ("right", "middle"):
        with pytest.raises(ConfigError, match=f"{key}={side} .*not supported by asyncrl"):
            load_config(empty_config, [f"++{key}={side}"])


def test_verls_resume_path_is_refused_saying_how_asyncrl_resumes_a_run():
    """verl's ``trainer.resume_mode=resume_path`` (with ``trainer.resume_from_path=.../
    global_step_N``) was refused with pydantic's "Input should be 'auto' or 'disable'", and
    resume_from_path with where asyncrl writes its checkpoints: neither said that asyncrl goes
    on only from a run's own last checkpoint, nor how to start from another run's policy."""
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=[
                "trainer.resume_mode=resume_path",
                "trainer.resume_from_path=checkpoints/gsm8k/global_step_50",
            ]
        )
    lines = str(err.value).splitlines()
    for key in ("trainer.resume_mode", "trainer.resume_from_path"):
        (line,) = [line for line in lines if line.strip().startswith(key)]
        assert "its own last checkpoint" in line and "export-model" in line, line
    mode = next(line for line in lines if line.strip().startswith("trainer.resume_mode"))
    assert "resume_path (verl's: resume from trainer.resume_from_path)" in mode
    # verl's other values, as its YAML writes them, load
    assert load_config(overrides=["trainer.resume_from_path=null"]).trainer.resume_mode == "auto"
    assert load_config(overrides=["trainer.resume_mode=disable"]).trainer.resume_mode == "disable"


def test_interpolations_are_read_as_omegaconf_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's configs are resolved by OmegaConf: its environment resolver, a circle through two
    keys and a malformed ``${`` each fail naming the key; a sibling ``${.key}`` is the section's."""
    monkeypatch.setenv("ASYNCRL_TEST_STEPS", "7")
    path = tmp_path / "interp.yaml"
    path.write_text(
        "trainer:\n  total_training_steps: ${oc.env:ASYNCRL_TEST_STEPS}\n"
        "  save_freq: ${.test_freq}\n  test_freq: 3\n"
    )
    cfg = load_config(path)
    assert (cfg.trainer.total_training_steps, cfg.trainer.save_freq) == (7, 3)
    path.write_text("trainer:\n  seed: ${trainer.test_freq}\n  test_freq: ${trainer.seed}\n")
    with pytest.raises(
        ConfigError, match=r"trainer\.seed \(.*\): interpolation .*refers to itself"
    ):
        load_config(path)
    path.write_text("trainer:\n  seed: ${trainer.test_freq\n")
    with pytest.raises(ConfigError, match=r"trainer\.seed \(.*\): interpolation \$\{trainer"):
        load_config(path)
