"""Accuracy gates and back-off, shared by `trim_vocab` and `distill`.

A gate compares a stage's dev metrics with the teacher's against the profile's [budget]. On a miss the next try
is sized from the miss (how far past the budget the worst drop is), within the profile's caps. When no try
meets the budget the build keeps the best one: it ships marked over budget (exit code 3), or with --strict
fails with no package.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from edgekit.engine.context import Context
from edgekit.engine.decoding_policy import with_rejection
from edgekit.errors import EdgekitError

log = logging.getLogger("edgekit")
OVER_BUDGET_EXIT = 3


class BudgetMissed(EdgekitError):
    """No try met the accuracy budget and --strict was given."""

    exit_code = OVER_BUDGET_EXIT


def budget(ctx: Context) -> dict:
    b = ctx.settings.budget
    return {"intent_drop_pts": b.intent_drop_pts, "slot_f1_drop_pts": b.slot_f1_drop_pts}


def as_gated(dev: dict) -> dict:
    """Dev figures as the gate scores them: with out-of-scope data, intent accuracy with rejection on."""
    flat = {**dev, **dev.get("rejecting", {})}
    return {k: v for k, v in flat.items() if k not in ("rejecting", "oos_max_drop_pts")}


def gate(ctx: Context, dev: dict) -> tuple[bool, dict]:
    """Dev drops against the teacher (points on a 0-100 scale), and whether all are within the budget. With
    out-of-scope utterances in dev, intent accuracy is the package's, rejection on (`rejecting`: see
    decoding_policy.with_rejection)."""
    teacher = ctx.teacher.dev
    if "rejecting" in dev:  # the teacher's too, measured once (a teacher cached before they existed lacks them)
        with_rejection(ctx, teacher, ctx.teacher.model, ctx.teacher.tokenizer)
        teacher, dev = as_gated(teacher), as_gated(dev)
    drops = {"intent_drop_pts": 100 * (teacher["intent_acc"] - dev["intent_acc"])}
    if dev.get("slot_f1") is not None:
        drops["slot_f1_drop_pts"] = 100 * (teacher["slot_f1"] - dev["slot_f1"])
    b = budget(ctx)
    ok = all(v <= b.get(k, math.inf) + 1e-9 for k, v in drops.items())
    return ok, {k: round(v, 3) for k, v in drops.items()}


def tried(ctx: Context, setting: str, dev: dict, drops: dict, ok: bool, **extra) -> dict:
    """One try, as the report lists it."""
    return {"setting": setting, "dev": dev, "drops": drops, "budget": budget(ctx), "passed": ok, **extra}


def growth(ctx: Context, drops: dict, lo: float = 1.1, hi: float = 2.0) -> float:
    """How much larger the next try should be, from the miss: 1 + half the worst drop's excess over its budget,
    relative to the budget (a 1.0-pt drop on a 0.5-pt budget: x1.5), clipped to [lo, hi]."""
    b = budget(ctx)
    excess = max((v - b[k]) / max(b[k], 0.1) for k, v in drops.items())
    return min(hi, max(lo, 1 + excess / 2))


def past_budget(drops: dict, limits: dict) -> float:
    """How far past their budgets the drops are, summed (0: within every budget)."""
    return sum(max(0.0, v - limits.get(k, math.inf)) for k, v in drops.items())


def score_of(t: dict) -> tuple[float, float]:
    """Smaller is better: the sum of the drops past their budgets, then the sum of the drops."""
    return past_budget(t["drops"], t["budget"]), sum(t["drops"].values())


def best_try(tries: list[dict]) -> int:
    """The last try that passed, else the one that missed the budget by least."""
    passed = [i for i, t in enumerate(tries) if t["passed"]]
    return passed[-1] if passed else min(range(len(tries)), key=lambda i: score_of(tries[i]))


def settle(ctx: Context, stage: str, tries: list[dict]) -> dict | None:
    """After the last try: None when the best try passed; else the over-budget note (the build ships the best try
    marked over budget, or under --strict stops once the report shows the tries)."""
    best = tries[best_try(tries)]
    if best["passed"]:
        return None
    b = ", ".join(f"{k} <= {v}" for k, v in budget(ctx).items())
    figs = ", ".join(f"{k} {v}" for k, v in best["drops"].items())
    msg = (f"stage {stage}: dev accuracy budget ({b}) not met in {len(tries)} tries; best reached {figs} "
           f"({best['setting']})")
    return {"stage": stage, "message": msg, "drops": best["drops"], "budget": budget(ctx)}


def pinned_by_size(ctx: Context) -> str:
    """Why a build under a size budget made one try: the search fixed the student's shape to fit, so nothing grew.
    Added to an accuracy miss where the build reports it (report.json, --strict), not in the stage's cached record."""
    size = ((ctx.search or {}).get("limits") or {}).get("max_size")
    return "" if size is None else (f"; the {size:,}-byte size budget (limits.max_size) fixed the student's shape, "
                                    "so it did not back off (--max-size none lets it grow)")


def with_size_hint(ctx: Context, message: str) -> str:
    """An accuracy miss as the build reports it: with pinned_by_size's hint, once (an older cached stage record may
    hold it already)."""
    hint = pinned_by_size(ctx)
    return message if hint in message else message + hint


@dataclass
class Try:
    """One try of a gated stage: its dev metrics, how the report names it, what the stage keeps if it is the best,
    and `grow(factor) -> bool`, which sizes the next try (False: no larger try exists)."""

    dev: dict
    setting: str
    kept: Any
    grow: Callable[[float], bool]
    extra: dict = field(default_factory=dict)  # more fields for the report's row of this try
    note: str = ""  # for the log line


def back_off(ctx: Context, stage: str, max_retries: int, attempt: Callable[[int], Try]) -> tuple[Any, list, dict | None]:
    """Gate each try on dev; on a miss grow the next from the miss, up to `max_retries` times. Returns the best
    try's `kept`, every try as the report lists it, and the over-budget note (None when the best try passed)."""
    tries, kept = [], None
    for i in range(max_retries + 1):
        t = attempt(i)
        ok, drops = gate(ctx, t.dev)
        tries.append(tried(ctx, t.setting, t.dev, drops, ok, **t.extra))
        if best_try(tries) == len(tries) - 1:
            kept = t.kept
        log.info("%s try %d: %sdev drops %s -> %s", stage, i + 1, t.note, drops, "pass" if ok else "back off")
        if ok or i == max_retries or not t.grow(growth(ctx, drops)):
            break
    return kept, tries, settle(ctx, stage, tries)
