"""Brief distillation of the size search's shortlist, to rank it (issue 56; `search.rank_epochs`).

The size search (search.py) picks a shape before any training by a prior: the first in lever order that keeps
`prefer_share` of the layer parameters its shape has without the budget. With `search.rank_epochs` > 0 the build
measures instead. After the teacher stage, each shortlisted candidate (`shortlist`: the prior's pick, then
the first of each other embedding rank at its vocabulary) is trimmed, pruned and distilled for that many epochs,
through the stage cache under its own keys, and scored on dev against the teacher as the gates score a try (intent
accuracy with rejection on for out-of-scope data): first how far past the budgets, then each drop in units of its
budget, summed. The lowest wins; a tie keeps the earlier (the prior's). Its [compress] settings replace the
prior's, so the build's own trim and prune stages are the winner's, reused, and only its full distillation is new.
report.json `search.ranking` gives every ranked candidate's dev figures, drops, score and seconds (and
`search.candidates[i].brief`, which frontier.png draws).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable

from edgekit.engine.context import Context
from edgekit.engine.gating import as_gated, best_try, budget, past_budget
from edgekit.engine.keys import key_of
from edgekit.errors import EdgekitError
from edgekit.reporting.frontier import label

log = logging.getLogger("edgekit")
STAGES = ("trim_vocab", "prune", "distill")  # what each ranked candidate runs, from the teacher's output


def shortlist(found: list, chosen, prefer_share: float, top: int) -> list:
    """The candidates (search.Candidate) a brief distillation ranks: the prior's pick, then for each other
    embedding rank (the full table counted as one) at the pick's vocabulary, the first in lever order that keeps
    `prefer_share` of its layer parameters, else that rank's first; at most `top`. One vocabulary: the trim keeps
    train's and dev's pieces, so dev cannot see what a smaller one costs on words it never had (SNIPS: 8,000 pieces
    ranked first on dev and lost 0.74 test slot F1; docs/experiments.md, 2026-12-07)."""
    picks = [chosen]
    for rank in dict.fromkeys(c.emb_rank for c in found):
        same = [c for c in found if c.emb_rank == rank and c.vocab == chosen.vocab]
        if len(picks) >= top or rank == chosen.emb_rank or not same:
            continue
        picks.append(next((c for c in same if c.nonemb >= prefer_share * c.unbudgeted), same[0]))
    return picks[:top]


def score(drops: dict, limits: dict) -> float:
    """Smaller is better: each dev drop against the teacher in units of its budget (at least 0.1 pt), summed, so an
    intent point on a 0.5-point budget weighs as two slot-F1 points on a 1.0-point one."""
    return sum(v / max(limits.get(k, 1.0), 0.1) for k, v in drops.items())


def winner(rows: list[dict]) -> int:
    """The ranked row to build: the least past the budgets (gating.past_budget: a candidate within them ranks above
    one past them, whatever the scores, as the gate's best try is chosen), then the lowest score, then the earliest
    (the prior's)."""
    return min(range(len(rows)), key=lambda i: (rows[i]["excess"], rows[i]["score"], i))


def brief(ctx: Context, compress: dict, teacher_key: str, run_stage: Callable) -> tuple[Context, bool]:
    """One candidate's trim, prune and brief distillation (each reused from the cache when it was made before), on
    a copy of the build's context with its [compress] settings and `search.rank_epochs` epochs. Returns the copy,
    which holds the three results, and whether all three were reused."""
    s = ctx.settings
    settings = dataclasses.replace(s, compress=type(s.compress)(**compress),
                                   distill=dataclasses.replace(s.distill, epochs=s.search.rank_epochs))
    sub, key, reused = dataclasses.replace(ctx, settings=settings), teacher_key, True
    for name in (n for n in STAGES if n in ctx.stages):  # the stages the build itself runs after the teacher
        try:
            res = run_stage(sub, name, key_of(sub, name, key), key)
        except ValueError as e:  # a setting that cannot hold for this data, as the build's own stages say it
            raise EdgekitError(f"stage {name} (search.rank_epochs, candidate {compress}): {e}") from None
        setattr(sub, name, res)
        key, reused = res.out_key or res.key, reused and res.reused
    return sub, reused


def rank(ctx: Context, teacher_key: str, run_stage: Callable, on_stage: Callable | None = None) -> None:
    """Rank `ctx.search["shortlist"]` by brief distillation (see the module's docstring) and make the winner the
    build's shape: its [compress] settings, and `chosen` in report.json's candidates. `run_stage(ctx, name, key,
    input_key)` is the runner's (reuse or run, and store)."""
    found, picks = ctx.search["candidates"], ctx.search.get("shortlist") or []
    if len(picks) < 2:
        log.warning("search.rank_epochs: one candidate on the shortlist (one embedding rank among the [search] "
                    "levers), nothing to rank")
        return
    epochs, rows, t_all = ctx.settings.search.rank_epochs, [], time.perf_counter()
    for pick in picks:
        t0, cand = time.perf_counter(), found[pick["index"]]
        sub, reused = brief(ctx, pick["compress"], teacher_key, run_stage)
        tries = sub.distill.tries
        kept = tries[best_try(tries)]
        dev = as_gated(kept["dev"])
        row = {"index": pick["index"], "dev": dev, "drops": kept["drops"],
               "score": round(score(kept["drops"], budget(ctx)), 4),
               "excess": round(past_budget(kept["drops"], budget(ctx)), 4), "reused": reused,
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        cand["brief"] = {"epochs": epochs, "dev": dev, "score": row["score"]}
        log.info("rank %s: %d epoch(s), dev drops %s, score %.3f", label(cand), epochs, kept["drops"], row["score"])
        if on_stage:
            on_stage(f"rank {label(cand)}, dev after {epochs} epoch(s)",
                     {**{k: dev.get(k) for k in ("intent_acc", "slot_f1", "in_scope_acc", "oos_recall")},
                      "params": cand["nonemb"], "size_bytes": cand["size_bytes"], "reused": reused,
                      "key": sub.distill.key[:12], "seconds": row["seconds"]})
        for name in (n for n in STAGES if n in ctx.stages):  # the build reloads the winner's from the cache
            getattr(sub, name)._model = None
    win = winner(rows)
    for i, c in enumerate(found):
        c["chosen"] = i == picks[win]["index"]
    ctx.settings.compress = type(ctx.settings.compress)(**picks[win]["compress"])
    if win:
        ctx.search["kept_profile_shape"] = False
    ctx.search["ranking"] = {"epochs": epochs, "candidates": rows, "winner": picks[win]["index"],
                             "prior": picks[0]["index"], "seconds": round(time.perf_counter() - t_all, 1)}
    log.info("rank: %s wins (the prior's pick: %s), %.0f s", label(found[picks[win]["index"]]),
             label(found[picks[0]["index"]]), ctx.search["ranking"]["seconds"])
