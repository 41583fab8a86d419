"""Config: defaults load, overrides apply, bad keys and values fail naming the key."""

import subprocess
import sys

import pytest

from asyncrl.config import ConfigError, load_config


def test_default_config_and_derived_quantities():
    cfg = load_config(
        overrides=[
            "async_training.staleness_threshold=0.5",
            "async_training.trigger_parameter_sync_step=2",
            "async_training.require_batches=3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ]
    )
    assert cfg.required_samples == 12
    assert cfg.samples_per_version == 24
    assert cfg.max_samples_per_version == 36
    assert cfg.async_training.mode == "c"
    assert cfg.topic("samples") == f"{cfg.run_id}.samples"


@pytest.mark.parametrize(
    "override, key",
    [
        ("async_training.staleness_treshold=0.1", "async_training.staleness_treshold"),
        ("async_training.staleness_threshold=-1", "async_training.staleness_threshold"),
        ("actor_rollout_ref.rollout.n=zero", "actor_rollout_ref.rollout.n"),
        ("run_id=has spaces", "run_id"),
    ],
)
def test_bad_config_names_the_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert key in str(err.value)


@pytest.mark.parametrize(
    "override, shown",
    [
        ("trainer.total_training_steps=abc", "(got 'abc')"),
        ("async_training.staleness_threshold=-1", "(got -1)"),
        ("actor_rollout_ref.rollout.name=vllm2", "(got 'vllm2')"),
    ],
)
def test_a_bad_value_is_shown_beside_its_key(override, shown):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    line = next(x for x in str(err.value).splitlines() if override.split("=")[0] in x)
    assert line.endswith(shown)


@pytest.mark.parametrize("heads", ["5", "32"])  # no divisor; a head width of 3
def test_attention_heads_that_do_not_split_the_width_evenly_name_the_key(heads):
    """The warm start died with a raw traceback from transformers before."""
    with pytest.raises(ConfigError) as err:
        load_config(
            overrides=[
                "actor_rollout_ref.model.hidden_size=96",
                f"actor_rollout_ref.model.num_attention_heads={heads}",
            ]
        )
    line = str(err.value).splitlines()[1]
    assert line.startswith("  actor_rollout_ref.model.num_attention_heads (command line): must")
    assert "hidden_size=96" in line and "e.g. 1, 2, 3, 4" in line
    assert load_config(overrides=["actor_rollout_ref.model.num_attention_heads=8"])


def test_partial_rollout_needs_staleness():
    with pytest.raises(ConfigError, match="partial_rollout"):
        load_config(
            overrides=[
                "async_training.partial_rollout=true",
                "async_training.staleness_threshold=0",
            ]
        )


def test_modes():
    def mode(*o):
        return load_config(overrides=list(o)).async_training.mode

    assert (
        mode("async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=1")
        == "a"
    )
    assert (
        mode("async_training.staleness_threshold=0", "async_training.trigger_parameter_sync_step=4")
        == "b"
    )
    assert mode("async_training.staleness_threshold=0.3") == "c"
    assert (
        mode("async_training.staleness_threshold=0.3", "async_training.partial_rollout=true") == "d"
    )


def test_cli_help_is_instant_and_torch_free():
    code = (
        "import sys\nfrom asyncrl.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    for command in ("run", "train", "rollout", "broker"):
        assert command in out.stdout


def test_cli_bad_config_exits_2_naming_the_key():
    out = subprocess.run(
        [sys.executable, "-m", "asyncrl", "run", "trainer.total_training_stepz=3"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "trainer.total_training_stepz" in out.stderr


def test_a_typo_under_a_section_verl_refuses_names_the_key_meant():
    """``optim.*`` is refused as a whole but for asyncrl's keys; a misspelt ``optim.lr`` there
    says first which key was meant, then why verl's keys are refused (it read as a verl
    engine setting with a hint at its end: ``rollout.temprature``)."""
    for typo, meant in [
        ("actor_rollout_ref.actor.optim.lrr=1e-3", "actor_rollout_ref.actor.optim.lr"),
        ("actor_rollout_ref.rollout.temprature=0.7", "actor_rollout_ref.rollout.temperature"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(overrides=[typo])
        message = str(err.value)
        assert f": no such key: did you mean {meant}? (verl's keys" in message
        assert message.index("did you mean") < message.index("not supported by asyncrl")
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["actor_rollout_ref.actor.optim.optimizer=SGD"])
    assert "did you mean" not in str(err.value)  # verl's own key: the reason alone


def test_output_dir_expands_home(monkeypatch) -> None:
    """output_dir=~/runs on the command line (the shell leaves ~ alone after =) made a
    directory named ~ in the current one, where model.path=~/... and the data files expand."""
    monkeypatch.setenv("HOME", "/home/someone")
    cfg = load_config(overrides=["output_dir=~/runs", "run_id=r"])
    assert cfg.output_dir == "/home/someone/runs"
    assert str(cfg.run_dir) == "/home/someone/runs/r"
