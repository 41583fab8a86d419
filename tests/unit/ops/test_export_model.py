"""``asyncrl export-model``: a run's trained policy as a Hugging Face checkpoint directory. The
trainer's checkpoints are torch state dicts (model.pt, optimizer.pt, rng.pt) for resuming:
a user who brought a checkpoint had no way back to one that transformers, vLLM or
actor_rollout_ref.model.path loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.cli import main
from asyncrl.config import dump_config, load_config
from asyncrl.models.policy import TINY_CHAT_TEMPLATE
from asyncrl.models.tiny import build_model, build_tokenizer
from tests.helpers import SMALL_MODEL


def test_a_checkpoint_step_exports_as_a_hugging_face_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = build_tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    model = build_model(load_config(overrides=SMALL_MODEL).actor_rollout_ref.model, len(tok), 0)
    model.generation_config.eos_token_id = [tok.eos_token_id, 5]
    model.save_pretrained(tmp_path / "mine")
    tok.save_pretrained(tmp_path / "mine")
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tmp_path / 'mine'}",
            f"output_dir={tmp_path / 'runs'}",
            "run_id=r1",
        ]
    )
    dump_config(cfg, cfg.run_dir / "config.yaml")
    trained = {k: v + 0.5 for k, v in model.state_dict().items()}  # "trained" weights
    for step, state in ((2, model.state_dict()), (3, trained)):
        ckpt = cfg.run_dir / "checkpoints" / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        torch.save(state, ckpt / "model.pt")
        for name in ("optimizer.pt", "rng.pt", "state.json"):
            (ckpt / name).write_text("{}")
    (cfg.run_dir / "checkpoints" / "latest").write_text("step_000003")

    out = tmp_path / "exported"
    assert main(["export-model", str(cfg.run_dir), "--out", str(out)]) == 0
    assert "step_000003 of run r1" in capsys.readouterr().out
    loaded = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.items())
    assert loaded.generation_config.eos_token_id == [tok.eos_token_id, 5]
    assert AutoTokenizer.from_pretrained(out).chat_template == TINY_CHAT_TEMPLATE

    assert main(["export-model", "r1", "--output-dir", str(tmp_path / "runs"), "--step", "2",
                 "--out", str(tmp_path / "two")]) == 0  # fmt: skip
    two = AutoModelForCausalLM.from_pretrained(tmp_path / "two")
    assert torch.equal(two.lm_head.weight, model.lm_head.weight)
    assert main(["export-model", str(cfg.run_dir), "--step", "7", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint of step 7" in err and "kept: step_000002, step_000003" in err
    assert main(["export-model", str(cfg.run_dir), "--out", str(out)]) == 1
    assert "is not empty" in capsys.readouterr().err
