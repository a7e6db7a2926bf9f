"""The intents' confusion as a picture (confusion.png), each row normalised by its gold count.

A few intents (up to FULL_GRID): the whole grid, every label readable. Many (CLINC150: 150 and out-of-scope), where
a full grid is a grey square nobody can read: the sub-grid of the intents in the most confused pairs, with an
"other intents" column so that each row still sums to 1, beside a ranked bar chart of those pairs. The out-of-scope
answer always has its row and column, so its diagonal cell is the out-of-scope recall.
"""

from __future__ import annotations

from pathlib import Path

FULL_GRID = 25  # labels up to which the whole grid is drawn
TOP_INTENTS = 20  # the many-intent view's sub-grid: the intents of the most confused pairs, at most this many
TOP_PAIRS = 15  # pairs in its bar chart
OTHER = "(other intents)"


def confused_pairs(conf: dict) -> list[dict]:
    """Every off-diagonal cell {gold, answered, n, rate} (rate: n over the gold intent's count), most confused
    first: by rate, then count, then names. By rate, not count: CLINC150's 1,000 out-of-scope test utterances
    would otherwise fill the ranking with pairs of under 1% (the out-of-scope row is always drawn anyway)."""
    pairs = []
    for g, row in conf["counts"].items():
        total = sum(row.values())
        pairs += [{"gold": g, "answered": p, "n": n, "rate": n / total} for p, n in row.items() if p != g]
    return sorted(pairs, key=lambda x: (-x["rate"], -x["n"], x["gold"], x["answered"]))


def _pick(conf: dict, pairs: list[dict], oos: str | None, top: int) -> list[str]:
    """The many-intent view's intents: those of the top pairs in order of appearance (at most `top`), then the
    out-of-scope answer whenever the split or the answers have it."""
    picked: list[str] = []
    for pr in pairs:
        new = [x for x in (pr["gold"], pr["answered"]) if x not in picked and x != oos]
        if len(picked) + len(new) > top:
            break
        picked += new
    if oos in conf["labels"]:
        picked.append(oos)
    return picked or conf["labels"][:top]


def confusion_view(conf: dict, oos: str | None = None, full_grid: int = FULL_GRID, top: int = TOP_INTENTS) -> dict:
    """What the picture shows: {"full", "rows", "cols", "rates" (row-normalised; None for a label never in gold),
    "support", "pairs"}. `conf`: edgekit.scoring.labels.confusion_counts."""
    labels, counts = conf["labels"], conf["counts"]
    full = len(labels) <= full_grid
    pairs = confused_pairs(conf)
    rows = labels if full else _pick(conf, pairs, oos, top)
    cols = list(rows) if full else list(rows) + [OTHER]
    support = {x: sum(counts.get(x, {}).values()) for x in rows}
    rates = []
    for g in rows:
        row, total = counts.get(g, {}), support[g]
        cells = [row.get(p, 0) for p in rows]
        if not full:
            cells.append(total - sum(cells))  # the rest of the row: answers outside the sub-grid
        rates.append([c / total if total else None for c in cells])
    return {"full": full, "rows": rows, "cols": cols, "rates": rates, "support": support, "pairs": pairs}


def _cell(v: float) -> str:
    """A rate as the whole percent, never rounded to 0 or to 100 when it is neither."""
    return "<1" if v < 0.005 else ">99" if 0.995 <= v < 1 else f"{100 * v:.0f}"


def _heatmap(ax, view: dict, fontsize: float):
    """The row-normalised grid, each cell's percentage written in it (blank for 0); returns the image."""
    import matplotlib
    import numpy as np

    m = np.ma.masked_invalid(np.array([[np.nan if v is None else v for v in r] for r in view["rates"]], float))
    # grey: a label never in gold (an answer only), with no row to normalise
    cmap = matplotlib.colormaps["Blues"].with_extremes(bad="#dddddd")
    im = ax.imshow(m, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for i, r in enumerate(view["rates"]):
        for j, v in enumerate(r):
            if v:  # 0 and None stay blank: the cells that say something stand out
                ax.text(j, i, _cell(v), ha="center", va="center", fontsize=fontsize,
                        color="white" if v > 0.6 else "black")
    ax.set_xticks(range(len(view["cols"])), view["cols"], rotation=60, ha="right", fontsize=fontsize + 1)
    ax.set_yticks(range(len(view["rows"])), [f"{x} ({view['support'][x]})" for x in view["rows"]],
                  fontsize=fontsize + 1)
    ax.set_xlabel("answered")
    ax.set_ylabel("gold (utterances)")
    return im


def _pair_bars(ax, pairs: list[dict]) -> None:
    shown = pairs[:TOP_PAIRS][::-1]  # barh draws bottom up: the most confused on top
    ax.barh(range(len(shown)), [100 * p["rate"] for p in shown], color="C3", alpha=0.7)
    ax.set_yticks(range(len(shown)), [f"{p['gold']} → {p['answered']}" for p in shown], fontsize=8)
    for k, p in enumerate(shown):
        ax.text(100 * p["rate"], k, f" {p['n']} of {round(p['n'] / p['rate'])}", va="center", fontsize=8)
    ax.set_xlabel("share of the gold intent's utterances answered as the other (%)")
    ax.set_title(f"The {len(shown)} most confused pairs (gold → answered)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)


def confusion_plot(conf: dict, path: Path, title: str, oos: str | None = None) -> Path:
    """Draw `conf` (confusion_counts) into `path` (PNG, temp then rename); see the module's docstring."""
    import matplotlib

    matplotlib.use("Agg")  # no display: builds run headless
    import matplotlib.pyplot as plt

    from edgekit.reporting.figure import save

    view = confusion_view(conf, oos)
    n = len(view["rows"])
    if view["full"]:
        side = max(5.0, 0.42 * n + 3.0)
        fig, ax = plt.subplots(figsize=(side + 1.2, side), dpi=110)
        im = _heatmap(ax, view, 8 if n <= 15 else 6.5)
        ax.set_title(f"{title}\nrow-normalised (% of each gold intent)", fontsize=10)
    else:
        fig, (ax, bars) = plt.subplots(1, 2, figsize=(17, 9.5), dpi=110, gridspec_kw={"width_ratios": [1.35, 1]})
        im = _heatmap(ax, view, 6.5)
        ax.set_title(f"{title}\n{len(view['rows'])} of {len(conf['labels'])} labels: those of the most confused "
                     "pairs; row-normalised over every answer", fontsize=10)
        _pair_bars(bars, view["pairs"])
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    return save(plt, fig, path)
