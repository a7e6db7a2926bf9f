"""`edgekit data check`: what is wrong or risky in a dataset, before a build (edgekit.data.check finds it).

No torch on this path: the base model's piece counts come from its vocab.txt, read as runner.prepare reads it
(a SentencePiece tokenizer made from it), and its config.json (the positions a piece can take)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from edgekit.cli.options import CacheDir, Format, command
from edgekit.errors import EdgekitError

log = logging.getLogger("edgekit")
SHOWN = 5  # findings printed per kind; --json and --out list them all


class _Counted:
    """A tokenizer's piece counts, each text counted once: choose_max_len and the check both ask."""

    def __init__(self, tokenizer):
        self.tokenizer, self.seen = tokenizer, {}

    def length(self, text: str) -> int:
        if text not in self.seen:
            self.seen[text] = self.tokenizer.length(text)
        return self.seen[text]


def _lengths(data, base_model: str | None, cache: Path | None):
    """The build's sequence length for `data` and the base model's piece counts (runner.prepare's choice: p99 of
    train and dev, rounded up to 8, at most the model's positions); None, with a note, when the base model
    cannot be read."""
    from edgekit.data.check import Lengths, choose_max_len
    from edgekit.engine.cache import default_dir
    from edgekit.modeling.base_models import base_folder  # no torch, as this command promises
    from edgekit.text.vocab import from_wordpiece

    root = default_dir(str(cache) if cache else None)
    try:
        folder = base_folder(base_model, root / "models")
        vocab = (folder / "vocab.txt").read_text(encoding="utf-8").split("\n")
        hf = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        tokenizer, _ = from_wordpiece(vocab[:-1] if vocab[-1] == "" else vocab, cache_dir=root / "normalizer")
        # MPNet's position table starts after its padding id (edgekit.modeling.mpnet.position_rows)
        cap = hf["max_position_embeddings"] - (hf.get("pad_token_id", 1) + 1 if hf.get("model_type") == "mpnet" else 0)
    except (EdgekitError, OSError, ValueError, KeyError, TypeError, RuntimeError) as e:  # RuntimeError: SentencePiece
        return None, f"utterances not checked for truncation: the base model could not be read ({e})"
    counted = _Counted(tokenizer)
    texts = [ex.text for s in ("train", "dev") for ex in data.splits[s]]
    max_len, stats = choose_max_len(counted, texts, cap)
    return Lengths(max_len, counted.length), (f"max_len {max_len}: p99 of train and dev in {base_model or 'minilm'} "
                                     f"pieces ({stats['p99']:.0f}), rounded up to 8, as a build chooses it")


def _print(data, findings, notes: list[str]) -> None:
    from edgekit.data.check import KINDS

    sizes = ", ".join(f"{s} {len(v):,}" for s, v in data.splits.items())
    typer.echo(f"{data.source} ({data.format}): {sizes}; {len(data.intents)} intents, "
               f"{(len(data.slot_tags) - 1) // 2 if data.slot_tags else 0} slot types")
    for note in notes:
        typer.echo(note)
    if not findings:
        typer.echo("no findings")
        return
    by = {k: [f for f in findings if f.kind == k] for k in KINDS}
    typer.echo(f"\n{len(findings):,} finding{'s' * (len(findings) != 1)} (warnings):")
    for kind, fs in by.items():
        if fs:
            typer.echo(f"  {kind:16s} {len(fs):6,}  {KINDS[kind].description}")
    for kind, fs in by.items():
        if fs:
            typer.echo(f"\n{kind} ({len(fs):,}; count: {KINDS[kind].counts}):")
        for f in fs[:SHOWN]:
            typer.echo(f"  {f.where}: {f.message}")
        if len(fs) > SHOWN:
            typer.echo(f"  ... and {len(fs) - SHOWN:,} more (--json or --out DIR lists them all)")


def _label_issues(data, out: Path, cache: Path | None, full: dict, base_model: str | None) -> None:
    from edgekit.data.label_issues import LabelIssuesConfig, find_label_issues, write_label_issues
    from edgekit.io import write_json
    from edgekit.reporting.data_check import label_issues_text

    root = Path(cache).expanduser().resolve() if cache else None  # None: the build's cache folder
    result = find_label_issues(data, LabelIssuesConfig(base_model=base_model or "minilm"), cache_dir=root,
                               progress=True)
    write_label_issues(result, out / "label_issues.jsonl")
    write_json(out / "data_check.json", {**full, "label_issues": result["summary"]})  # with the search's cost
    # stderr: with --json, stdout stays one JSON document
    typer.echo(f"\nlabel issues (train split): {label_issues_text(result['summary'])}; {out / 'label_issues.jsonl'}",
               err=True)


@command("check", group="data")
def data_check(
    path: Annotated[Path, typer.Argument(help="Dataset: JointBERT folder, CLINC150 JSON, CSV, JSONL or a folder of "
                                         "split files (docs/data-formats.md).")],
    format: Format = None,
    strict: Annotated[bool, typer.Option(help="Exit 2 when anything is found (default: warnings, exit 0).")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print every finding as JSON instead of the summary.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Write every finding to DIR/data_check.json (and "
                                                "DIR/label_issues.jsonl with --label-issues).")] = None,
    label_issues: Annotated[bool, typer.Option(help="Also search for mislabelled utterances (a cross-validated "
                                               "model's disagreement); needs --out.")] = False,
    base_model: Annotated[Optional[str], typer.Option(help="Base model whose tokenizer counts the pieces and whose "
                                                      "features judge the labels (default: minilm); as `edgekit "
                                                      "build --base-model`.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the dev and test splits drawn where the data has none, as "
                                      "`edgekit build --seed` draws them.")] = 0,
    cache: CacheDir = None,
):
    """Check a dataset: duplicates, leakage, label conflicts, rare labels, invalid BIO, truncation.

    Every finding names the file and line. Exit 0 with warnings; with --strict, exit 2 when anything is found.
    Bad data (a missing file, a malformed line) is one error line and exit 2, as in a build."""
    from edgekit.data.check import check_dataset, summary
    from edgekit.data.dataset import load_dataset
    from edgekit.io import write_json

    if label_issues and out is None:
        raise EdgekitError("--label-issues writes label_issues.jsonl: give --out DIR")
    data = load_dataset(path, format, seed)  # splits the data lacks are drawn as a build with this --seed draws them
    lengths, note = _lengths(data, base_model, cache)
    findings = check_dataset(data, lengths=lengths)
    full = {"data": data.summary(), "max_len": lengths.max_len if lengths else None, "note": note,
            **summary(findings, shown=len(findings))}
    if out is not None:
        write_json(out / "data_check.json", full)
    if json_:
        typer.echo(json.dumps(full, indent=2, ensure_ascii=False))
    else:
        _print(data, findings, [note] + ([f"wrote {out / 'data_check.json'}"] if out is not None else []))
    if label_issues:
        _label_issues(data, out, cache, full, base_model)
    if strict and findings:
        f = findings[0]
        raise EdgekitError(f"--strict: {len(findings):,} finding{'s' * (len(findings) != 1)} in {path}; first: "
                           f"{f.where}: {f.kind}: {f.message}")
