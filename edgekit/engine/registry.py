"""Every stage's facts, in one table: a leaf that imports nothing of edgekit's, so that the settings, the cache
keys, the report and the plots read stages from here without loading a stage (or torch).

A stage is the module `edgekit.engine.stages.<name>` with `run(ctx) -> StageResult`, and optionally
`attach(ctx, result)`, called on every result, made or reused (a lazy loader, or publishing files). Its spec says
which settings it reads (they, with its input's key, make its cache key), which build facts join its key, the
type of its result (in edgekit.engine.results), and whether its output is a model. The table's order is the
order stages run in. To add a stage: a row here, a module in stages/, a result type.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class AllBut:
    """Every setting of a table except these."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class StageSpec:
    name: str
    # table -> "*" (all of it), the setting names it reads, or AllBut(names)
    reads: dict
    result: str  # its result type's name in edgekit.engine.results
    makes_model: bool = False  # its output is a model (and tokenizer) a later stage may start from
    int8: bool = False  # that model is quantized (not the FP32 model a package is exported from)
    # Build facts in its key besides the common ones (edgekit.engine.keys.FACTS): "vocab_corpus" (the file's
    # content), "toolchain" (library versions, edgekit's graph form), "runtimes" (the target's runtimes and
    # buckets), "bench" (threads and profile name: the manifest names the profile and latency is measured on its
    # threads), "strong_teacher" (distill.teacher's key), "assistant" (distill.assistant's settings and teacher,
    # when on), "unlabelled" (the file's content), "schema" (the package schema version: what the exported graph
    # answers)
    facts: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return f"edgekit.engine.stages.{self.name}"


# ONNX Runtime quantizes its own export, in the export stage: the [quantize] settings only it reads are not in the
# quantize stage's key.
ONNX_ONLY = ("method", "percentile", "onnx_weight_only", "onnx_linear_bits", "onnx_block", "onnx_accuracy_level",
             "onnx_embedding_scales")
_EXPORT_FACTS = ("toolchain", "runtimes", "schema")
SPECS: tuple[StageSpec, ...] = (
    StageSpec("teacher", {"teacher": "*"}, "TeacherResult", makes_model=True, facts=("assistant",)),
    StageSpec("trim_vocab", {"compress": ("vocab_budget", "vocab_corpus", "base_words", "embedding_rank",
                                          "max_retries"), "budget": "*"}, "TrimResult", makes_model=True,
              facts=("vocab_corpus", "gate")),
    StageSpec("prune", {"compress": ("param_share", "total_share", "prune_layers", "prune_samples")}, "PruneResult",
              makes_model=True),
    StageSpec("distill", {"compress": ("param_share", "total_share", "max_param_share", "max_total_share",
                                       "prune_layers", "prune_samples", "max_retries"),
                          "distill": AllBut(("teacher", "assistant", "assistant_epochs", "assistant_lr", "unlabelled",
                                             "unlabelled_max")), "budget": "*"}, "DistillResult", makes_model=True,
              # distill.teacher enters as that teacher's own key, unlabelled as its file's content, the assistant
              # through the teacher stage's key (the input)
              facts=("strong_teacher", "unlabelled", "gate")),
    StageSpec("quantize", {"quantize": AllBut(ONNX_ONLY)}, "QuantizeResult", makes_model=True, int8=True,
              facts=("toolchain",)),
    # export and package score and describe the graph as the package's sessions run it: [fuse] says which
    # optimizers those leave out
    StageSpec("export", {"decoding": "*", "quantize": "*", "server": ("batch", "seq"), "fuse": "*"}, "ExportResult",
              facts=_EXPORT_FACTS),
    StageSpec("fuse", {"server": "*", "fuse": "*"}, "FuseResult", facts=_EXPORT_FACTS),
    StageSpec("package", {"package": ("bench_utterances",), "serve": "*", "cascade": ("timeout_s",), "fuse": "*"},
              "PackageResult", facts=_EXPORT_FACTS + ("bench",)),
)
STAGES = {s.name: s for s in SPECS}
ORDER = tuple(STAGES)  # all stages, in the order they run
MODEL_STAGES = tuple(s.name for s in SPECS if s.makes_model)
FP32_STAGES = tuple(s.name for s in SPECS if s.makes_model and not s.int8)  # the last is the package's FP32 model
EXPORT_STAGES = tuple(s.name for s in SPECS if "runtimes" in s.facts)  # their output depends on the runtimes


def load(name: str) -> ModuleType:
    """The stage's module (imported on first use: stages bring torch and the exporters)."""
    return importlib.import_module(STAGES[name].module)
