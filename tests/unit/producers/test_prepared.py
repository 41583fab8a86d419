"""The set-up's training prompts saved in the run directory (``producers/prepared.py``): the
trainer's feed and a resumed run's set-up load exactly what reading the data files gives, and
read them again when the files, the tokenizer or a setting changed."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.config import RunConfig, load_config
from asyncrl.producers import prepared
from asyncrl.producers.feed import train_prompts, trainer_prompts


def _row(prompt, ground_truth="0", **extra):
    return {
        "data_source": "arithmetic",
        "prompt": prompt,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra or {"index": 0},
    }


def _mixed(tmp_path: Path, *overrides: str) -> RunConfig:
    """Two files: chat rows (one over data.max_prompt_length=8 tokens, one with a system
    message) and plain-text rows with list ground truths (one over too)."""
    chat, plain = tmp_path / "chat.parquet", tmp_path / "plain.parquet"
    system = {"role": "system", "content": "1"}
    pq.write_table(
        pa.Table.from_pylist(
            [
                _row([{"role": "user", "content": "1+2="}], index=1),
                _row([{"role": "user", "content": "1111+2222="}]),  # too long
                _row([system, {"role": "user", "content": "3="}], "3"),
                _row([{"role": "user", "content": "11+22="}], split="train"),
            ]
        ),
        chat,
    )
    pq.write_table(
        pa.Table.from_pylist(
            [_row("4+4=", ["8"]), _row("12345+678=", ["1"]), _row("2*3=", ["6", "06"])]
        ),
        plain,
    )
    return load_config(
        overrides=[
            f"data.train_files=[{chat},{plain}]",
            f"data.val_files={chat}",
            "data.max_prompt_length=8",
            f"output_dir='{tmp_path / 'runs'}'",
            *overrides,
        ]
    )


def test_the_trainer_loads_exactly_the_prompts_the_set_up_read(tmp_path: Path) -> None:
    cfg = _mixed(tmp_path)
    train, split = train_prompts(cfg)
    assert split is not None and (split.total, split.too_long) == (7, 2)
    assert any(p.messages for p in train) and any(not p.messages for p in train)
    prepared.save(cfg, train)
    assert prepared.load(cfg) == train  # same records, same order, same filtering
    assert trainer_prompts(cfg) == train
    assert [p.prompt_id for p in train] == ["0.chat-0", "0.chat-2", "0.chat-3", "1.plain-0"] + [
        "1.plain-2"
    ]


def test_prompts_saved_with_other_files_or_settings_are_read_again(tmp_path: Path) -> None:
    cfg = _mixed(tmp_path)
    prepared.save(cfg, train_prompts(cfg)[0])
    longer = _mixed(tmp_path, "data.max_prompt_length=12")
    assert prepared.load(longer) is None  # data.* shape the prompts
    assert trainer_prompts(longer) == train_prompts(longer)[0]
    assert len(trainer_prompts(longer)) == 7
    assert prepared.load(cfg) is not None
    chat = tmp_path / "chat.parquet"
    table = pq.read_table(chat)
    pq.write_table(table.slice(0, 3), chat)  # the file changed: a row fewer
    assert prepared.load(cfg) is None and len(trainer_prompts(cfg)) == 4
    prepared.path(cfg).write_bytes(b"not parquet")  # a broken file is no prompts
    assert prepared.load(cfg) is None


@pytest.mark.parametrize(
    "override",
    ["data.feed_ahead_steps=3", "data.max_response_length=9", "data.shuffle=false", "data.seed=5"],
)
def test_a_data_key_the_read_does_not_use_keeps_the_saved_prompts(
    tmp_path: Path, override: str
) -> None:
    """The key held all of data.*, so a resume that changed data.feed_ahead_steps or
    data.max_response_length (keys a resume may change) read, checked and tokenized every row
    again (10 s at 100K rows on two cores). Neither shapes what the read keeps, nor do
    data.shuffle and data.seed: the saved prompts are one epoch in file order, which the feed
    shuffles as it sends them (``feed_sequence``)."""
    cfg = _mixed(tmp_path)
    train = train_prompts(cfg)[0]
    prepared.save(cfg, train, prepared.Read(7, 2))
    prepared.save_val(cfg, prepared.Read(4, 1))
    other = _mixed(tmp_path, override)
    assert prepared.load(other) == train
    assert prepared.load_val(other) == prepared.Read(4, 1, earlier=True)
    assert prepared.load(_mixed(tmp_path, "data.prompt_key=question")) is None  # still keyed


def test_a_resumed_set_up_reads_the_rows_again_only_when_a_file_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed run's set-up read and checked every row of data.train_files again (10 s of
    its 16 s to the first step at 100K rows), though its first set-up had saved the prompts
    with their key, and data.val_files too (loading the tokenizer: 3 s of torch and
    transformers imports): it takes both as saved, and reads the files again only once one
    has changed."""
    from rich.console import Console

    from asyncrl.launch.setup import read_data
    from asyncrl.tasks import files

    read: list[str] = []
    row_reader = files.read_rows

    def counted(paths: list[str], prompt_key: str, config_key: str) -> list[files.DataRow]:
        read.append(config_key)
        return row_reader(paths, prompt_key, config_key)

    monkeypatch.setattr(files, "read_rows", counted)
    cfg = _mixed(tmp_path)

    def set_up() -> tuple[list, str]:
        out = StringIO()
        return read_data(cfg.model_copy(deep=True), Console(file=out, width=400)), out.getvalue()

    first, said = set_up()  # the run's first set-up
    assert read.count("data.train_files") == 1 and "unchanged" not in said
    again, said = set_up()  # resumed, the files as they were
    assert read == ["data.train_files", "data.val_files"] and again == first
    assert "data: 5 of the 7 prompts in data.train_files (2 longer than" in said
    assert "data: 3 of the 4 prompts in data.val_files (1 longer than" in said
    assert said.count("the files unchanged since the run's set-up read them") == 2
    chat = tmp_path / "chat.parquet"  # a train and the val file
    pq.write_table(pq.read_table(chat).slice(0, 3), chat)  # a row fewer
    changed, said = set_up()
    assert read.count("data.train_files") == read.count("data.val_files") == 2
    assert "data: 2 of the 3 prompts in data.val_files" in said and "unchanged" not in said
    assert [p.prompt_id for p in changed] == ["0.chat-0", "0.chat-2", "1.plain-0", "1.plain-2"]
    assert set_up()[0] == changed and len(read) == 4  # saved again
