"""`edgekit eval`: metrics computed by running the package itself, plus agreement with the eager model; with
--out, the evaluation's files (eval.json, errors.jsonl, confusion.png, labels.md) in a folder of their own."""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path

from edgekit.data.dataset import package_split
from edgekit.engine.cache import built_entry
from edgekit.engine.registry import FP32_STAGES
from edgekit.errors import EdgekitError
from edgekit.io import write_json, write_text
from edgekit.runtime.package import MANIFEST, Package, PackageError
from edgekit.runtime.predictor import Predictor
from edgekit.scoring.labels import error_records
from edgekit.scoring.metrics import invalid_bio
from edgekit.scoring.score import agreement, by_label, has_slots, score

log = logging.getLogger("edgekit")


def evaluate_package(package: str | Path, data: str | Path, runtime: str = "executorch", split: str = "test",
                     fmt: str | None = None, compare_eager: bool = True, allow_intents: list[str] | None = None,
                     reject: bool = True, out_dir: str | Path | None = None) -> dict:
    """Run every utterance of `split` through the package's runtime and score the answers, overall and by label
    (`by_label`: edgekit.scoring.score.by_label).

    allow_intents fills the graph's intent_mask; reject=False turns out-of-scope rejection off. With
    compare_eager, and when the build's FP32 model is still in the stage cache, the eager model (with the same
    decoding graph) answers too and the share of identical answers (intent and all slot tags) is reported.
    With out_dir, the files of `write_outputs` are written there too (a package folder is refused first).
    """
    if out_dir is not None:
        check_out_dir(Path(out_dir), Path(package))
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
    out["by_label"] = by_label(examples, answers, pkg.labels)
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
    if out_dir is not None:
        try:
            out["written"] = write_outputs(Path(out_dir), out, examples, answers, has_slots(examples, pkg.labels))
        except OSError as e:  # no permission, a full disk
            raise EdgekitError(f"--out {out_dir}: cannot write ({e.strerror or e})") from None
    return out


def _is_package(folder: Path) -> bool:
    """`folder` holds an edgekit package's manifest (a web app's or an extension's manifest.json is no package)."""
    try:
        with open(folder / MANIFEST, "rb") as f:
            head = json.loads(f.read(1 << 20))
    except (OSError, ValueError):  # none, unreadable, not JSON, or larger than any manifest edgekit writes
        return False
    return isinstance(head, dict) and str(head.get("created_by", "")).startswith("edgekit")


def check_out_dir(out: Path, package: Path) -> None:
    """Refuse an --out inside a package (the package folder, or any folder at or above --out holding an edgekit
    manifest.json): `edgekit verify` refuses every file its manifest does not list. Or one that is a file."""
    try:
        if out.exists() and not out.is_dir():
            raise EdgekitError(f"--out {out}: a file, not a folder")
        pkg, here = package.resolve(), out.resolve()
        inside = next((f for f in (here, *here.parents) if f == pkg or _is_package(f)), None)
    except (OSError, ValueError) as e:  # a name the system refuses (a NUL byte, too long)
        raise EdgekitError(f"--out {out!r}: not a usable folder name ({e})") from None
    if inside is not None:
        raise EdgekitError(f"--out {out}: inside the package folder {inside} (it holds {MANIFEST}, and `edgekit "
                           "verify` refuses files the manifest does not list); write the evaluation elsewhere")


def write_outputs(out: Path, res: dict, examples, answers: list[dict], slots: bool) -> dict:
    """eval.json (`res`, as printed without --out), errors.jsonl (every answer not an exact match, confident
    mistakes first), confusion.png (the intents' confusion, row-normalised) and labels.md (every label's scores);
    returns {what: path} and the error count."""
    from edgekit.reporting.confusion import confusion_plot
    from edgekit.reporting.labels import labels_markdown

    out.mkdir(parents=True, exist_ok=True)
    errors = error_records(examples, answers, slots)
    paths = {k: out / name for k, name in (("eval", "eval.json"), ("errors", "errors.jsonl"),
                                           ("confusion", "confusion.png"), ("labels", "labels.md"))}
    written = {k: str(v) for k, v in paths.items()} | {"errors_count": len(errors)}
    write_json(paths["eval"], res | {"written": written})
    write_text(paths["errors"], "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in errors))
    by = res["by_label"]
    confusion_plot(by["confusion"], paths["confusion"], f"Intent confusion, {Path(res['package']).name} "
                   f"{res['split']} ({res['runtime']})", by["oos"])
    write_text(paths["labels"], labels_markdown(res))
    return written


def _foreign_labels(examples, labels: dict) -> dict | None:
    """The data's intents the package cannot answer (its out-of-scope answer counts as known), or None."""
    known = set(labels["intents"]) | {labels.get("oos_label") or "oos"}
    bad = [ex.intent for ex in examples if ex.intent not in known]
    return {"intents": sorted(set(bad)), "utterances": len(bad)} if bad else None
