"""A data file without the prompt column (data.prompt_key) or the reward column fails the
start-up checks, naming the key and the file: ``asyncrl run --dry-run`` said ``ok`` and exit 0
for it, and the real run then stopped in its set-up, a logs folder left behind."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.launcher import run
from asyncrl.launch.preflight import check_startable, dry_run, startup_checks
from asyncrl.tasks.files import check_file, export_task
from tests.helpers import SMALL_MODEL


@pytest.fixture
def exported(tmp_path: Path) -> dict[str, Path]:
    """The arithmetic task as verl-format files (columns data_source, prompt, reward_model...)."""
    cfg = load_config(overrides=["data.train_size=8", "data.val_size=4"])
    return export_task(cfg.data, tmp_path / "data")


def _overrides(tmp_path: Path, train: Path, val: Path, *more: str) -> list[str]:
    return [
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"output_dir={tmp_path / 'runs'}",
        "run_id=pf",
        *more,
    ]


def test_a_missing_prompt_column_fails_the_check_naming_data_prompt_key(
    tmp_path: Path, exported: dict[str, Path]
) -> None:
    cfg = load_config(
        overrides=_overrides(
            tmp_path, exported["train"], exported["val"], "data.prompt_key=question"
        )
    )
    failed = {c.key: c.detail for c in startup_checks(cfg, "run") if c.ok is False}
    assert set(failed) == {"data.train_files", "data.val_files"}
    assert failed["data.train_files"].startswith(
        f"{exported['train']}: no column 'question' (data.prompt_key)"
    )
    with pytest.raises(ConfigError, match=r"data.val_files: .*val.parquet: no column 'question'"):
        check_startable(cfg, "train")
    check_startable(cfg, "rollout")  # workers read prompts from the topic, not the files


def test_a_missing_reward_column_fails_the_check_naming_the_file(
    tmp_path: Path, exported: dict[str, Path]
) -> None:
    no_reward = tmp_path / "no_reward.parquet"
    pq.write_table(pq.read_table(exported["train"]).drop_columns(["reward_model"]), no_reward)
    cfg = load_config(overrides=_overrides(tmp_path, no_reward, exported["val"]))
    with pytest.raises(ConfigError) as err:
        check_startable(cfg, "run")
    assert f"data.train_files: {no_reward}: no column 'reward_model'" in str(err.value)
    assert "data.prompt_key" not in str(err.value) and "data.val_files" not in str(err.value)


def test_the_dry_run_prints_the_failure_and_exits_non_zero(
    tmp_path: Path, exported: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    overrides = _overrides(tmp_path, exported["train"], exported["val"], "data.prompt_key=question")
    assert dry_run(None, overrides) != 0
    out = capsys.readouterr().out
    assert f"FAIL data.train_files: {exported['train']}: no column 'question' (data" in out
    assert "the run would not start" in out
    assert dry_run(None, _overrides(tmp_path, exported["train"], exported["val"])) == 0


def test_the_real_run_stops_before_it_makes_its_run_folder(
    tmp_path: Path, exported: dict[str, Path]
) -> None:
    cfg = load_config(
        overrides=_overrides(
            tmp_path, exported["train"], exported["val"], "data.prompt_key=question"
        )
    )
    with pytest.raises(ConfigError, match=r"no column 'question' \(data.prompt_key\)"):
        run(cfg)
    assert not cfg.run_dir.exists()


def test_the_check_reads_the_schema_not_the_rows(
    tmp_path: Path, exported: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_rows(*_a: object, **_k: object) -> None:
        raise AssertionError("read the rows")

    monkeypatch.setattr(pq, "read_table", no_rows)
    assert check_file(str(exported["train"]), "prompt") is None
    assert "no column 'question'" in (check_file(str(exported["train"]), "question") or "")
    not_parquet = tmp_path / "rows.csv"
    not_parquet.write_text("a,b\n1,2\n")
    assert "not a parquet file" in (check_file(str(not_parquet), "prompt") or "")
    assert check_file(str(tmp_path / "nope.parquet"), "prompt") == (
        f"{tmp_path / 'nope.parquet'}: no such file"
    )


def test_the_dry_run_reads_the_rows_too_and_names_a_bad_one(
    tmp_path: Path, exported: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """What only the rows show (a malformed prompt, a data_source no rule scores) fails the dry run, as the real run's set-up would; the real start-up checks leave
    the rows to the set-up, which reads them anyway."""
    import pyarrow as pa

    table = pq.read_table(exported["train"])
    rows = table.to_pylist()
    rows[3]["prompt"] = []
    no_prompt = tmp_path / "no_prompt.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), no_prompt)
    assert dry_run(None, _overrides(tmp_path, no_prompt, exported["val"])) == 2
    out = capsys.readouterr().out
    assert f"FAIL data.train_files: {no_prompt}: row 3: " in out

    rows = table.to_pylist()
    rows[0]["data_source"] = "my_dataset"
    unknown = tmp_path / "unknown_source.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), unknown)
    assert dry_run(None, _overrides(tmp_path, unknown, exported["val"])) == 2
    assert "data_source my_dataset, which no built-in rule scores" in capsys.readouterr().out
    cfg = load_config(overrides=_overrides(tmp_path, unknown, exported["val"]))
    assert all(c.ok is not False for c in startup_checks(cfg, "run"))  # left to the set-up

    assert dry_run(None, _overrides(tmp_path, exported["train"], exported["val"])) == 0
    assert f"ok   data.train_files: {exported['train']} (8 rows)" in capsys.readouterr().out


def test_the_dry_run_puts_the_prompts_through_the_tokenizer(
    tmp_path: Path, exported: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Chat prompts with a checkpoint that has no chat template, and a file whose prompts are
    all over data.max_prompt_length, stopped the real run in its set-up (after the broker
    and the topics), where the dry run had said ok and exit 0."""
    from asyncrl.models.tiny import build_model, build_tokenizer

    ckpt = tmp_path / "no-template"
    tok = build_tokenizer()  # the tiny model's: no chat template of its own
    small = load_config(
        overrides=[
            *SMALL_MODEL,
        ]
    )
    build_model(small.actor_rollout_ref.model, len(tok), seed=0).save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    model = f"actor_rollout_ref.model.path={ckpt}"
    assert dry_run(None, _overrides(tmp_path, exported["train"], exported["val"], model)) == 2
    out = capsys.readouterr().out
    assert "FAIL data.train_files: prompt train-0: the prompt is chat messages but the " in out

    short = "data.max_prompt_length=3"  # "<bos>07+35=" is 7 tokens
    assert dry_run(None, _overrides(tmp_path, exported["train"], exported["val"], short)) == 2
    assert "FAIL data.train_files: all 8 prompts are longer than data.max_prompt_length=3" in (
        capsys.readouterr().out
    )
    some = "data.max_prompt_length=6"  # one-digit operands fit
    import pyarrow as pa

    rows = pq.read_table(exported["train"]).to_pylist()
    rows[0]["prompt"] = [{"role": "user", "content": "1+2="}]
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows), mixed)
    assert dry_run(None, _overrides(tmp_path, mixed, mixed, some)) == 0
    assert "(8 rows, 7 longer than data.max_prompt_length=6 tokens after the chat template" in (
        capsys.readouterr().out
    )


def test_prompts_the_built_in_models_tokenizer_cannot_read_stop_the_run_naming_them(
    tmp_path: Path, exported: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A user's own data with the built-in tiny model (no model.path): its tokenizer knows the
    task's characters only, and turned every other into <unk> without a word, so the run
    trained on noise; the dry run said ok. Now the data check fails, naming the characters
    and a prompt, in the dry run and at the run's start."""
    import pyarrow as pa

    rows = pq.read_table(exported["val"]).to_pylist()
    rows[1]["prompt"] = [{"role": "user", "content": "What is 1+2?"}]
    words = tmp_path / "words.parquet"
    pq.write_table(pa.Table.from_pylist(rows), words)
    assert dry_run(None, _overrides(tmp_path, exported["train"], words)) == 2
    out = capsys.readouterr().out
    assert "ok   data.train_files" in out
    assert (
        "FAIL data.val_files: 1 of 4 prompts hold characters the built-in tiny model's "
        "tokenizer does not have ('Whatis?'; it knows '0123456789+-*=() ' only), e.g. prompt "
        "words-1: 'What is 1+2?': each would read as <unk>"
    ) in " ".join(out.split())


def test_the_run_reads_its_data_before_the_topics_and_the_warm_start(
    tmp_path: Path, exported: dict[str, Path]
) -> None:
    """A run whose prompts are all over data.max_prompt_length (or that the built-in model
    cannot read) stopped with its clear message only after making the topics and a ~45 s
    warm start. The data is read first now: the message comes before any broker is asked
    (nothing listens at this one) and with the model cache still empty."""
    from rich.console import Console

    from asyncrl.launch.broker import free_port
    from asyncrl.launch.setup import prepare

    cache = tmp_path / "cache"
    cfg = load_config(
        overrides=_overrides(
            tmp_path,
            exported["train"],
            exported["val"],
            "data.max_prompt_length=3",
            f"actor_rollout_ref.model.cache_dir={cache}",
            "kafka.broker_down_timeout_s=2",
        )
    )
    with pytest.raises(ConfigError, match=r"^data.train_files: all 8 prompts are longer than"):
        prepare(cfg, f"127.0.0.1:{free_port()}", Console(quiet=True))
    assert not cache.exists() or not any(cache.iterdir())
