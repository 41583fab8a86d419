"""Interactions (simulated users) from a YAML config, as verl configures them.

``actor_rollout_ref.rollout.multi_turn.interaction_config_path`` names a file in verl's
format::

    interaction:
      - name: retry                      # optional: the class name, less "Interaction", lower
        class_name: asyncrl.producers.agent.retry_interaction.RetryInteraction
        config: {max_retries: 1}

Each entry's class is built as ``Class(config=config)`` (``config["name"]`` set, as verl
does) and follows verl's ``BaseInteraction`` (:class:`Interaction` here, whose shape a verl
interaction already has): async ``start_interaction(instance_id, **kwargs)``,
``generate_response(instance_id, messages, **kwargs) -> (should_terminate, response, score,
metadata)``, ``calculate_score`` and ``finalize_interaction``. A sample picks one by its
``extra_info.interaction_kwargs.name`` (with a single interaction configured, a sample that
names none gets it), and those kwargs are passed to ``start_interaction`` and
``generate_response``.

:class:`ConfiguredInteractions` is what the agent loop calls (``loop.Interaction``). In a
trajectory, an interaction is started before its first reply in this process (``instance_id``
is the trajectory's request id) and finalized when the trajectory ends or is interrupted, so
per-instance state lives no longer than the process that runs the trajectory: a trajectory
resumed elsewhere starts its interaction again, and an interaction must read what it needs from
the ``messages`` (the prompt's, then the conversation) and its kwargs.
"""

from __future__ import annotations

import inspect
import math
import numbers
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, RunConfig
from asyncrl.producers.agent.state import AgentState
from asyncrl.producers.tools.registry import ConfigFileError, import_class, read_entries
from asyncrl.tasks.files import INTERACTION_KEY, pick_interaction

KEY = INTERACTION_KEY

ENTRY_KEYS = ("name", "class_name", "config")
"""The keys of one entry under ``interaction`` (verl's)."""


class InteractionConfigError(ConfigFileError):
    """The interaction config cannot be used."""


class InteractionError(RuntimeError):
    """An interaction failed while it answered a trajectory (it raised, or returned the wrong
    shape): the trajectory ends with ``finish_reason`` ``interaction_error``."""


class Interaction:
    """verl's ``BaseInteraction``: subclass it (or write a class of the same shape; a verl
    interaction works as it is, if its imports do). Methods are async: a user model or an
    environment behind a network call would be."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.name: str = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """A trajectory starts talking to this interaction; returns its instance id."""
        return instance_id or ""

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """The user's turn after the model's answer (the last assistant message):
        ``(should_terminate, response, score, metadata)``. ``response`` is appended as the
        user's message, and ``should_terminate`` then ends the trajectory; ``score`` (None:
        none) is kept in the trajectory's ``turn_scores`` (verl's), which the reward function
        reads in ``extra_info``."""
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        """A turn's score, for the interaction's own use (the sample's reward comes from the
        reward function)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        """Release what ``start_interaction`` kept for ``instance_id``."""


def _default_name(class_name: str) -> str:
    """verl's name for an entry without one: the class name, less ``Interaction``, lower."""
    simple = class_name.rsplit(".", 1)[-1]
    return (simple.removesuffix("Interaction") or simple).lower()


def _entries(path: str | Path) -> tuple[Path, list[tuple[str, str, dict[str, Any]]]]:
    """(the file, its entries as (where, name, entry)); names are unique."""
    path, entries = read_entries(path, "interaction", ENTRY_KEYS, InteractionConfigError)
    named: list[tuple[str, str, dict[str, Any]]] = []
    for where, entry in entries:
        name = entry.get("name") or _default_name(str(entry["class_name"]))
        if not isinstance(name, str):
            raise InteractionConfigError(f"{where}.name: must be a string, not {name!r}")
        if any(name == other for _, other, _ in named):
            raise InteractionConfigError(f"{where}.name: {name!r} twice")
        if not isinstance(entry.get("config") or {}, dict):
            raise InteractionConfigError(f"{where}.config: must be a mapping")
        named.append((where, name, entry))
    return path, named


def interaction_names(path: str | Path) -> list[str]:
    """The names a sample can pick, read without importing anything (``--dry-run``, data)."""
    return [name for _, name, _ in _entries(path)[1]]


def load_interactions(path: str | Path) -> dict[str, Any]:
    """The interactions of an interaction config file, built, by name."""
    _, entries = _entries(path)
    built: dict[str, Any] = {}
    for where, name, entry in entries:
        dotted = str(entry["class_name"])
        cls = import_class(dotted, where, InteractionConfigError)
        if not inspect.iscoroutinefunction(getattr(cls, "generate_response", None)):
            raise InteractionConfigError(
                f"{where}.class_name: {dotted} needs an async def generate_response(instance_id, "
                "messages, **kwargs) (verl's BaseInteraction)"
            )
        config = {**(entry.get("config") or {}), "name": name}
        try:
            built[name] = cls(config=config)
        except Exception as err:  # the interaction's own start failed (a client, a key)
            raise InteractionConfigError(
                f"{where}: {cls.__name__}(config=...) raised {type(err).__name__}: {err}"
            ) from err
    return built


def run_interaction_names(cfg: RunConfig) -> list[str] | None:
    """The names of the run's interactions (None: no interaction config); ConfigError naming
    the key if the file cannot be read."""
    path = cfg.actor_rollout_ref.rollout.multi_turn.interaction_config_path
    if path is None:
        return None
    try:
        return interaction_names(path)
    except ConfigFileError as err:
        raise ConfigError(f"{KEY}: {err}") from None


class ConfiguredInteractions:
    """The agent loop's interaction (``loop.Interaction``) over the configured ones: each
    trajectory talks to the one its kwargs name (``AgentState.interaction_kwargs``)."""

    def __init__(self, interactions: dict[str, Any]) -> None:
        self.interactions = interactions
        self._started: dict[str, Any] = {}
        """Request id -> the interaction started for it in this process."""

    def _pick(self, state: AgentState) -> Any:
        try:
            return self.interactions[
                pick_interaction(list(self.interactions), state.interaction_kwargs)
            ]
        except ValueError as err:
            raise InteractionError(str(err)) from None

    async def respond(self, request_id: str, state: AgentState) -> tuple[bool, str, float | None]:
        """The user's turn after the model's answer: ``(done, reply, score)``, the score as
        verl keeps it in ``turn_scores`` (None: none). InteractionError when the interaction
        raises or answers in another shape."""
        interaction = self._started.get(request_id)
        kwargs = state.interaction_kwargs
        try:
            if interaction is None:
                interaction = self._pick(state)
                await interaction.start_interaction(request_id, **kwargs)
                self._started[request_id] = interaction
            messages = [*state.prompt_messages, *state.messages]
            out = await interaction.generate_response(request_id, messages, **kwargs)
        except InteractionError:
            raise
        except Exception as err:
            raise InteractionError(f"{type(err).__name__}: {err}") from err
        if not (isinstance(out, tuple | list) and len(out) == 4 and isinstance(out[1], str)):
            raise InteractionError(
                f"generate_response returned {type(out).__name__}, not (should_terminate, "
                "response: str, score, metadata)"
            )
        score = out[2]
        if score is not None and not (isinstance(score, numbers.Real) and math.isfinite(score)):
            raise InteractionError(
                f"generate_response returned score {score!r}: a finite number or None"
            )
        return bool(out[0]), out[1], None if score is None else float(score)

    async def end(self, request_id: str) -> None:
        """The trajectory ended or left this process: finalize its instance (errors of the
        interaction's own clean-up are its own: they do not touch the trajectory)."""
        interaction = self._started.pop(request_id, None)
        if interaction is not None:
            await interaction.finalize_interaction(request_id)
