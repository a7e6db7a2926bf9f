"""Each stage's typed result. A stage reads an earlier stage's result as a field of the context
(`ctx.prune.kept_layers`), never by name. Results serialize to the stage cache: JSON fields into result.json, the
model and tokenizer as files."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgekit.engine.registry import STAGES
from edgekit.runtime.tokenizer import SentencePieceTokenizer

MODEL, TOKENIZER = "model.safetensors", "tokenizer.model"
ROW_KEYS = ("intent_acc", "slot_f1", "slot_f1_argmax", "exact_match", "in_scope_acc", "oos_recall")


def stage_row(name: str, metrics: dict, params: int | None, size_bytes: int | None, seconds: float) -> dict:
    """One line of the report's stage table."""
    row = {"name": name, **{k: metrics.get(k) for k in ROW_KEYS if k in metrics}}
    row.update(params=params, size_bytes=size_bytes, seconds=round(seconds, 2))
    return row


@dataclass
class StageResult:
    """A stage's record (PassRecord as a dict) and report row. `dir`: its cache entry, where its files are."""

    record: dict
    row: dict
    key: str = field(default="", compare=False)
    # The identity of the output, when it is narrower than the stage's key: a gated stage whose budget changed
    # but that kept the same try gives the same output key, so the stages after it are reused.
    out_key: str = ""
    reused: bool = field(default=False, compare=False)
    dir: Path | None = field(default=None, compare=False)

    def to_json(self) -> dict:
        skip = {"key", "reused", "dir"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in skip and not f.name.startswith("_")}

    def save(self, work: Path) -> None:
        """Write the stage's own files into its cache work folder (models and tokenizers)."""

    @classmethod
    def load(cls, data: dict, path: Path):
        names = {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}
        return cls(**{k: v for k, v in data.items() if k in names}, dir=path)


@dataclass
class ModelResult(StageResult):
    """A stage whose output is a model (and its tokenizer), loaded from the cache only when a later stage runs."""

    _model: object = field(default=None, repr=False, compare=False)
    _tokenizer: SentencePieceTokenizer | None = field(default=None, repr=False, compare=False)
    _loader: Callable | None = field(default=None, repr=False, compare=False)  # rebuilds a model with no file

    @property
    def model(self):
        if self._model is None:
            from edgekit.modeling.model import load_model

            self._model = self._loader() if self._loader else load_model(self.dir / MODEL)
        return self._model

    @property
    def tokenizer(self) -> SentencePieceTokenizer:
        if self._tokenizer is None:
            self._tokenizer = SentencePieceTokenizer.from_file(self.dir / TOKENIZER)
        return self._tokenizer

    def save(self, work: Path) -> None:
        from edgekit.modeling.model import save_model

        save_model(self.model, work / MODEL)
        self.tokenizer.save(work / TOKENIZER)


@dataclass
class TeacherResult(ModelResult):
    dev: dict = field(default_factory=dict)  # the teacher's dev metrics: what the gates compare against
    intent_slots: dict | None = None  # intent -> slots seen with it in train, when the whitelist pays
    intent_slots_choice: dict | None = None  # measured with the teacher on dev: with and without the whitelist


@dataclass
class TrimResult(ModelResult):
    pass


@dataclass
class PruneResult(ModelResult):
    kept_layers: list[int] = field(default_factory=list)  # teacher layers the student's layers came from
    target_params: int = 0


@dataclass
class DistillResult(ModelResult):
    tries: list[dict] = field(default_factory=list)
    over_budget: dict | None = None  # the best try missed the budget: {"stage", "drops", "budget"}


@dataclass
class QuantizeResult(ModelResult):
    """INT8 for XNNPACK. The quantized module has no file format of its own: a later stage that needs it rebuilds
    it from the FP32 model with the recorded layer choices (`_loader`)."""

    fp32_layers: list[str] = field(default_factory=list)
    weight4_layers: list[str] = field(default_factory=list)

    def save(self, work: Path) -> None:
        self.tokenizer.save(work / TOKENIZER)


@dataclass
class ExportResult(StageResult):
    decoding: dict = field(default_factory=dict)  # the decoding graph's settings (policy, threshold, tables)
    files: dict = field(default_factory=dict)  # runtime -> file name in dir (with decoding); raw.* beside them


@dataclass
class FuseResult(StageResult):
    files: dict = field(default_factory=dict)  # runtime -> fused file in dir (and unfused.* beside it)
    decoding: dict = field(default_factory=dict)  # what the fused graph changed of the export's (its threshold)


@dataclass
class PackageResult(StageResult):
    latency: dict = field(default_factory=dict)
    package: dict = field(default_factory=dict)


def result_type(stage: str) -> type[StageResult]:
    """The stage's result type, as its spec names it (edgekit.engine.registry)."""
    return globals()[STAGES[stage].result]
