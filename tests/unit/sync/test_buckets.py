"""Bucket planning, packing and unpacking (plus the checksum and snapshot helpers built on them)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asyncrl.bench.snapshot import load_snapshot, save_snapshot
from asyncrl.sync.buckets import (
    manifest_digest,
    named_tensors,
    pack,
    plan_buckets,
    unpack,
    weight_manifest,
)
from asyncrl.sync.checksum import weights_checksum


class Tied(nn.Module):
    """Embedding tied to the output head, a bf16 layer and an int64 buffer: every case at once."""

    def __init__(self, vocab: int = 11, dim: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.body = nn.Linear(dim, dim)
        self.lowp = nn.Linear(dim, dim).to(torch.bfloat16)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))


def _randomize(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                t.copy_(torch.randint(0, 1000, t.shape, generator=g))


def _bitwise_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(
        sa[k].dtype == sb[k].dtype and torch.equal(sa[k].view(torch.uint8), sb[k].view(torch.uint8))
        for k in sa
    )


def test_manifest_is_sorted_and_dedups_tied_weights() -> None:
    m = Tied()
    manifest = weight_manifest(m)
    names = [s.name for s in manifest]
    assert names == sorted(names)
    tied = [s for s in manifest if s.aliases]
    assert [(s.name, s.aliases) for s in tied] == [("embed.weight", ("head.weight",))]
    assert "head.weight" not in names
    assert {s.dtype for s in manifest} == {torch.float32, torch.bfloat16, torch.int64}
    # a plain state dict (tied entries are the same tensor) gives the same manifest
    assert weight_manifest(m.state_dict()) == manifest


def test_plan_is_deterministic() -> None:
    a, b = Tied(), Tied()
    _randomize(b, 3)  # values do not matter, only names/shapes/dtypes
    ma, mb = weight_manifest(a), weight_manifest(b)
    assert manifest_digest(ma) == manifest_digest(mb)
    assert plan_buckets(ma, 64) == plan_buckets(mb, 64)
    assert plan_buckets(ma, 64) == plan_buckets(list(ma), 64)
    # digest changes with any shape change
    assert manifest_digest(ma) != manifest_digest(weight_manifest(Tied(dim=9)))


def test_buckets_respect_size_and_dtype() -> None:
    manifest = weight_manifest(Tied())
    bucket_bytes = 100
    buckets = plan_buckets(manifest, bucket_bytes)
    assert [b.index for b in buckets] == list(range(len(buckets)))
    planned = [s for b in buckets for s in b.specs]
    assert sorted(s.name for s in planned) == sorted(s.name for s in manifest)
    for b in buckets:
        assert all(s.dtype == b.dtype for s in b.specs)
        assert b.numel == sum(s.numel for s in b.specs)
        if b.nbytes > bucket_bytes:  # only a lone oversized tensor may exceed the limit
            assert len(b.specs) == 1 and b.specs[0].nbytes > bucket_bytes
    # the 11x8 fp32 embedding (352 B) is bigger than a bucket: alone
    (emb,) = [b for b in buckets if b.specs[0].name == "embed.weight"]
    assert len(emb.specs) == 1
    # one huge bucket: one bucket per dtype
    assert len(plan_buckets(manifest, 1 << 30)) == 3
    with pytest.raises(ValueError):
        plan_buckets(manifest, 0)


@pytest.mark.parametrize("bucket_bytes", [1, 40, 100, 1 << 20])
def test_pack_unpack_round_trip_is_exact(bucket_bytes: int) -> None:
    src, dst = Tied(), Tied()
    _randomize(src, 1)
    _randomize(dst, 2)
    assert not _bitwise_equal(src, dst)
    dst_head = dst.head.weight
    manifest = weight_manifest(src)
    assert manifest == weight_manifest(dst)
    src_t, dst_t = named_tensors(src), named_tensors(dst)
    for bucket in plan_buckets(manifest, bucket_bytes):
        flat = pack(bucket, src_t)
        assert flat.dtype == bucket.dtype and flat.numel() == bucket.numel
        unpack(bucket, flat, dst_t)
    assert _bitwise_equal(src, dst)
    assert dst.head.weight is dst_head  # updated in place, still tied
    assert dst.head.weight is dst.embed.weight
    assert weights_checksum(src) == weights_checksum(dst)


def test_unpack_updates_untied_alias_and_keeps_grad_state() -> None:
    src = Tied()
    _randomize(src, 5)
    # receiver given as a dict in which the tied names are two separate tensors
    into = {k: v.detach().clone() for k, v in src.state_dict().items()}
    for v in into.values():
        v.zero_()
    manifest = weight_manifest(src)
    for bucket in plan_buckets(manifest, 64):
        unpack(bucket, pack(bucket, named_tensors(src)), into)
    assert torch.equal(into["head.weight"], src.head.weight)
    assert torch.equal(into["embed.weight"], src.embed.weight)
    # unpacking into live parameters works despite requires_grad (no_grad inside)
    dst = Tied()
    for bucket in plan_buckets(manifest, 64):
        unpack(bucket, pack(bucket, named_tensors(src)), named_tensors(dst))
    assert dst.body.weight.requires_grad and dst.body.weight.grad_fn is None


def test_pack_reuses_out_buffer_and_rejects_shape_mismatch() -> None:
    manifest = weight_manifest(Tied())
    bucket = next(b for b in plan_buckets(manifest, 1 << 20) if b.dtype == torch.float32)
    out = torch.empty(bucket.numel + 7)
    flat = pack(bucket, named_tensors(Tied()), out=out)
    assert flat.data_ptr() == out.data_ptr()
    wrong = named_tensors(Tied(dim=9))
    with pytest.raises(ValueError, match="expected"):
        pack(bucket, wrong)


def test_checksum_sees_every_bit() -> None:
    m = Tied()
    before = weights_checksum(m)
    assert before == weights_checksum(m.state_dict())
    with torch.no_grad():
        w = m.lowp.weight.view(torch.int16)
        w[0, 0] ^= 1  # flip the lowest bit of one bf16 value
    assert weights_checksum(m) != before


def test_checksum_pieces_each_count(monkeypatch) -> None:
    """Hashed in pieces on a thread pool (here 64-byte ones): a bit flipped in any piece
    shows, and the same bytes give the same digest whatever the threads' order."""
    from asyncrl.sync import checksum

    monkeypatch.setattr(checksum, "CHUNK", 64)
    monkeypatch.setattr(checksum, "INLINE_BYTES", 0)  # these small weights too: on the pool
    m = Tied()
    before = weights_checksum(m)
    assert before.startswith("sha256-tree:") and before == weights_checksum(m)
    flat = m.lowp.weight.view(-1).view(torch.int16)
    for i in (0, 40, flat.numel() - 1):  # the first, a middle and the last piece
        with torch.no_grad():
            flat[i] ^= 1
            assert weights_checksum(m) != before
            flat[i] ^= 1
    assert weights_checksum(m) == before


def test_small_weights_are_hashed_without_a_pool_to_the_same_digest(monkeypatch) -> None:
    """A sync of a small policy waits for its checksum: starting a thread pool cost more than
    the hashing, so weights under INLINE_BYTES are hashed on the calling thread."""
    from asyncrl.sync import checksum

    monkeypatch.setattr(checksum, "CHUNK", 64)
    m = Tied()
    monkeypatch.setattr(checksum, "INLINE_BYTES", 0)
    pooled = weights_checksum(m)

    def no_pool(*args, **kwargs):
        raise AssertionError("a thread pool was started for a small model")

    monkeypatch.setattr(checksum, "INLINE_BYTES", 8 << 20)
    monkeypatch.setattr(checksum, "ThreadPoolExecutor", no_pool)
    assert weights_checksum(m) == pooled
    monkeypatch.setattr(checksum, "INLINE_BYTES", 16)  # above it: the pool again
    with pytest.raises(AssertionError, match="thread pool"):
        weights_checksum(m)


def test_the_on_device_format_sees_every_word_and_every_name(monkeypatch) -> None:
    """``wsum64:`` (what a trainer on a GPU publishes): a flipped low bit in any tensor (bf16,
    float32, the int64 buffer, either end of a piece) changes it, so do two equal-shaped
    tensors trading names; tied weights count once; the pieces' boundaries do not matter."""
    from asyncrl.sync import checksum

    m = Tied()
    _randomize(m, 3)
    before = weights_checksum(m, like="wsum64:")
    assert before.startswith("wsum64:") and before == weights_checksum(m.state_dict(), like=before)
    monkeypatch.setattr(checksum, "PIECE", {"cpu": 5, "cuda": 5})
    assert weights_checksum(m, like=before) == before  # sums mod 2**64 in any grouping
    for t in (m.lowp.weight, m.body.weight, m.embed.weight, m.steps):
        words = t.data.view(-1).view(
            {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
        )
        for i in {0, 4, min(5, words.numel() - 1), words.numel() - 1}:
            words[i] ^= 1
            assert weights_checksum(m, like=before) != before, (t.shape, i)
            words[i] ^= 1
    assert weights_checksum(m, like=before) == before
    with torch.no_grad():
        body, lowp = m.body.weight.clone(), m.lowp.weight.clone()
        m.body.weight.copy_(lowp.float())
        m.lowp.weight.copy_(body.to(torch.bfloat16))
        swapped = weights_checksum(m, like=before)
        m.body.weight.copy_(m.lowp.weight.float())  # the same values in both: names differ
        assert weights_checksum(m, like=before) not in (before, swapped)


def test_the_on_device_format_of_cast_weights_is_the_cast_copys() -> None:
    """A float32 trainer's checksum cast to bf16 is its bf16 worker's, in either format; a
    checksum's format is told by its prefix."""
    from asyncrl.sync.checksum import same_format

    trainer = Tied()
    _randomize(trainer, 5)
    worker = Tied()
    worker.load_state_dict(trainer.state_dict())
    worker.to(torch.bfloat16)
    for like in ("wsum64:", "sha256-tree:"):
        sent = weights_checksum(trainer, like=like, dtype=torch.bfloat16)
        assert sent == weights_checksum(worker, like=sent) != weights_checksum(trainer, like=like)
    assert same_format("wsum64:ab", "wsum64:cd") and not same_format("wsum64:ab", "sha256-tree:ab")
    assert weights_checksum(trainer).startswith("sha256-tree:")  # weights on a CPU: sha256


def _flat_twin(model: nn.Module, device: str = "cpu") -> nn.Module:
    """A copy of a ``Tied`` on ``device``, flat (``asyncrl.models.flat``)."""
    from asyncrl.models.flat import flatten_parameters

    twin = Tied()
    twin.load_state_dict(model.state_dict())
    twin.to(device)
    assert flatten_parameters(twin) == 2  # one float32 buffer, one bf16
    return twin


def test_a_flat_models_word_sums_are_taken_by_segments_to_the_same_digest(monkeypatch) -> None:
    """On a GPU the tensors of one flat buffer are summed as its segments (a few kernels per
    piece of the buffer, not per tensor): the digest is the tensor-by-tensor one, at any piece
    size and cast, every word of a tensor counts, and the alignment gaps between them do not."""
    from asyncrl.sync import checksum

    monkeypatch.setattr(checksum, "SEGMENTS", {"cpu": True, "cuda": True})
    segmented: list[int] = []
    real = checksum._segment_word_sums
    monkeypatch.setattr(
        checksum, "_segment_word_sums", lambda v, d: (segmented.append(len(v)), real(v, d))[1]
    )
    apart = Tied()
    _randomize(apart, 11)
    flat = _flat_twin(apart)
    wanted = {d: weights_checksum(apart, like="wsum64:", dtype=d) for d in (None, torch.bfloat16)}
    assert segmented == []  # apart: each tensor its own storage
    for piece in (5, 16, 17, 1 << 18):  # inside a tensor, at the alignment, across gaps
        monkeypatch.setattr(checksum, "PIECE", {"cpu": piece, "cuda": piece})
        for dtype, digest in wanted.items():
            assert weights_checksum(flat, like="wsum64:", dtype=dtype) == digest, (piece, dtype)
    assert segmented and set(segmented) == {2, 3}  # float32: embed, body.{weight,bias}
    buffer = flat.body.weight.untyped_storage()
    words = torch.empty(0, dtype=torch.int32).set_(buffer)  # the whole float32 buffer
    tensors = (flat.embed.weight, flat.body.weight, flat.body.bias)
    firsts = [t.storage_offset() for t in tensors]
    lasts = [t.storage_offset() + t.numel() - 1 for t in tensors]
    gap = lasts[0] + 1  # embed's 88 words, then a gap up to the next multiple of 16
    assert gap < firsts[1] and lasts[-1] < words.numel() - 1
    for i in firsts + lasts:
        words[i] ^= 1
        assert weights_checksum(flat, like="wsum64:") != wanted[None], i
        words[i] ^= 1
    words[gap] ^= 1  # nobody's words
    words[-1] ^= 1
    assert weights_checksum(flat, like="wsum64:") == wanted[None]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_flat_models_checksum_is_its_tensor_by_tensor_one(monkeypatch) -> None:
    """Where it counts: a flat model on a GPU, its segments summed there."""
    from asyncrl.sync import checksum

    cpu = Tied()
    _randomize(cpu, 13)
    flat = _flat_twin(cpu, "cuda")
    segmented = {d: weights_checksum(flat, dtype=d) for d in (None, torch.bfloat16)}
    monkeypatch.setattr(checksum, "SEGMENTS", {"cuda": False})
    for dtype, digest in segmented.items():
        assert digest.startswith("wsum64:")
        assert weights_checksum(flat, dtype=dtype) == digest  # tensor by tensor there
        assert weights_checksum(cpu, like=digest, dtype=dtype) == digest


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_checksum_is_computed_there_and_a_cpu_agrees() -> None:
    cpu = Tied()
    _randomize(cpu, 9)
    gpu = Tied().cuda()
    gpu.load_state_dict(cpu.state_dict())
    on_device = weights_checksum(gpu)
    assert on_device.startswith("wsum64:")
    assert weights_checksum(cpu, like=on_device) == on_device
    assert weights_checksum(gpu, like="sha256-tree:") == weights_checksum(cpu)


def test_snapshot_round_trip_with_tied_weights(tmp_path) -> None:
    src, dst = Tied(), Tied()
    _randomize(src, 7)
    path = save_snapshot(src, tmp_path, version=12)
    assert path.exists() and path.parent == tmp_path
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]
    head = dst.head.weight
    assert load_snapshot(dst, path) == 12
    assert _bitwise_equal(src, dst)
    assert dst.head.weight is head and head is dst.embed.weight
    with pytest.raises(ValueError, match="does not match"):
        load_snapshot(nn.Linear(2, 2), path)
