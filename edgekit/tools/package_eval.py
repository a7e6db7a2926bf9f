"""`edgekit eval`: metrics computed by running the package itself, plus agreement with the eager model."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from edgekit.data.dataset import package_split
from edgekit.engine.cache import built_entry
from edgekit.engine.registry import FP32_STAGES
from edgekit.errors import EdgekitError
from edgekit.runtime.package import Package, PackageError
from edgekit.runtime.predictor import Predictor
from edgekit.scoring.metrics import invalid_bio
from edgekit.scoring.score import agreement, score

log = logging.getLogger("edgekit")


def evaluate_package(package: str | Path, data: str | Path, runtime: str = "executorch", split: str = "test",
                     fmt: str | None = None, compare_eager: bool = True, allow_intents: list[str] | None = None,
                     reject: bool = True) -> dict:
    """Run every utterance of `split` through the package's runtime and score the answers.

    allow_intents fills the graph's intent_mask; reject=False turns out-of-scope rejection off. With
    compare_eager, and when the build's FP32 model is still in the stage cache, the eager model (with the same
    decoding graph) answers too and the share of identical answers (intent and all slot tags) is reported.
    """
    try:
        pkg = Package.load(package)
    except PackageError as e:
        raise EdgekitError(str(e)) from None
    examples = package_split(data, package, split, fmt)  # splits the data lacks: the build's own
    foreign = _foreign_labels(examples, pkg.labels)
    if foreign and foreign["utterances"] == len(examples):
        raise EdgekitError(f"{data}: none of the {split} split's intents is one the package knows (e.g. "
                           f"{foreign['intents'][0]!r}); is this the data the package was built from?")
    if foreign:
        log.warning("%d of %d %s utterances have intents the package does not know (%s): they count as wrong",
                    foreign["utterances"], len(examples), split, ", ".join(foreign["intents"][:5]))
    pred = Predictor.open(pkg, runtime)
    try:
        mask = pred.intent_mask(allow_intents)
    except ValueError as e:
        raise EdgekitError(f"--allow-intents: {str(e).removeprefix('allow_intents: ')}") from None
    t0 = time.perf_counter()
    answers = [pred.predict(ex.text, warn=False, allow_intents=allow_intents, reject=reject) for ex in examples]
    out = {"package": str(package), "runtime": runtime, "split": split, "seconds": round(time.perf_counter() - t0, 2),
           "allow_intents": allow_intents, "reject": reject, **score(examples, answers, pkg.labels),
           "invalid_bio": invalid_bio([a.get("tags") for a in answers]),
           "intents_answered": dict(Counter(a["intent"] for a in answers).most_common())}
    if foreign:
        out["unknown_intents"] = foreign
    built = built_entry(Path(package), FP32_STAGES) if compare_eager else None
    if built is not None:
        from edgekit.converters.decoding import config_from_record, with_decoding
        from edgekit.modeling.model import load_model
        from edgekit.modeling.training import predict_eager  # torch: only when the eager model answers too

        entry, rep = built
        model = load_model(entry / "model.safetensors")
        export = next((r for r in rep["passes"] if r["name"] == "export"), None)
        if pred.decoding and export and "decoding" in export["extra"]:
            model, _ = with_decoding(model, config_from_record(pkg.labels, export["extra"]["decoding"]))
        eager = predict_eager(model, examples, pred.tokenizer, pkg.labels, pkg.max_len, reject=reject,
                              intent_mask=None if mask is None else mask.tolist())
        out["eager"] = score(examples, eager, pkg.labels)
        out["agreement_with_eager"] = agreement(answers, eager)
    return out


def _foreign_labels(examples, labels: dict) -> dict | None:
    """The data's intents the package cannot answer (its out-of-scope answer counts as known), or None."""
    known = set(labels["intents"]) | {labels.get("oos_label") or "oos"}
    bad = [ex.intent for ex in examples if ex.intent not in known]
    return {"intents": sorted(set(bad)), "utterances": len(bad)} if bad else None
