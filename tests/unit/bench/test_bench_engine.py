"""``asyncrl bench engine`` at a tiny size: every engine measured, finite ratios, and each
engine's logprobs the trainer's (its figures are not asserted)."""

import io
import json
import math

import pytest
from rich.console import Console

from asyncrl.bench.engine import ENGINES, engine


def test_bench_engine_measures_the_engines_side_by_side(tmp_path):
    out = io.StringIO()
    results = engine(
        None,
        [f"output_dir='{tmp_path}'", "actor_rollout_ref.rollout.enforce_eager=true"],
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
        for name in ENGINES:  # vllm too where it is installed
            assert row[name]["tokens"] == 3 * 4
            assert row[name]["logprob_max_abs_diff"] < 1e-4
        assert list(row["ratios"]) == list(ENGINES[1:])
        assert all(math.isfinite(x) and x > 0 for x in row["ratios"].values())
    text = out.getvalue()
    rows = [line.split("│")[5].strip() for line in text.splitlines() if line.startswith("│")]
    assert rows == list(ENGINES) * 2  # the table: a row per engine
    assert "demo: hf_cached / hf tokens/s = " in text
    assert "hf_static / hf tokens/s = " in text
    assert json.loads(next(tmp_path.glob("bench-engine-*.json")).read_text()) == results


# Opt-in (`make test-heavy`, ~24 s): `bench engine`'s measurement itself is the test above.
@pytest.mark.heavy
def test_profile_prints_where_each_cached_engines_generation_goes(tmp_path):
    out = io.StringIO()
    engine(
        None,
        [f"output_dir='{tmp_path}'"],
        Console(file=out, width=200),
        shapes=("demo",),
        batch=2,
        prompt_len=4,
        new_tokens=3,
        device="cpu",
        repeats=1,
        profile=True,
    )
    text = out.getvalue()
    for name in ("hf_cached", "hf_static"):
        assert f"demo {name}: the costliest ops of one more generation" in text
    assert "demo hf: the costliest" not in text
    assert text.count("Self CPU time total") == 2 and "aten::" in text
