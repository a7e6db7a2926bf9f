"""`edgekit eval`: metrics computed by running the package itself, plus agreement with the eager model."""

from __future__ import annotations

import json
import time
from pathlib import Path

from edgekit.data import load_dataset
from edgekit.errors import EdgekitError
from edgekit.runtime.package import Package, PackageError
from edgekit.runtime.predictor import Predictor
from edgekit.training import agreement, predict_eager, score


def evaluate_package(package: str | Path, data: str | Path, runtime: str = "executorch", split: str = "test",
                     fmt: str | None = None, compare_eager: bool = True) -> dict:
    """Run every utterance of `split` through the package's runtime and score the answers.

    With compare_eager, and when the build's checkpoint sits in the package folder, the eager model's
    answers are computed too and the share of identical answers (intent and all slot tags) is reported.
    """
    try:
        pkg = Package.load(package)
    except PackageError as e:
        raise EdgekitError(str(e)) from None
    ds = load_dataset(data, fmt)
    examples = ds.splits[split]
    pred = Predictor.open(pkg, runtime)
    t0 = time.perf_counter()
    answers = [pred.predict(ex.text, warn=False) for ex in examples]
    out = {"package": str(package), "runtime": runtime, "split": split, "seconds": round(time.perf_counter() - t0, 2),
           **score(examples, answers, pkg.labels)}
    state = Path(package) / "checkpoints" / "state.json"
    if compare_eager and state.is_file():
        from edgekit.model import load_model

        model = load_model(state.parent / json.loads(state.read_text())["model"])
        eager = predict_eager(model, examples, pred.tokenizer, pkg.labels, pkg.max_len)
        out["eager"] = score(examples, eager, pkg.labels)
        out["agreement_with_eager"] = agreement(answers, eager)
    return out
