"""Steps 4-5 of loading: what each key is, and verl's names and values in asyncrl's.

4. Each key is asyncrl's own (accepted), verl's name of one (aliased), one asyncrl ignores, or
   one it refuses (``config/verl_keys.py`` says which and why); anything else is an unknown key,
   reported with the nearest valid key. asyncrl's keys and the plain aliases are assigned in
   order: the last one to set a key wins, and the one it overrode is told so.
5. verl's values of asyncrl's keys are translated (``-1``: never; ``config/verl_values.py``),
   verl's fixed behaviours checked, then the aliases that convert units computed from the
   final values they depend on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.config import verl_keys, verl_rules, verl_values
from asyncrl.config.keys import _MISSING, _nearest, close_to_ours, default_of, our_key
from asyncrl.config.read import IGNORED_SECTIONS, dropped_section
from asyncrl.config.report import Decision, Entry, LoadReport

ESTIMATOR = "algorithm.adv_estimator"
ESTIMATOR_NOTE = (
    f"{ESTIMATOR}: not set, where verl's default is gae (PPO with a critic): asyncrl runs "
    f"grpo, its only estimator (set {ESTIMATOR}=grpo to say so)"
)
"""The note of a verl config (one with verl's own keys) that leaves the estimator unset: verl
would train PPO with a critic, asyncrl trains GRPO."""


@dataclass
class Assignment:
    """The value one of asyncrl's keys gets, and the decision (the key the user wrote) behind it."""

    value: Any
    order: int
    decision: Decision
    text: str | None = None
    """Entry.text of the value assigned, where it is the value written."""


Later = tuple[int, Entry, verl_rules.VerlKey, Decision]
"""A converting alias or a fixed key, decided once every plain value is assigned."""


def _assign(
    assigned: dict[str, Assignment],
    key: str,
    value: Any,
    order: int,
    decision: Decision,
    text: str | None = None,
) -> None:
    """Assign ``key`` unless a later key set it already; the one overridden is told which."""
    old = assigned.get(key)
    if old is not None and old.decision is not decision and old.value != value:
        lost, won = (decision, old.decision) if old.order > order else (old.decision, decision)
        lost.overridden_by = won.where()
    if old is not None and old.order > order:
        return
    assigned.pop(key, None)
    assigned[key] = Assignment(value, order, decision, text)


def _classify(
    entries: list[Entry], report: LoadReport, problems: list[str]
) -> tuple[dict[str, Assignment], list[Later]]:
    """Step 4: each entry's decision; asyncrl's keys and the plain aliases assigned."""
    assigned: dict[str, Assignment] = {}
    later: list[Later] = []
    for order, e in enumerate(entries):
        d = Decision(e.key, e.value, e.source, "accepted")
        report.decisions.append(d)
        if dropped_section(e.key):
            d.kind, d.why = "ignored", IGNORED_SECTIONS[e.key.split(".", 1)[0]]
            continue
        if our_key(e.key) is not None:
            if e.value == "???":
                d.kind = "refused"
                problems.append(f"{e.key} ({e.source}): verl's ??? placeholder: set a value")
                continue
            _assign(assigned, e.key, e.value, order, d, e.text)
            continue
        rule = verl_keys.lookup(e.key)
        if (rule is None or rule.kind == "refused") and e.value == {}:
            d.kind, d.why = "ignored", "an empty section sets nothing"
        elif (
            rule is not None
            and rule.kind == "refused"
            and e.value is None
            and (e.key in verl_keys.VERL_KEYS or not close_to_ours(e.key))
        ):  # verl's null: the option unused (data.tokenizer, model.custom_chat_template, ...)
            d.kind, d.why = "ignored", f"null: not used (another value is refused: {rule.why})"
        elif rule is None:
            d.kind = "unknown"
            problems.append(f"unknown key {e.key} ({e.source}): {_nearest(e.key)}")
        elif rule.kind == "alias":
            d.kind, d.target, d.why = "aliased", rule.target, rule.why
            if rule.convert is None:
                d.result = e.value
                _assign(assigned, rule.target or "", e.value, order, d, e.text)
            else:
                later.append((order, e, rule, d))
        elif rule.kind == "ignored":
            d.kind, d.why = "ignored", rule.why
        elif rule.kind == "refused":
            d.kind, d.why = "refused", rule.why
            typo = None if e.key in verl_keys.VERL_KEYS else close_to_ours(e.key)
            if typo:  # a slip of asyncrl's own key first, verl's section after
                problems.append(
                    f"{d.where()}: no such key: did you mean {typo}? (verl's keys of this "
                    f"section are not supported by asyncrl: {rule.why})"
                )
            else:
                problems.append(f"{d.where()}: not supported by asyncrl: {rule.why}")
        else:
            later.append((order, e, rule, d))
    return assigned, later


def _our_values(
    assigned: dict[str, Assignment],
    get: Callable[[str], Any],
    report: LoadReport,
    problems: list[str],
) -> None:
    """Step 5, first: verl's values of asyncrl's keys in asyncrl's (or refused)."""
    for key, a in list(assigned.items()):
        if key not in verl_values.OUR_KEYS:
            continue
        _doc, convert = verl_values.OUR_KEYS[key]
        try:
            out = convert(a.value, get)
        except verl_rules.Refused as err:
            a.decision.kind, a.decision.why = "refused", str(err)
            problems.append(f"{a.decision.where()}: not supported by asyncrl: {err}")
            del assigned[key]
            continue
        if isinstance(out, verl_values.Converted):
            report.notes.append(f"{a.decision.where()}: {out.note}")
            if out.value is verl_values.DROP:
                del assigned[key]
            else:
                a.value = out.value
        else:
            a.value = out  # the same value, or its plain form (logger=console: [console])


def _fixed_and_converted(
    assigned: dict[str, Assignment],
    later: list[Later],
    get: Callable[[str], Any],
    problems: list[str],
) -> None:
    """Step 5, then: verl's fixed behaviours checked, the converting aliases computed."""
    for order, e, rule, d in later:
        if rule.kind == "fixed":
            assert rule.ok is not None
            if rule.ok(e.value, get):
                d.kind, d.why = "ignored", f"{rule.why} (so this value changes nothing)"
            else:
                d.kind, d.why = "refused", f"{rule.why} (accepted: {rule.ok_text})"
                problems.append(f"{d.where()}: not supported by asyncrl: {d.why}")
            continue
        assert rule.convert is not None and rule.target
        try:
            d.result = rule.convert(e.value, get)
            if d.result is verl_rules.UNSET:
                d.kind, d.why = "ignored", f"null: {rule.target} keeps its value"
                continue
            _assign(assigned, rule.target, d.result, order, d)
        except (TypeError, ValueError) as err:
            problems.append(f"{d.where()}: cannot convert to {rule.target}: {err}")


def translate(
    entries: list[Entry], report: LoadReport, problems: list[str]
) -> dict[str, Assignment]:
    """Steps 4-5: asyncrl's keys and the values they get, every decision in ``report``."""
    raw = {e.key: e for e in entries}
    assigned, later = _classify(entries, report, problems)

    def get(key: str) -> Any:
        if key in assigned:
            return assigned[key].value
        if key in raw:
            return raw[key].value
        found = default_of(key)
        return None if found is _MISSING else found

    _our_values(assigned, get, report, problems)
    _fixed_and_converted(assigned, later, get, problems)
    verl_shaped = any(d.kind in ("aliased", "ignored", "refused") for d in report.decisions)
    if verl_shaped and ESTIMATOR not in raw:
        report.notes.append(ESTIMATOR_NOTE)
    return assigned
