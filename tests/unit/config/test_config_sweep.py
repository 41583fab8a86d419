"""Config values a sweep found accepted at start-up and failing later (or silently wrong):
each is now refused at load, one line naming the key the user wrote and its source."""

import os

import pytest

from asyncrl.config import DEFAULT_CONFIG, ConfigError, load_config


def _problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=list(overrides))
    return str(err.value).splitlines()[1:]


def test_a_width_the_default_head_count_does_not_split_is_refused():
    """hidden_size=130 with the default 4 heads passed start-up (the heads' check only ran
    when they were set) and the warm start died in transformers."""
    [line] = _problems("actor_rollout_ref.model.hidden_size=130")
    assert line.startswith("  actor_rollout_ref.model.num_attention_heads")
    assert "actor_rollout_ref.model.hidden_size=130" in line and "e.g. 1, 5, 13, 65" in line
    assert load_config(overrides=["actor_rollout_ref.model.hidden_size=136"])


@pytest.mark.parametrize(
    "override",
    [
        "async_training.staleness_threshold=.inf",
        "async_training.staleness_threshold=inf",
        "async_training.staleness_threshold=1e308",
        "actor_rollout_ref.actor.optim.lr=.inf",
        "actor_rollout_ref.rollout.temperature=.inf",
        "sync.timeout_s=-.inf",
        "data.max_response_length=.nan",
    ],
)
def test_non_finite_and_overflowing_floats_are_refused(override):
    """staleness_threshold=inf raised OverflowError in max_samples_per_version; lr=inf
    crash-looped the trainer."""
    key = override.split("=")[0]
    [line] = _problems(override)
    assert line.startswith(f"  {key} (command line): ")
    cfg = load_config(overrides=["async_training.staleness_threshold=1000"])
    assert cfg.max_samples_per_version == 1001 * cfg.samples_per_version


CORRECTED = [
    "async_training.compute_prox_log_prob=true",
    "algorithm.rollout_correction.rollout_is=token",
]


@pytest.mark.parametrize(
    ("setting", "needs", "with_it"),
    [
        (
            "async_training.stale_token_action=drop",
            "needs async_training.max_token_version_lag",
            ["async_training.max_token_version_lag=1"],
        ),
        (
            "algorithm.rollout_correction.rollout_is_batch_normalize=true",
            "needs algorithm.rollout_correction.rollout_is (token or sequence)",
            CORRECTED,
        ),
    ],
)
def test_a_setting_that_needs_another_to_act_is_refused_without_it(setting, needs, with_it):
    """Both loaded and did nothing: stale_token_action only acts past max_token_version_lag,
    rollout_is_batch_normalize only on rollout_is's weights. Found by a tuning walkthrough."""
    [line] = _problems(setting)
    assert line.startswith(f"  {setting} {needs}")
    assert line.endswith(f"set by {setting.partition('=')[0]} (command line)")
    assert load_config(overrides=[setting, *with_it])


def test_an_importance_weight_threshold_below_1_is_refused():
    """rollout_is_threshold=0.5 loaded: every weight, 1 where both policies agree, was cut to
    0.5 and the clamp to [1/C, C] behind the std and ESS had its bounds crossed. Found by a
    tuning walkthrough."""
    [line] = _problems(*CORRECTED, "algorithm.rollout_correction.rollout_is_threshold=0.5")
    assert line.startswith("  algorithm.rollout_correction.rollout_is_threshold (command line)")
    assert "greater than or equal to 1 (got 0.5)" in line
    assert load_config(
        overrides=[*CORRECTED, "algorithm.rollout_correction.rollout_is_threshold=1"]
    )


@pytest.mark.parametrize(
    "override",
    [
        "sync.timeout_s=1e300",
        "kafka.broker_down_timeout_s=1e9",
        "custom_reward_function.timeout_s=1e9",
        "actor_rollout_ref.rollout.emulated_decode_latency_s=1e9",
        "sim.decode_step_s=1e9",
    ],
)
def test_timeouts_no_one_means_are_refused(override):
    """sync.timeout_s=1e300 passed start-up; the trainer died after the warm start and the
    feed, in torch's rendezvous (OverflowError), in a message that blamed the port."""
    key = override.split("=")[0]
    [line] = _problems(override)
    assert line.startswith(f"  {key} (command line): ") and "less than or equal to" in line
    assert load_config(overrides=[f"{key}=30"])


@pytest.mark.parametrize(
    "rs, threshold, good",
    [
        ("token_k1", "0.5", "2"),  # one bound u < 1: lower 1/u = 2 above it
        ("token_k1", "1", "1.01"),
        ("seq_mean_k1", "'2_0.5'", "'0.5_2'"),
        ("token_k2,seq_sum_k1", "'3,1.5_1.5'", "'3,1.5_1.6'"),
    ],
)
def test_k1_bounds_that_keep_no_ratio_are_refused(rs, threshold, good):
    """lower >= upper masked every token silently (the loss trained on nothing)."""
    [line] = _problems(
        "async_training.compute_prox_log_prob=true",
        f"algorithm.rollout_correction.rollout_rs={rs}",
        f"algorithm.rollout_correction.rollout_rs_threshold={threshold}",
    )
    assert "algorithm.rollout_correction.rollout_rs_threshold for " in line
    assert "leaves no ratio to keep" in line
    cfg = load_config(
        overrides=[
            "async_training.compute_prox_log_prob=true",
            f"algorithm.rollout_correction.rollout_rs={rs}",
            f"algorithm.rollout_correction.rollout_rs_threshold={good}",
        ]
    )
    assert cfg.algorithm.rollout_correction.rs_thresholds()


@pytest.mark.parametrize(
    "text, named",
    [
        (  # a repeated section threw the first one's keys away
            "trainer:\n  total_training_steps: 3\ndata:\n  train_size: 100\n"
            "trainer:\n  save_freq: 2\n",
            "duplicate key trainer at line 5 (first at line 1)",
        ),
        (  # a repeated leaf kept the last
            "trainer:\n  total_training_steps: 3\n  save_freq: 2\n  total_training_steps: 4\n",
            "duplicate key trainer.total_training_steps at line 4 (first at line 2)",
        ),
    ],
)
def test_a_repeated_key_in_a_config_file_is_refused(tmp_path, text, named):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: {named}")


def test_a_merge_key_is_not_a_repeated_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "x-base: &base\n  total_training_steps: 3\n  save_freq: 2\n"
        "trainer:\n  <<: *base\n  save_freq: 1\n"
    )
    with pytest.raises(ConfigError) as err:  # x-base is no key of ours; trainer merged fine
        load_config(path)
    assert "unknown key x-base.total_training_steps" in str(err.value)
    assert "duplicate" not in str(err.value)


@pytest.mark.parametrize("value", ["console", "tensorboard"])
def test_a_single_logger_name_is_a_one_item_list(tmp_path, value):
    """trainer.logger=console was refused ("Input should be a valid list") while
    trainer.logger=wandb was accepted."""
    assert load_config(overrides=[f"trainer.logger={value}"]).trainer.logger == [value]
    path = tmp_path / "run.yaml"
    path.write_text(f"trainer:\n  logger: {value}\n")
    assert load_config(path).trainer.logger == [value]
    assert load_config(overrides=["trainer.logger=wandb"]).trainer.logger == ["console"]


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("run_id=123", "run_id", "123"),
        ("run_id=20240101", "run_id", "20240101"),
        ("run_id=2024-01-01", "run_id", "2024-01-01"),  # YAML's date: refused, unshown
        ("run_id=010", "run_id", "010"),  # YAML 1.1's octal 8: the text written
        ("output_dir=123", "output_dir", os.path.abspath("123")),  # made absolute
        ("sync.master_addr=10", "sync.master_addr", "10"),
        ("kafka.bootstrap_servers=9092", "kafka.bootstrap_servers", "9092"),
    ],
)
def test_a_text_key_takes_the_text_of_a_number_or_date(override, key, value):
    cfg = load_config(overrides=[override])  # from this directory, as value's abspath is
    section, _, name = key.rpartition(".")
    assert getattr(cfg if not section else getattr(cfg, section), name) == value


def test_a_text_key_in_a_file_takes_the_text_written(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "run_id: 2024-01-01\noutput_dir: 0x10\nkafka:\n  bootstrap_servers: 9092\n"
        "sync:\n  master_addr: 12:30\n"  # YAML 1.1: 750 (base 60)
    )
    cfg = load_config(path)
    assert (cfg.run_id, cfg.output_dir) == ("2024-01-01", os.path.abspath("0x10"))
    assert (cfg.kafka.bootstrap_servers, cfg.sync.master_addr) == ("9092", "12:30")


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.rollout.n=true",
        "trainer.total_training_steps=true",
        "actor_rollout_ref.actor.optim.lr=false",
        "actor_rollout_ref.rollout.response_length=true",  # verl's name of max_response_length
    ],
)
def test_a_number_key_refuses_a_boolean(override):
    """rollout.n=true became 1, total_training_steps=true 1."""
    key, value = override.split("=")
    [line] = _problems(override)
    assert line == f"  {key} (command line): a number is needed, not a boolean (got {value})"


def test_a_bucket_size_below_one_byte_is_refused():
    """bucket_size_mb=1e-9 passed its > 0 check and failed at the first sync
    (bucket_bytes must be positive, got 0)."""
    [line] = _problems("sync.bucket_size_mb=1e-9")
    assert line.startswith("  sync.bucket_size_mb (command line): 1e-09 MB is less than one byte")
    assert load_config(overrides=["sync.bucket_size_mb=1e-6"]).sync.bucket_bytes == 1


@pytest.mark.parametrize("override", ["prompts=0", "samples=-2", "dead-letter=0"])
def test_a_topic_of_no_partitions_is_refused(override):
    """It passed --dry-run; the run found it only after starting the broker."""
    topic, value = override.split("=")
    [line] = _problems(f"kafka.topics.partitions.{override}")
    assert line == (
        f"  kafka.topics.partitions.{topic} (command line): Input should be greater than or "
        f"equal to 1 (got {value})"
    )


@pytest.mark.parametrize(
    "key, most",
    [
        ("actor_rollout_ref.rollout.n", 4096),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", 65536),
        ("actor_rollout_ref.rollout.max_concurrent_samples", 65536),
        ("actor_rollout_ref.rollout.num_workers", 4096),
        ("async_training.require_batches", 4096),
        ("data.max_prompt_length", 1 << 20),
        ("data.max_response_length", 1 << 20),
    ],
)
def test_an_absurd_count_is_refused(key, most):
    """rollout.n=99999999999999999999 was accepted and the run hung."""
    [line] = _problems(f"{key}=99999999999999999999")
    assert line == (
        f"  {key} (command line): Input should be less than or equal to {most} "
        "(got 99999999999999999999)"
    )


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "actor_rollout_ref.rollout.response_length=0",
            "actor_rollout_ref.rollout.response_length (command line; asyncrl's "
            "data.max_response_length): Input should be greater than or equal to 1 (got 0)",
        ),
        (
            "async_training.checkpoint_engine.device_buffer_size_M=0",
            "async_training.checkpoint_engine.device_buffer_size_M (command line; asyncrl's "
            "sync.bucket_size_mb): Input should be greater than 0 (got 0)",
        ),
        (
            "actor_rollout_ref.actor.grad_clip=0",
            "actor_rollout_ref.actor.grad_clip (command line; asyncrl's "
            "actor_rollout_ref.actor.optim.grad_clip): Input should be greater than 0 (got 0)",
        ),
    ],
)
def test_an_error_on_a_verl_alias_names_the_key_written(override, line):
    assert _problems(override) == [f"  {line}"]


def test_the_alias_listing_says_when_a_later_key_wins():
    from asyncrl.config.load import load

    loaded = load(
        None,
        [
            "actor_rollout_ref.actor.grad_clip=0.1",
            "actor_rollout_ref.actor.optim.grad_clip=0.3",
        ],
    )
    assert loaded.config().actor_rollout_ref.actor.optim.grad_clip == 0.3
    assert loaded.report.alias_lines() == [
        "actor_rollout_ref.actor.grad_clip=0.1 (command line) -> "
        "actor_rollout_ref.actor.optim.grad_clip=0.1 (not applied: "
        "actor_rollout_ref.actor.optim.grad_clip=0.3 (command line) is set later)"
    ]


@pytest.mark.parametrize(
    "override, line",
    [
        (
            "kafka.extra.debug=[a]",
            "kafka.extra.debug (command line): Input should be str, int, float or bool (got [a])",
        ),
        (
            "data.train_files={a: 1}",
            "data.train_files (command line): Input should be str or list[str] (got {a: 1})",
        ),
    ],
)
def test_a_value_no_type_of_a_union_takes_is_one_line(override, line):
    """It printed a line per type, each under a made-up key (kafka.extra.debug.str, ...)."""
    assert _problems(override) == [f"  {line}"]


def test_a_check_across_keys_names_where_each_was_set():
    assert _problems(
        "async_training.partial_rollout=true", "async_training.staleness_threshold=0"
    ) == [
        "  async_training.partial_rollout=True needs async_training.staleness_threshold > 0; "
        "set by async_training.partial_rollout (command line), "
        "async_training.staleness_threshold (command line)"
    ]
    [line] = _problems("data.task=countdown", "data.train_size=2000")
    assert line.startswith("  data.train_size + data.val_size = 2200: the countdown task")
    assert line.endswith(f"set by data.train_size (command line), data.val_size ({DEFAULT_CONFIG})")


def test_removing_a_misspelt_key_is_an_unknown_key():
    """~trainer.total_training_step removed nothing, silently."""
    assert _problems("~trainer.total_training_step") == [
        "  unknown key trainer.total_training_step (command line, ~trainer.total_training_step):"
        " nearest valid key: trainer.total_training_steps"
    ]
    assert load_config(overrides=["~trainer.total_training_steps"]).trainer.total_training_steps


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("trainer.total_training_steps=010", "total_training_steps", 10),  # YAML 1.1: 8
        ("kafka.max_message_bytes=1e9", "max_message_bytes", 10**9),  # YAML 1.1: text
        ("actor_rollout_ref.rollout.n=1e3", "n", 1000),
    ],
)
def test_an_int_key_reads_leading_zeros_as_decimal_and_whole_e_notation(override, key, value):
    cfg = load_config(overrides=[override])
    section = {"n": cfg.actor_rollout_ref.rollout, "max_message_bytes": cfg.kafka}
    assert getattr(section.get(key, cfg.trainer), key) == value
    assert _problems("actor_rollout_ref.rollout.n=1.5e0")[0].endswith("(got '1.5e0')")


def test_a_config_path_that_is_a_directory_or_not_text_is_one_error(tmp_path) -> None:
    """``--config /tmp`` and a binary file ended in IsADirectoryError / UnicodeDecodeError
    tracebacks."""
    import pytest

    from asyncrl.config import ConfigError, load_config

    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"trainer:\n  seed: \xff\xfe\n")
    with pytest.raises(ConfigError, match="a directory, not a config file"):
        load_config(str(tmp_path))
    with pytest.raises(ConfigError, match=r"b.yaml: not text \(UTF-8\)"):
        load_config(str(binary))
