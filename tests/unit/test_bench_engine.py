"""``asyncrl bench engine`` at a tiny size: both engines measured, a finite ratio, and each
engine's logprobs the trainer's (its figures are not asserted)."""

import io
import json
import math

from rich.console import Console

from asyncrl.bench.engine import engine


def test_bench_engine_measures_both_engines_side_by_side(tmp_path):
    out = io.StringIO()
    results = engine(
        None,
        [f"output_dir='{tmp_path}'"],
        Console(file=out, width=160),
        shapes=("demo", "5M"),
        batch=3,
        prompt_len=6,
        new_tokens=4,
        device="cpu",
        repeats=1,
    )
    assert list(results) == ["demo", "5M"]
    for row in results.values():
        assert row["hf"]["tokens"] == row["hf_cached"]["tokens"] == 3 * 4
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
        assert row["hf"]["logprob_max_abs_diff"] < 1e-4
        assert row["hf_cached"]["logprob_max_abs_diff"] < 1e-4
    text = out.getvalue()
    rows = [line.split("│")[5].strip() for line in text.splitlines() if line.startswith("│")]
    assert rows == ["hf", "hf_cached", "hf", "hf_cached"]  # the table: a row per engine
    assert "demo: hf_cached / hf tokens/s = " in text
    assert json.loads(next(tmp_path.glob("bench-engine-*.json")).read_text()) == results
