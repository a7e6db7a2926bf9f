"""How many planted label errors the search finds: run find_label_issues on a copy made by plant_errors.py.

    python examples/label_issue_eval.py /tmp/snips-planted [--folds 5] [--out /tmp/label_issues.jsonl] [--threads 1]
    python examples/label_issue_eval.py ../shared/data/snips --top 20     # no planted.json: show the top rows

Per kind (intent, slots), with K the rows planted of that kind: recall in the top K of the ranked list (the share
of planted rows among the K most suspect), and the whole flagged list's size, precision and recall. With --top N,
the N most suspect rows of each kind that were not planted, to read by eye. One JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def line_of(row: dict) -> int:
    """The row's 1-based line in train/ (train is read in file order when the data gives dev and test)."""
    return row["line"] if row.get("line") is not None else row["index"] + 1


def measure(rows: list[dict], planted: set[int]) -> dict:
    """recall@K (K = len(planted)) of a ranked list of rows, and its whole list's size, precision and recall."""
    lines = [line_of(r) for r in rows]
    k = len(planted)
    hits = sum(x in planted for x in lines)
    top = sum(x in planted for x in lines[:k])
    return {"planted": k, "recall_at_k": round(top / k, 4) if k else None, "flagged": len(lines),
            "precision": round(hits / len(lines), 4) if lines else None, "recall": round(hits / k, 4) if k else None}


def brief(row: dict) -> dict:
    if row["kind"] == "intent":
        return {"line": line_of(row), "text": row["text"], "label": row["label"], "suggested": row["suggested"],
                "score": row["score"]}
    return {"line": line_of(row), "text": row["text"], "score": row["score"],
            "suspect": [f"{s['text']}: {s['tag']} -> {s['suggested']}" for s in row["suspect"]]}


def main() -> None:
    from edgekit.data.dataset import load_dataset
    from edgekit.data.label_issues import LabelIssuesConfig, find_label_issues, write_label_issues

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="a planted copy (with planted.json) or any dataset")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="the search's folds (not the planting's)")
    ap.add_argument("--base-model", default="minilm")
    ap.add_argument("--cache", type=Path, default=None, help="the stage cache (default: edgekit's)")
    ap.add_argument("--threads", type=int, default=0, help="the encoder's torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=None, help="write label_issues.jsonl here")
    ap.add_argument("--top", type=int, default=0, help="show the N most suspect unplanted rows of each kind")
    args = ap.parse_args()
    data = load_dataset(args.data)
    if "train" in data.split_from_train:
        sys.exit("error: train was split; lines are not train/'s")
    cfg = LabelIssuesConfig(folds=args.folds, seed=args.seed, base_model=args.base_model, threads=args.threads)
    result = find_label_issues(data, cfg, args.cache, progress=True)
    if args.out:
        write_label_issues(result, args.out)
    spec = args.data / "planted.json"
    planted = json.loads(spec.read_text())["planted"] if spec.is_file() else []
    report = {"data": str(args.data), "summary": result["summary"]}
    for kind in ("intent", "slots"):
        rows = [r for r in result["rows"] if r["kind"] == kind]
        mine = {p["line"] for p in planted if p["kind"] == kind}
        if mine:
            report[kind] = measure(rows, mine)
        if args.top:
            report[f"top_{kind}"] = [brief(r) for r in rows if line_of(r) not in mine][:args.top]
    print(json.dumps(report, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
