"""frontier.png: the size search's candidates, package bytes against dev accuracy (issue 56).

One point per candidate that was scored: dev slot F1 (circles) and dev intent accuracy (squares) against its
package bytes, its p50 beside it where it was timed (and the latency model's, under a latency budget), the chosen
one starred, the size budget drawn as a vertical line. `points` is what the figure draws, so a test can hold the
picture to report.json.
"""

from __future__ import annotations

from pathlib import Path


def label(c: dict) -> str:
    """A candidate as the plot and the build's log name it: layers, pieces, embedding rank, layer parameters."""
    rank = f"r{c['emb_rank']}" if c.get("emb_rank") else "full"
    return f"{c['layers']}L {c['vocab']:,}p {rank} {c['nonemb'] / 1e6:.2f}M"


def points(rep: dict) -> list[dict]:
    """The plotted points, from report.json's `search.candidates`: {label, mb, intent, slot, p50_ms (measured),
    p50_ms_model (the latency model's, under a latency budget), chosen, epochs (None: the fully distilled student's
    dev figures; N: a brief distillation's, search.rank_epochs)}, accuracies in percent (slot None without slots);
    candidates without dev figures are left out."""
    out = []
    for c in (rep.get("search") or {}).get("candidates", []):
        scored = ([(c["dev"], None)] if c.get("dev") else []) + \
            ([(c["brief"]["dev"], c["brief"]["epochs"])] if c.get("brief") else [])
        for dev, epochs in scored:
            dev = {**dev, **dev.get("rejecting", {})}  # out-of-scope data: intent accuracy as the gates judge it
            out.append({"label": label(c), "mb": c["size_bytes"] / 1e6, "intent": 100 * dev["intent_acc"],
                        "slot": None if dev.get("slot_f1") is None else 100 * dev["slot_f1"],
                        "p50_ms": c.get("p50_ms") if epochs is None else None,
                        "p50_ms_model": c.get("p50_ms_model"), "chosen": bool(c.get("chosen")) and epochs is None,
                        "epochs": epochs})
    return out


def frontier(rep: dict, path: Path) -> Path | None:
    """Draw the candidates (at least one scored) with the budgets; None when the build searched nothing."""
    pts = points(rep)
    if not pts:
        return None
    from edgekit.reporting.figure import figure, save

    plt, fig, ax = figure(7.2, 4.6)
    slots = any(p["slot"] is not None for p in pts)
    for brief, style in ((False, {}), (True, {"markerfacecolor": "none"})):
        sel = [p for p in pts if (p["epochs"] is not None) == brief]
        if not sel:
            continue
        how = f" after {sel[0]['epochs']} epoch(s), ranking" if brief else ""
        if slots:
            ax.plot([p["mb"] for p in sel], [p["slot"] for p in sel], "o", color="C1", label=f"dev slot F1{how}",
                    **style)
        ax.plot([p["mb"] for p in sel], [p["intent"] for p in sel], "s", color="C0",
                label=f"dev intent accuracy{how}", **style)
    for p in pts:
        y = p["slot"] if slots else p["intent"]
        if p["epochs"] is not None and any(q["label"] == p["label"] and q["epochs"] is None for q in pts):
            continue  # the fully distilled point carries the name
        note = p["label"] + (f", {p['p50_ms']:.2f} ms" if p["p50_ms"] is not None else "") + \
            (f" (model {p['p50_ms_model']:.2f})" if p["p50_ms_model"] is not None else "")
        ax.annotate(note, (p["mb"], y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        if p["chosen"]:
            ax.plot([p["mb"]], [y], "*", color="C3", markersize=14, label="chosen")
    limits = (rep.get("search") or {}).get("limits", {})
    if limits.get("max_size"):
        ax.axvline(limits["max_size"] / 1e6, color="C3", linestyle="--", alpha=0.6,
                   label=f"size budget {limits['max_size'] / 1e6:.2f} MB")
    ax.set_xlabel("package bytes (MB, the primary runtime's files)")
    ax.set_ylabel("dev score (%)")
    title = f"Size search, {rep.get('dataset', {}).get('name', '')}"
    if limits.get("max_latency"):
        title += f" (latency budget {limits['max_latency']:g} ms p50, this machine)"
    ax.set_title(title, fontsize=10)
    ax.legend(loc="best", fontsize=8)
    return save(plt, fig, path)
