"""Plant label errors in a copy of a JointBERT dataset, to measure how many `edgekit.data.label_issues` finds.

    python examples/plant_errors.py ../shared/data/snips /tmp/snips-planted --seed 0 [--intents 0.02 --slots 0.02]

Copies the folder (train/, dev/, test/ with seq.in, seq.out, label) to OUT, outside the repository, and changes
train only. Intents: a share of the rows gets the intent nearest to the row in the base model's embedding (the
other intent whose centroid, the mean of its rows' utterance vectors, is nearest in cosine), the mistake a tired
annotator makes. Slots: another share of rows (disjoint from the first) gets one span shifted by a word, cut
short by a word, or relabelled to another slot type the row's intent uses. planted.json lists each planted row:
{line (1-based, in train/), kind, change, old, new}. The embedding is the one label_issues computes, from the same
feature cache. examples/label_issue_eval.py measures the search on OUT.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def nearest_intents(texts: list[str], intents: list[str], base_model: str, cache: Path | None,
                    threads: int = 0) -> list[str]:
    """For each row, the other intent whose centroid is nearest (cosine) to the row's utterance vector."""
    from edgekit.data.label_issues import LabelIssuesConfig, cached_features
    from edgekit.engine.cache import default_dir
    from edgekit.modeling.pretrained import base_folder

    root = default_dir(str(cache) if cache else None)
    cfg = LabelIssuesConfig(base_model=base_model, threads=threads)
    feats, _ = cached_features(texts, base_folder(base_model, root / "models"), cfg, root / "features", True)
    X = feats.utterance / np.linalg.norm(feats.utterance, axis=1, keepdims=True)  # (N, H)
    names = sorted(set(intents))
    y = np.array([names.index(i) for i in intents])
    cent = np.stack([X[y == k].mean(0) for k in range(len(names))])  # (I, H)
    cent /= np.linalg.norm(cent, axis=1, keepdims=True)
    sim = X @ cent.T  # (N, I)
    sim[np.arange(len(y)), y] = -np.inf  # another intent
    return [names[k] for k in sim.argmax(1)]


def spans(tags: list[str]) -> list[tuple[str, int, int]]:
    from edgekit.scoring.metrics import chunks

    return sorted(chunks(tags), key=lambda c: c[1])


def write_span(tags: list[str], typ: str, a: int, b: int) -> None:
    tags[a:b] = [f"B-{typ}"] + [f"I-{typ}"] * (b - a - 1)


def shift(tags: list[str], span, rng: random.Random, types) -> list[str] | None:
    """The span moved one word left or right, onto words outside every other span."""
    typ, a, b = span
    for d in rng.sample([-1, 1], 2):
        if 0 <= a + d and b + d <= len(tags) and all(tags[w] == "O" for w in (range(a + d, a) if d < 0 else
                                                                                [b])):
            new = list(tags)
            new[a:b] = ["O"] * (b - a)
            write_span(new, typ, a + d, b + d)
            return new
    return None


def cut(tags: list[str], span, rng: random.Random, types) -> list[str] | None:
    """A span of two or more words loses its first or its last word."""
    typ, a, b = span
    if b - a < 2:
        return None
    new = list(tags)
    new[a:b] = ["O"] * (b - a)
    a2, b2 = (a + 1, b) if rng.random() < 0.5 else (a, b - 1)
    write_span(new, typ, a2, b2)
    return new


def relabel(tags: list[str], span, rng: random.Random, types) -> list[str] | None:
    """The span's type becomes another type that the row's intent uses."""
    typ, a, b = span
    others = sorted(t for t in types if t != typ)
    if not others:
        return None
    new = list(tags)
    write_span(new, rng.choice(others), a, b)
    return new


CHANGES = {"shift": shift, "cut": cut, "relabel": relabel}


def plant_slots(tags: list[list[str]], intents: list[str], rows: list[int], n: int, rng: random.Random):
    """Change one span in each of `n` rows drawn from `rows`: [(row, change, new tags)]."""
    types: dict[str, set] = {}
    for ts, intent in zip(tags, intents):
        types.setdefault(intent, set()).update(t for t, _, _ in spans(ts))
    out = []
    for i in rows:
        if len(out) == n:
            break
        found = spans(tags[i])
        if not found:
            continue
        span = rng.choice(found)
        for change in rng.sample(sorted(CHANGES), len(CHANGES)):
            new = CHANGES[change](tags[i], span, rng, types[intents[i]])
            if new is not None and new != tags[i]:
                out.append((i, change, new))
                break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", type=Path, help="a JointBERT folder (train/seq.in, seq.out, label)")
    ap.add_argument("out", type=Path, help="the planted copy: a new folder outside the repository")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--intents", type=float, default=0.02, help="share of train rows whose intent is flipped")
    ap.add_argument("--slots", type=float, default=0.02, help="share of train rows with one span changed")
    ap.add_argument("--base-model", default="minilm")
    ap.add_argument("--cache", type=Path, default=None, help="the stage cache (default: edgekit's)")
    ap.add_argument("--threads", type=int, default=0, help="the encoder's torch threads (0: torch's default)")
    args = ap.parse_args()
    out = args.out.resolve()
    if out.is_relative_to(REPO):
        raise SystemExit(f"error: {out} is inside the repository; plant errors in a copy elsewhere (/tmp/...)")
    if out.exists():
        raise SystemExit(f"error: {out} exists; give a new folder")
    shutil.copytree(args.data, out)
    train = out / "train"
    texts, intents = read_lines(train / "seq.in"), read_lines(train / "label")
    tags = [line.split() for line in read_lines(train / "seq.out")]
    rng = random.Random(args.seed)
    order = rng.sample(range(len(texts)), len(texts))
    n_int, n_slot = round(args.intents * len(texts)), round(args.slots * len(texts))
    near = nearest_intents([" ".join(t.split()) for t in texts], intents, args.base_model, args.cache, args.threads)
    planted = []
    for i in sorted(order[:n_int]):
        planted.append({"line": i + 1, "kind": "intent", "change": "flip", "old": intents[i], "new": near[i]})
        intents[i] = near[i]
    for i, change, new in plant_slots(tags, intents, order[n_int:], n_slot, rng):
        planted.append({"line": i + 1, "kind": "slots", "change": change, "old": " ".join(tags[i]),
                        "new": " ".join(new), "text": texts[i].strip()})
        tags[i] = new
    (train / "label").write_text("".join(x + "\n" for x in intents), encoding="utf-8")
    (train / "seq.out").write_text("".join(" ".join(t) + "\n" for t in tags), encoding="utf-8")
    planted.sort(key=lambda p: (p["kind"], p["line"]))
    (out / "planted.json").write_text(json.dumps({"source": str(args.data), "seed": args.seed, "rows": len(texts),
                                                  "intents": args.intents, "slots": args.slots, "planted": planted},
                                                 indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    kinds = {k: sum(p["kind"] == k for p in planted) for k in ("intent", "slots")}
    print(json.dumps({"out": str(out), "planted": kinds}))


if __name__ == "__main__":
    main()
