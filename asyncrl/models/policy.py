"""The policy a run trains: your Hugging Face checkpoint, or the built-in tiny model.

``actor_rollout_ref.model.path`` names a local checkpoint directory (config.json, weights, the
tokenizer and its chat template). The trainer loads it with transformers in float32, every
rollout worker in ``actor_rollout_ref.rollout.dtype`` (:func:`rollout_dtype`, the dtype each
sync delivers), with no warm start. Unset, the built-in tiny model (:mod:`asyncrl.models.tiny`)
is built and warm-started on ``data.task`` once, and cached.

Prompts (:func:`encode_prompt`): chat messages go through the tokenizer's chat template with
the generation prompt added (and, with the agent loop, its tools' schemas), as verl's agent
loop does (the template's text, then tokenized without adding special tokens again); plain
text is tokenized as it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import ConfigError

if TYPE_CHECKING:
    import torch

    from asyncrl.config import RunConfig
    from asyncrl.models.tiny import Builder

PATH_KEY = "actor_rollout_ref.model.path"


def resolve_device(name: str) -> torch.device:
    """A ``trainer.device`` / ``rollout.device`` value: ``auto`` means CUDA when available."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """A ``rollout.dtype`` / ``actor.fsdp_config.dtype`` value for a model on ``device``:
    ``auto`` means bfloat16 on a GPU (verl's default), float32 on the CPU."""
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def rollout_dtype(cfg: RunConfig) -> torch.dtype:
    """``actor_rollout_ref.rollout.dtype``, resolved for the rollout's device. The trainer
    resolves it too (it casts each sync's weights to it), so ``auto`` must mean the same on
    both hosts (one host: it does)."""
    rollout = cfg.actor_rollout_ref.rollout
    return resolve_dtype(rollout.dtype, resolve_device(rollout.device))


TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['content'] }}{% endfor %}"
)
"""The built-in tiny model's chat template: the messages' text after ``<bos>``, which is what
the built-in tasks feed it (``07+35=`` -> ``<bos>07+35=``), so a verl-format export of a task
(`asyncrl export-data`) gives it the same tokens."""


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""``org/name``: a Hugging Face Hub model id, as verl's scripts name models."""


def model_dir(path: str) -> Path:
    """The checkpoint directory ``actor_rollout_ref.model.path`` names: a local directory, or
    a Hub id (``Qwen/Qwen2.5-0.5B-Instruct``) whose snapshot is in the local Hugging Face
    cache (HF_HOME, HF_HUB_CACHE), as transformers would find it for verl; nothing is
    downloaded. A path that is neither comes back as it is (check_model_path says so)."""
    where = Path(path).expanduser()
    if where.is_dir() or not _HUB_ID.fullmatch(path):
        return where
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True))
    except (ImportError, OSError, ValueError):  # not cached (LocalEntryNotFoundError), a bad id
        return where


def check_model_path(cfg: RunConfig) -> str | None:
    """Why ``actor_rollout_ref.model.path`` cannot be loaded, or None (unset, or fine)."""
    path = cfg.actor_rollout_ref.model.path
    if path is None:
        return None
    where = model_dir(path)
    if not where.is_dir():
        if _HUB_ID.fullmatch(path):
            return (
                f"{path}: no such directory, nor a model in the local Hugging Face cache "
                f"(asyncrl downloads nothing: `hf download {path}` first, or name a local "
                "checkpoint directory)"
            )
        return f"{path}: no such directory (a local Hugging Face checkpoint is needed)"
    if not (where / "config.json").is_file():
        return f"{path}: no config.json (not a Hugging Face checkpoint directory)"
    if not any((where / name).is_file() for name in TOKENIZER_FILES):
        # transformers then makes an empty tokenizer, and every prompt encodes to nothing
        return (
            f"{path}: no tokenizer ({', '.join(TOKENIZER_FILES[:2])}): save it beside the "
            "weights (tokenizer.save_pretrained(path))"
        )
    return None


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""config.json's names for the longest sequence a model takes (Qwen2/Llama, GPT-2, ...)."""


def max_positions(path: str, override: dict[str, Any] | None = None) -> tuple[str, int] | None:
    """``(key, value)``: the longest sequence the checkpoint at ``path`` declares in its
    config.json (its text model's, for a config that nests one), or None if it says none;
    a value ``override`` (``model.override_config``) sets over it first."""
    for key in POSITION_KEYS:
        if isinstance(value := (override or {}).get(key), int):
            return key, value
    return _declared(path, POSITION_KEYS)


def vocab_size(path: str) -> int | None:
    """The token ids the checkpoint at ``path`` embeds (config.json's vocab_size), or None."""
    found = _declared(path, ("vocab_size",))
    return None if found is None else found[1]


def _declared(path: str, keys: tuple[str, ...]) -> tuple[str, int] | None:
    import json

    try:
        config = json.loads((model_dir(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for where in (config, config.get("text_config") or {}):
        for key in keys:
            if isinstance(where.get(key), int) and where[key] > 0:
                return key, where[key]
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""Any one of them: a checkpoint directory that holds a tokenizer."""


def _checked_path(cfg: RunConfig) -> Path:
    problem = check_model_path(cfg)
    if problem is not None:
        raise ConfigError(f"{PATH_KEY}: {problem}")
    return model_dir(cfg.actor_rollout_ref.model.path or "")


def load_tokenizer(cfg: RunConfig) -> Any:
    """The policy's tokenizer, without loading its weights (the feed, ``inspect --text``)."""
    if cfg.actor_rollout_ref.model.path is None:
        from asyncrl.models.tiny import task_tokenizer

        return with_tiny_template(task_tokenizer(cfg.data))
    return _hf_tokenizer(cfg, _checked_path(cfg))


def _hf_tokenizer(cfg: RunConfig, path: Path) -> Any:
    from transformers import AutoTokenizer, TokenizersBackend

    loader: Any = TokenizersBackend if _declares_generic_tokenizer(path) else AutoTokenizer
    tok = loader.from_pretrained(
        path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code
    )
    if tok.eos_token_id is None:
        raise ConfigError(f"{PATH_KEY}: the tokenizer of {path} has no eos_token")
    if tok.pad_token_id is None:  # Llama-style tokenizers: padding is masked out anyway
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def _declares_generic_tokenizer(path: Path) -> bool:
    """The checkpoint's tokenizer_config.json names ``TokenizersBackend``: a tokenizer built
    from a ``tokenizers`` object (the built-in model's, as ``asyncrl export-model`` and
    ``tools/random_checkpoint.py`` save it), which transformers 5's AutoTokenizer loads as the
    config.json's model type's class instead (Qwen2Tokenizer: a byte-level pre-tokenizer that
    dropped every space and newline of the character vocabulary)."""
    import json

    try:
        declared = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return False
    return bool(declared == "TokenizersBackend")


def with_tiny_template(tokenizer: Any) -> Any:
    """The built-in model's tokenizer with its chat template, so chat prompts (your data's)
    encode; every path that hands that tokenizer out sets it."""
    if tokenizer.chat_template is None:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def load_policy(
    cfg: RunConfig, build: Builder | None = None, dtype: torch.dtype | None = None
) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, on the CPU, float32 or ``dtype``; its tokenizer) for this run's
    config: the checkpoint at ``model.path`` (read straight into ``dtype``: a bf16 worker never
    holds a float32 copy of a big model), or the cached demo policy (``build`` makes a missing
    one; ``asyncrl.models.warm_start.load_policy`` passes it)."""
    if cfg.actor_rollout_ref.model.path is None:
        from asyncrl.models.tiny import load_policy as load_tiny

        tiny, tokenizer = load_tiny(cfg, build)
        model: torch.nn.Module = tiny
        if dtype is not None:
            model.to(dtype)
        return model, with_tiny_template(tokenizer)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = _checked_path(cfg)
    tokenizer = _hf_tokenizer(cfg, path)
    remote = cfg.actor_rollout_ref.model.trust_remote_code
    config = AutoConfig.from_pretrained(path, trust_remote_code=remote)
    for key, value in cfg.actor_rollout_ref.model.override_config.items():
        setattr(config, key, value)  # verl's update_model_config
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=dtype or torch.float32, trust_remote_code=remote
    )
    model.config.use_cache = False  # the trainer and hf keep no cache (hf_cached asks for one)
    return model.eval(), tokenizer


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The tokens that end a response: the tokenizer's eos, then any other the checkpoint's
    generation_config.json names (an id or a list: Qwen2.5/Qwen3 instruct models list
    ``<|im_end|>`` and ``<|endoftext|>``, Llama 3 its ``<|eot_id|>``...), as verl's engines
    stop on every one of them; without this a response ran on past such a token."""
    ids = [tokenizer.eos_token_id]
    generation = getattr(model, "generation_config", None)
    extra = getattr(generation, "eos_token_id", None)
    for token in extra if isinstance(extra, list | tuple) else [extra]:
        if isinstance(token, int) and token not in ids:
            ids.append(token)
    return ids


def encode_prompt(
    tokenizer: Any,
    prompt: str | list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    chat_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """Token ids of a prompt: chat messages through the chat template (generation prompt
    added, and ``tools``, the agent loop's tool schemas, as verl passes them: a chat model's
    template writes them into its system prompt, one that ignores them is unchanged; and
    ``chat_kwargs``, ``data.apply_chat_template_kwargs``), plain text as it is (with the
    tokenizer's special tokens, e.g. ``<bos>``)."""
    text, special = prompt_text(tokenizer, prompt, tools, chat_kwargs)
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def prompt_text(
    tokenizer: Any,
    prompt: str | list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    chat_kwargs: dict[str, Any] | None = None,
) -> tuple[str, bool]:
    """What :func:`encode_prompt` tokenizes: (the text, whether the tokenizer adds its
    special tokens): plain text with them, chat messages through the chat template without."""
    if isinstance(prompt, str):
        return prompt, True
    if not tokenizer.chat_template:
        raise ConfigError(
            "the prompt is chat messages but the tokenizer has no chat template "
            f"(set one in the checkpoint's tokenizer_config.json, {PATH_KEY})"
        )
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            prompt, tools=tools, add_generation_prompt=True, tokenize=False, **(chat_kwargs or {})
        )
    except (TemplateError, ValueError, TypeError, KeyError) as err:
        # a template's raise_exception ("System role not supported"), or a broken template
        raise ConfigError(
            f"the chat template ({PATH_KEY}) fails on the prompt: {type(err).__name__}: {err}"
        ) from None
    return str(text), False


def encode_texts(tokenizer: Any, texts: list[tuple[str, bool]]) -> list[list[int]]:
    """:func:`prompt_text`'s texts as :func:`encode_prompt` tokenizes them, in one batch call
    of the ``tokenizers`` library where that is the same call (a fast tokenizer with no
    truncation, padding or split special tokens set), since the batch call runs on every core
    and skips transformers' per-row work: at 100K prompts it saves 2-5 s on two cores."""
    backend = _batch_backend(tokenizer)
    if backend is None:
        return [list(tokenizer(t, add_special_tokens=s)["input_ids"]) for t, s in texts]
    out: list[list[int]] = [[] for _ in texts]
    for special in (True, False):
        at = [i for i, (_, s) in enumerate(texts) if s is special]
        if at:
            encoded = backend.encode_batch([texts[i][0] for i in at], add_special_tokens=special)
            for i, enc in zip(at, encoded, strict=True):
                out[i] = list(enc.ids)
    return out


def _batch_backend(tokenizer: Any) -> Any:
    """The tokenizer's ``tokenizers.Tokenizer`` when encoding with it is exactly what calling
    the tokenizer does (transformers' TokenizersBackend, neither call overridden, nothing
    that call would change on the backend first), else None."""
    from transformers import TokenizersBackend

    if not isinstance(tokenizer, TokenizersBackend):
        return None
    cls = type(tokenizer)
    backend = tokenizer.backend_tokenizer
    same = (
        cls.__call__ is TokenizersBackend.__call__
        and cls._encode_plus is TokenizersBackend._encode_plus
        and backend.truncation is None
        and backend.padding is None
        and not getattr(tokenizer, "split_special_tokens", False)
        and not backend.encode_special_tokens
    )
    return backend if same else None
