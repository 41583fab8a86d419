"""Your model and your data (issue 19): verl-format parquet files read, checked and filtered;
prompts that are chat messages go through the chat template; a local Hugging Face checkpoint
loads by ``actor_rollout_ref.model.path``, and a bad path stops the run naming the key."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from asyncrl.config import ConfigError, load_config
from asyncrl.launch.preflight import check_startable
from asyncrl.models.policy import TINY_CHAT_TEMPLATE, encode_prompt, load_policy, load_tokenizer
from asyncrl.models.tiny import build_model, build_tokenizer
from asyncrl.producers.feed import train_prompts
from asyncrl.tasks.files import export_task, filter_overlong, load_split, read_rows
from tests.helpers import SMALL_MODEL


@pytest.fixture
def exported(tmp_path: Path) -> dict[str, Path]:
    """The arithmetic task as verl-format files: 40 train and 10 val prompts."""
    cfg = load_config(overrides=["data.train_size=40", "data.val_size=10"])
    return export_task(cfg.data, tmp_path / "data")


def _files(paths: dict[str, Path], *overrides: str):
    return load_config(
        overrides=[
            f"data.train_files={paths['train']}",
            f"data.val_files={paths['val']}",
            *overrides,
        ]
    )


def _tiny_tokenizer():
    tok = build_tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def test_the_exporter_writes_verls_columns(exported: dict[str, Path]) -> None:
    table = pq.read_table(exported["train"])
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    first = table.slice(0, 1).to_pylist()[0]
    assert first["data_source"] == "arithmetic"
    assert first["prompt"][0]["role"] == "user" and first["prompt"][0]["content"].endswith("=")
    assert first["reward_model"]["style"] == "rule"
    assert first["extra_info"]["split"] == "train" and first["extra_info"]["index"] == 0
    assert pq.read_metadata(exported["val"]).num_rows == 10


def test_rows_read_back_with_what_the_reward_needs(exported: dict[str, Path]) -> None:
    rows = read_rows([str(exported["train"])], "prompt", "data.train_files")
    assert len(rows) == 40
    assert [r.prompt_id for r in rows[:2]] == ["train-0", "train-1"]
    a, b = (int(x) for x in rows[0].messages[0]["content"].rstrip("=").split("+"))
    assert rows[0].ground_truth == str(a + b)
    assert rows[0].extra_info["split"] == "train"
    rec = rows[0].record(epoch=2)
    assert rec.sample_id == "train-0@2" and rec.data_source == "arithmetic"
    assert rec.chat() == rows[0].messages and rec.reward_ground_truth() == rows[0].ground_truth
    assert rec.reward_extra_info()["index"] == 0


def test_prompt_key_names_the_prompt_column(tmp_path: Path) -> None:
    chat, plain = tmp_path / "chat.parquet", tmp_path / "plain.parquet"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "mine",
                    "question": messages,
                    "reward_model": {"style": "rule", "ground_truth": ["a", "b"]},
                }
            ]
        ),
        chat,
    )
    pq.write_table(
        pa.Table.from_pylist(
            [{"data_source": "mine", "question": "plain", "reward_model": {"ground_truth": "x"}}]
        ),
        plain,
    )
    got = read_rows([str(chat), str(plain)], "question", "data.train_files")
    assert [r.prompt_id for r in got] == ["0.chat-0", "1.plain-0"]  # several files: numbered
    assert got[0].messages == messages and got[0].ground_truth == ["a", "b"]
    assert got[0].record().ground_truth_json and got[0].record().reward_ground_truth() == ["a", "b"]
    assert got[1].prompt == "plain" and got[1].messages is None and got[1].extra_info == {}
    with pytest.raises(
        ConfigError, match=r"data.train_files: .*no column 'prompt' \(data.prompt_key\)"
    ):
        read_rows([str(chat)], "prompt", "data.train_files")


def test_a_missing_file_or_column_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.val_files: .*nope.parquet: no such file"):
        read_rows([str(tmp_path / "nope.parquet")], "prompt", "data.val_files")
    path = tmp_path / "no_reward.parquet"
    pq.write_table(pa.Table.from_pylist([{"data_source": "x", "prompt": "hi"}]), path)
    with pytest.raises(ConfigError, match="no column 'reward_model'"):
        read_rows([str(path)], "prompt", "data.train_files")
    bad = tmp_path / "bad_prompt.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {
                    "data_source": "x",
                    "prompt": [{"role": "user"}],
                    "reward_model": {"ground_truth": "1"},
                }
            ]
        ),
        bad,
    )
    with pytest.raises(ConfigError, match="chat messages"):
        read_rows([str(bad)], "prompt", "data.train_files")


def test_chat_messages_saved_as_a_json_string_are_refused(tmp_path: Path) -> None:
    """A prompt column of JSON text ('[{"role": "user", ...}]', as df.to_json or a
    json.dumps before writing leaves it) was read as a plain prompt: the model got the JSON
    text, the chat template never applied, and nothing said so."""
    import json

    path = tmp_path / "json_text.parquet"
    rows = [
        {
            "data_source": "x",
            "prompt": json.dumps([{"role": "user", "content": "1+2="}]),
            "reward_model": {"ground_truth": "3"},
        }
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ConfigError, match=r"row 0: column 'prompt' .* encoded as a JSON string"):
        read_rows([str(path)], "prompt", "data.train_files")
    rows[0]["prompt"] = "[1, 2] + [3] ="  # text that only starts like JSON stays a prompt
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert read_rows([str(path)], "prompt", "data.train_files")[0].prompt == "[1, 2] + [3] ="


def test_a_value_the_prompts_topic_cannot_carry_names_its_row_and_key(tmp_path: Path) -> None:
    """extra_info (or a ground truth) holding a timestamp, a decimal or bytes: the launcher's
    feed stopped on a TypeError traceback (datetime is not JSON serializable)."""
    import datetime
    import decimal

    for name, value in (
        ("created", datetime.datetime(2024, 1, 1)),
        ("price", decimal.Decimal("1.5")),
        ("raw", b"\x00"),
    ):
        path = tmp_path / f"{name}.parquet"
        row = {
            "data_source": "x",
            "prompt": "hi",
            "reward_model": {"ground_truth": "1"},
            "extra_info": {"index": 0, name: value},
        }
        pq.write_table(pa.Table.from_pylist([row]), path)
        with pytest.raises(ConfigError, match=rf"{name}.parquet: row 0: extra_info\['{name}'\]: "):
            read_rows([str(path)], "prompt", "data.train_files")
    when = tmp_path / "when.parquet"
    row = {"data_source": "x", "prompt": "hi", "reward_model": {"ground_truth": decimal.Decimal(1)}}
    pq.write_table(pa.Table.from_pylist([row]), when)
    with pytest.raises(ConfigError, match=r"row 0: reward_model.ground_truth: .*Decimal"):
        read_rows([str(when)], "prompt", "data.train_files")


@pytest.mark.parametrize("column", ["extra_info", "ground_truth"])
def test_a_value_of_a_non_json_arrow_type_is_refused_on_any_row(
    tmp_path: Path, column: str
) -> None:
    """Columns of JSON-only Arrow types skip the per-value check (what read_rows spent a third
    of its time on); a binary, timestamp or decimal value, nested in a list or struct too,
    still stops the read naming the file, the row and the key."""
    import datetime
    import decimal

    bad = {
        "raw": b"\x00",
        "created": datetime.datetime(2024, 1, 1),
        "price": decimal.Decimal("1.5"),
        "days": [datetime.date(2024, 1, 1)],
        "meta": {"blob": b"x", "n": 1},
    }
    for name, value in bad.items():
        path = tmp_path / f"{column}-{name}.parquet"
        rows = []
        for i in range(3):  # rows 0 and 1 hold nulls where row 2 holds the value
            held = value if i == 2 else None
            truth, extra = (
                (held, {"index": i}) if column == "ground_truth" else (None, {name: held})
            )
            rows.append(
                {
                    "data_source": "x",
                    "prompt": "hi",
                    "reward_model": {"ground_truth": truth},
                    "extra_info": extra,
                }
            )
        pq.write_table(pa.Table.from_pylist(rows), path)
        key = {
            "extra_info": rf"extra_info\['{name}'\]",
            "ground_truth": r"reward_model\.ground_truth"
            + (r"\['blob'\]" if name == "meta" else ""),
        }[column]
        with pytest.raises(
            ConfigError, match=rf"^data\.train_files: .*{column}-{name}\.parquet: row 2: {key}: "
        ):
            read_rows([str(path)], "prompt", "data.train_files")


def test_json_typed_columns_read_as_the_per_value_check_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose prompt and ground truth have JSON-only Arrow types (no per-value check)
    and whose extra_info does not (a dictionary-encoded string, a float16: checked per value)
    reads as it does with every column checked per value, and as the same file cast to JSON
    types throughout: the fast path changes no DataRow."""
    import dataclasses
    import json

    from asyncrl.tasks import files

    extra = pa.struct(
        [
            ("split", pa.dictionary(pa.int32(), pa.string())),
            ("index", pa.int64()),
            ("weight", pa.float16()),
            ("loss", pa.float64()),
            ("tags", pa.list_(pa.string())),
            ("meta", pa.struct([("ok", pa.bool_()), ("n", pa.int32())])),
        ]
    )
    schema = pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
            (
                "reward_model",
                pa.struct([("style", pa.string()), ("ground_truth", pa.list_(pa.int64()))]),
            ),
            ("extra_info", extra),
        ]
    )
    rows = [
        {
            "data_source": "mine",
            "prompt": [{"role": "user", "content": f"{i}+1="}],
            "reward_model": {"style": "rule", "ground_truth": [i + 1, i] if i != 1 else None},
            "extra_info": None
            if i == 2
            else {
                "split": "train",
                "index": i,
                "weight": 0.5 * i,
                "loss": float("nan") if i == 0 else 1.25,
                "tags": ["a", None] if i else [],
                "meta": {"ok": i % 2 == 0, "n": None},
            },
        }
        for i in range(4)
    ]
    mixed, plain = tmp_path / "mixed.parquet", tmp_path / "plain.parquet"
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, mixed)
    plain_extra = pa.struct(
        [
            f
            if f.name not in ("split", "weight")
            else pa.field(f.name, pa.string() if f.name == "split" else pa.float64())
            for f in extra
        ]
    )
    pq.write_table(table.cast(schema.set(3, pa.field("extra_info", plain_extra))), plain)
    fast = [files._column_json(pq.read_schema(p), "extra_info") for p in (mixed, plain)]
    assert fast == [False, True]  # the mixed file's extra_info is checked per value
    assert files._column_json(pq.read_schema(mixed), "reward_model", "ground_truth")

    def as_json(path: Path) -> list[str]:
        got = read_rows([str(path)], "prompt", "data.train_files")
        return [json.dumps(dataclasses.asdict(r) | {"prompt_id": r.prompt_id[-1]}) for r in got]

    read = as_json(mixed)
    assert json.loads(read[0])["extra_info"]["loss"] != json.loads(read[0])["extra_info"]["loss"]
    assert read == as_json(plain)
    monkeypatch.setattr(files, "_column_json", lambda *_: False)
    assert read == as_json(mixed) == as_json(plain)


def test_prompts_longer_than_max_prompt_length_after_templating_are_left_out_and_counted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "mixed.parquet"
    rows = [
        {"data_source": "arithmetic", "prompt": [{"role": "user", "content": c}]}
        | {"reward_model": {"style": "rule", "ground_truth": "0"}}
        for c in ["1+2=", "11+22=", "111+222=", "1111+2222="]
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    tok = _tiny_tokenizer()
    read = read_rows([str(path)], "prompt", "data.train_files")
    # <bos> + characters: 5, 7, 9 and 11 tokens
    kept, too_long = filter_overlong(read, tok, max_prompt_length=8)
    assert [r.messages[0]["content"] for r in kept] == ["1+2=", "11+22="]
    assert too_long == 2
    cfg = load_config(
        overrides=[f"data.train_files={path}", f"data.val_files={path}", "data.max_prompt_length=8"]
    )
    split = load_split(cfg, "train", tok)
    assert (len(split.rows), split.total, split.too_long) == (2, 4, 2)
    cfg.data.max_prompt_length = 4
    with pytest.raises(ConfigError, match="all 4 prompts are longer"):
        load_split(cfg, "train", tok)


def test_a_data_source_without_a_rule_needs_a_custom_reward(tmp_path: Path) -> None:
    path = tmp_path / "gsm.parquet"
    row = {"data_source": "openai/gsm8k", "prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    pq.write_table(pa.Table.from_pylist([row]), path)
    cfg = load_config(overrides=[f"data.train_files={path}", f"data.val_files={path}"])
    with pytest.raises(ConfigError, match=r"custom_reward_function.path: .*openai/gsm8k"):
        load_split(cfg, "train", _tiny_tokenizer())


def test_train_files_replace_the_task_in_the_feed(exported: dict[str, Path]) -> None:
    cfg = _files(exported, "data.shuffle=false")
    prompts, split = train_prompts(cfg)
    assert split is not None and (split.total, split.too_long) == (40, 0)
    assert [p.prompt_id for p in prompts[:3]] == ["train-0", "train-1", "train-2"]
    assert all(p.messages and p.data_source == "arithmetic" for p in prompts)
    builtin, none = train_prompts(load_config())
    assert none is None and builtin[0].messages == "" and builtin[0].prompt_id.startswith("add-")


def test_train_files_need_val_files() -> None:
    with pytest.raises(ConfigError, match="data.val_files is needed with data.train_files"):
        load_config(overrides=["data.train_files=x.parquet"])


def test_chat_messages_go_through_the_chat_template() -> None:
    tok = build_tokenizer()
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}={% endif %}"
    )
    messages = [{"role": "system", "content": "1+1"}, {"role": "user", "content": "2+2"}]
    ids = encode_prompt(tok, messages)
    assert ids == tok("1+1 2+2 =")["input_ids"]  # one <bos>, the generation prompt added
    assert ids.count(tok.bos_token_id) == 1
    assert encode_prompt(tok, "2+2=") == tok("2+2=")["input_ids"]  # plain text as it is
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(tok, messages)


def test_the_tiny_models_template_gives_the_tasks_own_tokens() -> None:
    """An exported task trains the built-in model on exactly the tokens the task feeds it."""
    tok = load_tokenizer(load_config())
    assert encode_prompt(tok, [{"role": "user", "content": "07+35="}]) == tok("07+35=")["input_ids"]


def test_a_hugging_face_checkpoint_loads_by_model_path(tmp_path: Path) -> None:
    cfg = load_config(overrides=SMALL_MODEL)
    tok = _tiny_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=3)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    mine = load_config(overrides=[f"actor_rollout_ref.model.path={tmp_path / 'ckpt'}"])
    check_startable(mine, "rollout")
    loaded, loaded_tok = load_policy(mine)
    from asyncrl.sync.checksum import weights_checksum

    assert weights_checksum(loaded) == weights_checksum(model)
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float32
    # A bf16 worker (rollout.dtype) reads the checkpoint straight into bf16: the weights a
    # sync from the float32 trainer would deliver.
    half, _ = load_policy(mine, dtype=torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert weights_checksum(half) == weights_checksum(model, dtype=torch.bfloat16)
    messages = [{"role": "user", "content": "12+30="}]
    assert encode_prompt(loaded_tok, messages) == encode_prompt(tok, messages)
    assert loaded_tok.pad_token_id == tok.pad_token_id
    # Beside the Qwen2 config.json, transformers 5's AutoTokenizer loaded the character
    # tokenizer as Qwen2Tokenizer, which dropped the spaces (the calculator's "=29842 29842").
    spaced = "12 + 30 = 42"
    assert loaded_tok(spaced)["input_ids"] == tok(spaced)["input_ids"]


def test_a_bad_model_path_stops_the_run_naming_the_key(tmp_path: Path) -> None:
    missing = load_config(overrides=[f"actor_rollout_ref.model.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path: .*no such directory"):
        check_startable(missing, "run")
    (tmp_path / "empty").mkdir()
    empty = load_config(overrides=[f"actor_rollout_ref.model.path={tmp_path / 'empty'}"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path: .*no config.json"):
        check_startable(empty, "train")
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path"):
        load_tokenizer(empty)
    # Weights saved without their tokenizer: transformers made an empty one, --dry-run said ok,
    # and the run failed three trainer restarts later on "0: empty prompt".
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"model.path: .*no tokenizer .*save_pretrained"):
        check_startable(empty, "rollout")


def test_missing_data_files_stop_the_run_naming_the_key(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            f"data.train_files={tmp_path / 'a.parquet'}",
            f"data.val_files=[{tmp_path / 'b.parquet'}]",
        ]
    )
    with pytest.raises(ConfigError) as err:
        check_startable(cfg, "run")
    assert "data.train_files" in str(err.value) and "data.val_files" in str(err.value)
    check_startable(cfg, "rollout")  # workers read prompts from the topic, not the files


def test_your_data_with_the_built_in_model_warm_starts_it_when_not_cached(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    """The README's bring-your-own example on a fresh machine: the demo policy, not cached yet,
    is warm-started, then measured on the files' held-out prompts, which are chat messages.
    Before, its tokenizer had no chat template at that point: the run failed after the warm
    start with "the tokenizer has no chat template ... actor_rollout_ref.model.path", a key
    the user never set, and every retry warm-started again (nothing was cached)."""
    from asyncrl.models.warm_start import load_policy as warm_load

    cfg = _files(
        exported,
        *SMALL_MODEL,
        "actor_rollout_ref.model.warmup_steps=2",
        f"actor_rollout_ref.model.cache_dir={tmp_path / 'cache'}",
    )
    model, tokenizer = warm_load(cfg)
    assert tokenizer.chat_template
    assert model.config.hidden_size == 16
    assert any((tmp_path / "cache").iterdir())  # cached: the next start loads it


@pytest.mark.parametrize("engine", ["hf", "hf_cached", "hf_static"])
def test_every_eos_of_the_generation_config_ends_a_response(tmp_path: Path, engine: str) -> None:
    """generation_config.json may list several eos ids (Qwen2.5/Qwen3 instruct models:
    ``<|im_end|>`` and ``<|endoftext|>``); verl's engines stop on each, and so do these (a
    response ran on past the second one: only the tokenizer's eos ended it)."""
    from asyncrl.producers.engines.base import GenRequest
    from asyncrl.producers.engines.factory import make_engine

    cfg = load_config(overrides=SMALL_MODEL)
    tok = _tiny_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=3)
    mine = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tmp_path / 'ckpt'}",
            f"actor_rollout_ref.rollout.name={engine}",
        ]
    )
    prompt = encode_prompt(tok, [{"role": "user", "content": "12+30="}])

    def greedy(path_model: torch.nn.Module) -> list[int]:
        gen = make_engine(mine, path_model, tok, seed=0)
        (res,) = gen.generate([GenRequest("r", prompt, 8, greedy=True)])
        return res.response_ids

    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    first = greedy(load_policy(mine)[0])[0]
    assert first != tok.eos_token_id
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    model.save_pretrained(tmp_path / "ckpt")
    loaded, _ = load_policy(mine)
    assert greedy(loaded) == [first], "the generation config's second eos ends the response"


def _short_checkpoint(tmp_path: Path) -> str:
    """A tiny checkpoint that takes 64 positions, as the override naming it."""
    cfg = load_config(overrides=SMALL_MODEL)
    tok = _tiny_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=0, positions=64)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    return f"actor_rollout_ref.model.path={tmp_path / 'ckpt'}"


def test_a_prompt_and_response_longer_than_the_model_takes_stop_the_run(tmp_path: Path) -> None:
    """data.max_prompt_length + data.max_response_length past the checkpoint's positions
    (config.json's max_position_embeddings, n_positions for GPT-2): a model with learned
    positions failed the trainer and the workers with IndexError, 3 restarts, then the run."""
    path = _short_checkpoint(tmp_path)
    fits = load_config(overrides=[path, "data.max_prompt_length=48", "data.max_response_length=16"])
    check_startable(fits, "rollout")
    long = load_config(overrides=[path, "data.max_prompt_length=48", "data.max_response_length=17"])
    for role in ("run", "train", "rollout"):
        with pytest.raises(
            ConfigError, match=r"data.max_response_length: .* 48 \+ 17 = 65 tokens, "
        ):
            check_startable(long, role)
    with pytest.raises(ConfigError, match=r"max_position_embeddings=64 in .*ckpt/config.json"):
        check_startable(long, "run")


def test_a_hub_id_loads_from_the_local_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verl's scripts name models by Hub id (actor_rollout_ref.model.path=Qwen/Qwen2.5-...),
    which transformers finds in the local cache: refused here as "no such directory" though
    the snapshot was on disk. It now loads from the cache (nothing is downloaded), and an id
    that is not cached says so."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    snapshot = cache / "models--me--tiny-chat" / "snapshots" / "0123abc"
    (cache / "models--me--tiny-chat" / "refs").mkdir(parents=True)
    (cache / "models--me--tiny-chat" / "refs" / "main").write_text("0123abc")
    cfg = load_config(overrides=SMALL_MODEL)
    tok = _tiny_tokenizer()
    build_model(cfg.actor_rollout_ref.model, len(tok), seed=3).save_pretrained(snapshot)
    tok.save_pretrained(snapshot)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a download would fail the test, not wait

    mine = load_config(overrides=["actor_rollout_ref.model.path=me/tiny-chat"])
    check_startable(mine, "rollout")
    model, loaded_tok = load_policy(mine)
    assert model.config.hidden_size == 16 and len(loaded_tok) == len(tok)
    other = load_config(overrides=["actor_rollout_ref.model.path=me/not-cached"])
    with pytest.raises(ConfigError, match=r"me/not-cached: no such directory, nor a model in the"):
        check_startable(other, "run")


def test_a_chat_template_that_refuses_a_prompt_names_the_prompt_and_the_key(
    tmp_path: Path,
) -> None:
    """Chat templates that raise_exception (Gemma's and Mistral's on a system message) ended
    asyncrl run (and its --dry-run) in a jinja2 TemplateError traceback."""
    tok = _tiny_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m['content'] }}{% endfor %}"
    )
    path = tmp_path / "system.parquet"
    rows = [
        {
            "data_source": "x",
            "prompt": [{"role": "user", "content": "1+2="}],
            "reward_model": {"ground_truth": "3"},
        },
        {
            "data_source": "x",
            "prompt": [
                {"role": "system", "content": "1+1"},
                {"role": "user", "content": "1="},
            ],
            "reward_model": {"ground_truth": "1"},
        },
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    cfg = load_config(
        overrides=[
            f"data.train_files={path}",
            f"data.val_files={path}",
            "custom_reward_function.path=r.py",
        ]
    )
    with pytest.raises(
        ConfigError,
        match=r"^data.train_files: prompt system-1: the chat template \(actor_rollout_ref.model"
        r".path\) fails on the prompt: TemplateError: System role not supported$",
    ):
        load_split(cfg, "train", tok)


def test_a_prompt_token_the_model_does_not_embed_stops_the_run(tmp_path: Path) -> None:
    """Tokens added to a checkpoint's tokenizer without resizing its embeddings: a prompt
    holding one made the trainer and the workers die on IndexError, restarted three times,
    then the run failed on the trainer's traceback."""
    cfg = load_config(overrides=SMALL_MODEL)
    tok = _tiny_tokenizer()
    build_model(cfg.actor_rollout_ref.model, len(tok), seed=0).save_pretrained(tmp_path / "ckpt")
    tok.add_special_tokens({"additional_special_tokens": ["<think>"]})
    tok.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "think.parquet"
    rows = [
        {
            "data_source": "x",
            "prompt": [{"role": "user", "content": text}],
            "reward_model": {"ground_truth": "3"},
        }
        for text in ("1+2=", "<think>1+2=")
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    mine = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tmp_path / 'ckpt'}",
            f"data.train_files={path}",
            f"data.val_files={path}",
            "custom_reward_function.path=r.py",
        ]
    )
    with pytest.raises(
        ConfigError,
        match=rf"^data.train_files: prompt think-1: token '<think>' \(id {len(tok) - 1}\) is past "
        rf"the model's vocab_size={len(tok) - 1} ",
    ):
        load_split(mine, "train", load_tokenizer(mine))


def test_override_config_reaches_the_loaded_model_and_the_length_check(tmp_path: Path) -> None:
    """verl's actor_rollout_ref.model.override_config (DAPO: max_position_embeddings=32768 over
    the checkpoint's 4096, for 20K-token responses) was refused; it now sets values over
    config.json where the trainer and workers load the model, and the start-up length check
    reads it."""
    path = _short_checkpoint(tmp_path)
    lengths = ["data.max_prompt_length=48", "data.max_response_length=80"]
    with pytest.raises(ConfigError, match="max_position_embeddings=64"):
        check_startable(load_config(overrides=[path, *lengths]), "rollout")
    override = [
        "+actor_rollout_ref.model.override_config.max_position_embeddings=256",
        "+actor_rollout_ref.model.override_config.attention_dropout=0.0",
    ]
    mine = load_config(overrides=[path, *lengths, *override])
    check_startable(mine, "rollout")
    model, _ = load_policy(mine)
    assert model.config.max_position_embeddings == 256
    with pytest.raises(ConfigError, match="override_config.*actor_rollout_ref.model.path"):
        load_config(
            overrides=["+actor_rollout_ref.model.override_config.max_position_embeddings=8"]
        )


def test_held_out_figures_per_data_source_under_verls_names(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    """A val set mixing data sources (AIME beside MATH, say) reported only their overall mean;
    each source's now comes as verl's val-core/<data_source>/reward/mean@1."""
    import dataclasses

    from asyncrl.producers.agent.factory import evaluate_rows

    reward = tmp_path / "by_source.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0 if data_source == 'other' else 0.25\n"
    )
    cfg = _files(exported, *SMALL_MODEL, f"custom_reward_function.path={reward}")
    rows = read_rows([str(exported["val"])], "prompt", "data.val_files")
    rows = [dataclasses.replace(r, data_source="other") if i < 4 else r for i, r in enumerate(rows)]
    tok = _tiny_tokenizer()
    model = build_model(cfg.actor_rollout_ref.model, len(tok), seed=0).eval()
    measured = evaluate_rows(cfg, model, tok, rows)
    assert measured["val-core/other/reward/mean@1"] == 1.0
    assert measured["val-core/arithmetic/reward/mean@1"] == 0.25
    assert measured["accuracy"] == pytest.approx((4 * 1.0 + 6 * 0.25) / 10)


def test_settings_of_a_checkpoint_leave_the_built_in_policys_cache_key_alone() -> None:
    """The cache key of the warm-started demo policy hashes the model section: a new field
    that applies only to model.path checkpoints (override_config) changed every key, and each
    user's next run warm-started the demo policy again (~45 s)."""
    from asyncrl.models.cache import cache_key

    path = "actor_rollout_ref.model.path=/models/mine"
    override = "+actor_rollout_ref.model.override_config.max_position_embeddings=8192"
    keys = {
        cache_key(load_config()),
        cache_key(load_config(overrides=[path])),
        cache_key(load_config(overrides=[path, override])),
        cache_key(load_config(overrides=["data.feed_ahead_steps=5"])),  # how prompts are fed
    }
    assert len(keys) == 1


def test_reading_the_data_files_reports_its_progress(
    exported: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A million rows take minutes to read and tokenize, and ``asyncrl run`` showed nothing
    meanwhile; the read and the length filter report as they go, for the set-up's live line."""
    from asyncrl.kafka import records

    monkeypatch.setattr(records, "REPORT_EVERY", 10)
    told: list[tuple[str, int]] = []
    with records.reporting_progress(lambda what, n: told.append((what, n))):
        train_prompts(_files(exported))
    assert told == [("reading data.train_files", n) for n in (10, 20, 30, 40)] + [
        ("tokenizing the prompts", n) for n in (10, 20, 30, 40)
    ]


def _bpe_tokenizer():
    """A byte-level BPE tokenizer that adds ``<s>`` to plain text, with a chat template:
    another model and post-processor than the built-in character tokenizer's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import TokenizersBackend

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(["be brief", "what is 12 + 30 ?", "hello world"] * 10, trainer)
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = TokenizersBackend(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    return tok


@pytest.mark.parametrize("tokenizer", [_tiny_tokenizer, _bpe_tokenizer])
def test_prompts_tokenized_in_batches_are_the_ones_tokenized_one_by_one(
    tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The length filter tokenizes the data files' prompts in batches (row by row was 2-5 s
    more of the set-up's 10-19 s at 100K rows): the same ids as the workers' encode_prompt,
    the same prompts kept, for chat and plain prompts, across batch boundaries."""
    from asyncrl.models.policy import encode_texts, prompt_text
    from asyncrl.tasks import files

    tok = tokenizer()
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "12+30="}]
    prompts = [chat, "12+30=", [{"role": "user", "content": "1+2="}], "hello world 1+1=", chat]
    one_by_one = [encode_prompt(tok, p) for p in prompts]
    assert encode_texts(tok, [prompt_text(tok, p) for p in prompts]) == one_by_one
    tok.backend_tokenizer.enable_truncation(3)  # not what calling the tokenizer does
    assert encode_texts(tok, [prompt_text(tok, p) for p in prompts]) == one_by_one

    monkeypatch.setattr(files, "ENCODE_BATCH", 2)
    rows = [files.DataRow(f"p-{i}", p, "arithmetic", "0") for i, p in enumerate(prompts)]
    limit = sorted(len(ids) for ids in one_by_one)[2]
    kept, too_long = filter_overlong(rows, tok, limit)
    assert kept == [r for r, ids in zip(rows, one_by_one, strict=True) if len(ids) <= limit]
    assert 0 < too_long == len(rows) - len(kept) < len(rows)
