"""What the stages share: the build's inputs and the results of the stages so far (Context)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from edgekit.data.dataset import Dataset
from edgekit.engine.cache import StageCache
from edgekit.engine.config import BuildConfig, Settings
from edgekit.engine.registry import MODEL_STAGES
from edgekit.engine.results import (
    DistillResult,
    ExportResult,
    FuseResult,
    ModelResult,
    PackageResult,
    PruneResult,
    QuantizeResult,
    StageResult,
    TeacherResult,
    TrimResult,
)
from edgekit.engine.targets import Target
from edgekit.runtime.tokenizer import SentencePieceTokenizer
from edgekit.scoring.score import labels_of


@dataclass
class Context:
    """The build's live inputs, and the results of the stages that ran (or were reused) so far."""

    cfg: BuildConfig
    settings: Settings
    target: Target
    data: Dataset
    out: Path
    max_len: int
    length_stats: dict
    base_tokenizer: SentencePieceTokenizer  # the base vocabulary as SentencePiece
    base_rows: list[int]  # base WordPiece row per teacher SentencePiece id
    stages: list[str]
    cache: StageCache
    input_digest: str  # data files + base model weights: the teacher's input key
    base_model: Path | None = None  # the base encoder's folder
    work: Path | None = None  # the running stage's cache work folder, for its files
    key: str = ""  # the running stage's cache key
    input_key: str = ""  # the running stage's input: the previous stage's output key
    teacher: TeacherResult | None = None
    # distill.teacher: that base model's teacher, prepared as a server build of it would be (`strong_ctx`), and
    # trained or reused before the first stage
    strong: TeacherResult | None = None
    strong_ctx: "Context | None" = None
    # distill.assistant: the teacher it starts from (runner.fine_tuned_teacher), made or reused when called
    fine_tuned: "Callable[[], TeacherResult] | None" = None
    unlabelled: list = field(default_factory=list)  # distill.unlabelled's utterances, read and checked by prepare
    unlabelled_dropped: int = 0  # of its lines, those equal to a dev or test utterance
    data_check: dict | None = None  # the data check's summary (edgekit.data.check.summary), run by prepare
    search: dict | None = None  # limits.max_size / max_latency: the shapes the search weighed, the one chosen
    label_issues: dict | None = None  # --label-issues: the search's summary; its rows in OUT/label_issues.jsonl
    trim_vocab: TrimResult | None = None
    prune: PruneResult | None = None
    distill: DistillResult | None = None
    quantize: QuantizeResult | None = None
    export: ExportResult | None = None
    fuse: FuseResult | None = None
    package: PackageResult | None = None

    @property
    def labels(self) -> dict:
        return labels_of(self.data)

    def latest(self, before: str | None = None) -> ModelResult:
        """The most recent model stage's result (that ran before `before`, when given)."""
        names = MODEL_STAGES[: MODEL_STAGES.index(before)] if before in MODEL_STAGES else MODEL_STAGES
        return next(getattr(self, n) for n in reversed(names) if getattr(self, n) is not None)

    @property
    def model(self):
        return self.latest().model

    @property
    def tokenizer(self) -> SentencePieceTokenizer:
        return self.latest().tokenizer

    def fp32(self) -> ModelResult:
        """The FP32 model the package is made from (ONNX Runtime quantizes its own export of it)."""
        return self.latest("quantize")

    def results(self) -> list[tuple[str, StageResult]]:
        return [(n, getattr(self, n)) for n in self.stages if getattr(self, n) is not None]
