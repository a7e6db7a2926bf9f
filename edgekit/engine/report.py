"""report.json, assembled from the typed results so far, and written with report.md beside it after each stage."""

from __future__ import annotations

import json
from pathlib import Path

from edgekit import __version__
from edgekit.engine.context import Context
from edgekit.io import write_json, write_text
from edgekit.modeling.pretrained import DEFAULT
from edgekit.reporting.markdown import render_markdown

LABEL_ISSUES = "label_issues.jsonl"  # --label-issues' rows, beside report.json (runtime.package.REPORTS)


def _rows(ctx: Context) -> list[dict]:
    """The stage table's rows, with the shipped package's latency on the stages whose graph it is."""
    latency = ctx.package.latency if ctx.package else {}
    shipped = {rt: {k: lat[k] for k in ("p50_ms", "p99_ms")} for rt, lat in latency.items()}
    rows = []
    for name, res in ctx.results():
        row = dict(res.row, reused=res.reused, key=res.key)
        if name in ("fuse", "package") and shipped:
            row["latency"] = shipped
        elif name == "export" and shipped:  # as exported: ONNX before fusion
            row["latency"] = {rt: latency[rt].get("unfused", v) for rt, v in shipped.items()}
        rows.append(row)
    return rows


def report(ctx: Context) -> dict:
    """report.json's content, from the typed results so far."""
    from edgekit.engine.gating import with_size_hint
    from edgekit.engine.limits import held

    done = ctx.results()
    over = [dict(o, message=with_size_hint(ctx, o["message"])) for o in
            (r.record["extra"]["over_budget"] for _, r in done if r.record.get("extra", {}).get("over_budget"))]
    limits, missed = held(ctx.settings.limits, ctx.package.package, ctx.package.latency) if ctx.package else ({}, [])
    quant = ctx.quantize.record["extra"].get("quant_layers") if ctx.quantize else None
    return {"edgekit": __version__, "task": ctx.cfg.task, "target": ctx.target.name,
            "dataset": {**ctx.data.summary(), "lengths": ctx.length_stats}, "stages": _rows(ctx),
            "package": ctx.package.package if ctx.package else {},
            "latency": ctx.package.latency if ctx.package else {},
            "config": {"settings": ctx.settings.to_dict(), "seed": ctx.cfg.seed, "stages": ctx.stages,
                       "base_model": ctx.cfg.base_model or DEFAULT,
                       "intents": ctx.cfg.intents, "target": ctx.target.source, "cache": str(ctx.cache.root),
                       "strict": ctx.cfg.strict, "strict_data": ctx.cfg.strict_data,
                       "label_issues": ctx.cfg.label_issues, "train_threads": torch_threads()},
            "budget": {"intent_drop_pts": ctx.settings.budget.intent_drop_pts,
                       "slot_f1_drop_pts": ctx.settings.budget.slot_f1_drop_pts},
            "limits": limits or None, "over_budget": over + missed or None, "quant_layers": quant,
            "data_check": ctx.data_check, "label_issues": ctx.label_issues, "search": _search(ctx),
            "passes": [r.record for _, r in done]}


def _search(ctx: Context) -> dict | None:
    """report.json's `search` (edgekit.engine.search): its candidates, the chosen one with what the build measured of
    it: the distilled student's dev figures (the kept try's) and the package's p50 on the primary runtime."""
    if not ctx.search:
        return None
    out = {**ctx.search, "candidates": [dict(c) for c in ctx.search["candidates"]]}
    chosen = next(c for c in out["candidates"] if c["chosen"])
    if ctx.distill is not None and ctx.distill.tries:
        from edgekit.engine.gating import best_try

        chosen["dev"] = ctx.distill.tries[best_try(ctx.distill.tries)]["dev"]
    if ctx.package is not None:
        chosen["p50_ms"] = (ctx.package.latency.get(ctx.package.package.get("runtime")) or {}).get("p50_ms")
        chosen["package_bytes"] = ctx.package.package.get("size_bytes")
    return out


def write(out: Path, rep: dict) -> None:
    """report.json and report.md in OUT/ (each through a temp file and a rename)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "report.json", rep)
    write_text(out / "report.md", render_markdown(rep))


def plots_listed(out: Path) -> list[str]:
    """The files an earlier build's report.json in OUT/ lists: its plots, and label_issues.jsonl when it ran the
    search (edgekit's own, so a rebuild may remove them)."""
    try:
        old = json.loads((out / "report.json").read_text())
        plots = old.get("plots") or {}
        return [v for v in plots.values() if isinstance(v, str)] + [LABEL_ISSUES] * bool(old.get("label_issues"))
    except (OSError, ValueError, AttributeError):
        return []


def finish(ctx: Context, old_plots: list[str]) -> dict:
    """The final report with its plots; an earlier build's plots that were not drawn this time are removed."""
    from edgekit.reporting.plots import PLOTS, write_plots

    rep = report(ctx)
    rep["plots"] = write_plots(rep, ctx.out)
    for name in set(old_plots) & set(PLOTS.values()) - set(rep["plots"].values()):  # an old build's, not drawn now
        (ctx.out / name).unlink(missing_ok=True)
    if LABEL_ISSUES in old_plots and not rep["label_issues"]:  # an old build's search, not run now
        (ctx.out / LABEL_ISSUES).unlink(missing_ok=True)
    write(ctx.out, rep)
    return rep


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()
