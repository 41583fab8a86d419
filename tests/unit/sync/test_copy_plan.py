"""Every way of the in-place copy writes exactly what one plain copy per pair writes (a GPU
times them and keeps the fastest: whichever it keeps must be right)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.sync.copy_plan import LARGE_BYTES, WAYS, CopyPlan


def _pairs(device: str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sources and zeroed targets covering each way's cases: plain bf16 copies (small, large,
    a size that is no whole number of 8-byte words), casts, integer and bool buffers, a
    transposed source, one source into two targets (an untied alias), an empty tensor."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    large = rand(LARGE_BYTES // 2 + 64)  # bf16: over LARGE_BYTES
    shared = rand(16, 8)
    sources = [
        (torch.bfloat16, rand(64, 32)),
        (torch.bfloat16, large),
        (torch.bfloat16, rand(7)),  # 14 bytes
        (torch.bfloat16, rand(32, dtype=torch.float32)),  # cast on the way
        (torch.float32, rand(LARGE_BYTES // 4 + 8, dtype=torch.float32)),
        (torch.bfloat16, rand(LARGE_BYTES // 4 + 8, dtype=torch.float32)),  # a large cast
        (torch.int64, torch.arange(5, device=device)),
        (torch.bool, (rand(24) > 0)),
        (torch.bfloat16, rand(8, 16).t()),  # not contiguous
        (torch.bfloat16, shared),
        (torch.bfloat16, shared),
        (torch.bfloat16, rand(0)),
    ]
    return [(torch.zeros(s.shape, dtype=dt, device=device), s) for dt, s in sources]


@pytest.mark.parametrize("way", WAYS)
def test_each_way_copies_every_pair_exactly(way):
    pairs = _pairs()
    plan = CopyPlan(pairs, way=way)
    plan.run()
    plan.synchronize()
    for d, s in pairs:
        assert torch.equal(d, s.to(d.dtype)), (way, d.shape, d.dtype, s.dtype)
    assert plan.last_s is not None and plan.last_s >= 0


def test_again_after_the_sources_change():
    pairs = _pairs()
    plan = CopyPlan(pairs, way="foreach_wide")
    plan.run()
    for _, s in pairs:
        if s.dtype.is_floating_point:
            s.add_(1)
    plan.run()
    for d, s in pairs:
        assert torch.equal(d, s.to(d.dtype))


def test_the_first_copy_tries_every_way_and_a_way_that_fails_is_dropped(caplog):
    pairs = _pairs()
    plan = CopyPlan(pairs, choose=True)  # what a GPU does; timed by the clock here

    def broken() -> None:  # writes half, then fails
        pairs[0][0].fill_(7)
        raise RuntimeError("no kernel for this")

    plan._runs["foreach_wide"] = broken
    plan.run()
    plan.synchronize()
    assert set(plan.tried) == {"foreach", "large_apart"} and plan.way in plan.tried
    assert "foreach_wide failed" in caplog.text
    for d, s in pairs:  # the chosen way copied last
        assert torch.equal(d, s.to(d.dtype))


def test_on_a_cpu_there_is_nothing_to_choose_and_a_wrong_way_is_refused():
    assert CopyPlan(_pairs()).way == "foreach"
    with pytest.raises(ValueError, match="unknown way"):
        CopyPlan(_pairs(), way="memcpy")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_first_copy_times_every_way_and_keeps_the_fastest():
    pairs = _pairs("cuda")
    plan = CopyPlan(pairs)
    assert plan.way is None
    plan.run()
    plan.synchronize()
    assert set(plan.tried) == set(WAYS)
    assert plan.way == min(plan.tried, key=plan.tried.__getitem__)
    for d, s in pairs:
        assert torch.equal(d, s.to(d.dtype))
    for _, s in pairs:  # the chosen way, timed by events
        if s.dtype.is_floating_point:
            s.mul_(2)
    plan.run()
    plan.synchronize()
    assert plan.last_s is not None and plan.last_s > 0
    for d, s in pairs:
        assert torch.equal(d, s.to(d.dtype))


def test_only_plain_copies_of_whole_words_are_widened():
    from asyncrl.sync.copy_plan import _as_words

    a, b = torch.zeros(64, 32, dtype=torch.bfloat16), torch.ones(64, 32, dtype=torch.bfloat16)
    words = _as_words(a, b)
    assert words is not None and words[0].dtype == torch.int64 and words[0].numel() == 512
    assert words[0].data_ptr() == a.data_ptr()  # a view: writing it writes the target
    assert (
        _as_words(torch.zeros(7, dtype=torch.bfloat16), torch.ones(7, dtype=torch.bfloat16)) is None
    )
    assert _as_words(a, b.float()) is None  # a cast
    assert _as_words(torch.zeros(32, 64, dtype=torch.bfloat16).t(), b) is None


def test_only_pairs_back_to_back_at_both_ends_merge():
    """Tensors apart never merge; one buffer's slices merge only where both ends continue
    exactly where they stopped (a gap may hold someone else's memory)."""
    pairs = _pairs()
    assert len(CopyPlan(pairs).pairs) == len(pairs)
    src, dst = torch.arange(40.0), torch.zeros(40)
    back_to_back = [(dst[0:10], src[0:10]), (dst[10:25], src[10:25]), (dst[25:40], src[25:40])]
    plan = CopyPlan(back_to_back[::-1])  # in another order than memory's (a sorted manifest)
    assert len(plan.pairs) == 1 and plan.tensors == 3
    plan.run()
    assert torch.equal(dst, src)
    gap = [(dst[0:10], src[0:10]), (dst[11:20], src[10:19])]  # the target skips one
    swapped = [(dst[10:20], src[0:10]), (dst[0:10], src[10:20])]  # the target goes backwards
    cast = [(dst[0:10], src[0:10]), (dst[10:20].to(torch.bfloat16), src[10:20])]
    for name, case in {"gap": gap, "swapped": swapped, "other storage": cast}.items():
        assert len(CopyPlan(case).pairs) == 2, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("way", WAYS)
def test_on_a_gpu_flat_weights_are_one_copy(way):
    from asyncrl.bench.sync import on_device, qwen2_like_state

    src = on_device(qwen2_like_state("5M", fill=True), "cuda")  # flat on a GPU
    dst = on_device(qwen2_like_state("5M", fill=False), "cuda")
    names = sorted(n for n in src if n != "lm_head.weight")  # a manifest's order; tied: once
    plan = CopyPlan([(dst[n], src[n]) for n in names], way=way)
    assert len(plan.pairs) == 1
    plan.run()
    plan.synchronize()
    for n in names:
        assert torch.equal(dst[n], src[n]), n
