"""PassRecord: what every pass and exporter reports. The build report is made from these."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# What an exported artifact is checked against (an exporter's record.extra["against"]), as people read it: the
# quantize stage's model (ExecuTorch lowers that quantization), or the FP32 model (unquantized graphs, and ONNX
# Runtime's own quantization of its export).
AGAINST = {"int8": "INT8 (quantize stage)", "fp32": "FP32"}


@dataclass
class PassRecord:
    name: str
    params_before: int | None = None
    params_after: int | None = None
    bytes_before: int | None = None
    bytes_after: int | None = None
    seconds: float = 0.0
    metrics: dict = field(default_factory=dict)  # test-split metrics of the stage's output
    warnings: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # pass-specific figures (parity, training curve, ...)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PassRecord":
        return cls(**d)


@dataclass
class PassResult:
    """What a pass returns: the new model, its record, and the tokenizer when the pass changes it."""

    model: Any
    record: PassRecord
    tokenizer: Any = None
