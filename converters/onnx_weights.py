"""ONNX Runtime's weight precision (`quantize.onnx_*`), the settings edgekit.converters.quantize_onnx applies. A
leaf: QuantizeConfig (quantize_executorch) checks them and quantize_onnx uses them, and neither imports the other
for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

LINEAR_BITS = (8, 4)
# MatMulNBits' accuracy_level: the arithmetic of its product. 1: FP32 (the input stays FP32); 4: the input quantized
# to INT8 per block at each call, integer products (XNNPACK's qd8-f32-qc4w is the same idea). onnxruntime-web 1.30's
# WASM runs level 4 as fast as level 1 and answers 3 of 700 SNIPS slot lists unlike native: FP32 there, apparently.
ACCURACY_LEVELS = (1, 4)
SCALE_TYPES = ("fp32", "fp16")


@dataclass
class OnnxWeights:
    """The precision of ONNX Runtime's weights. linear_bits 8: every weight Linear static INT8 (QDQ; 8-bit blocks
    with onnx_weight_only). 4: the Linears matching QuantizeConfig.weight4 become MatMulNBits with 4-bit symmetric
    weights, one FP32 scale per `block` input values (a power of two from 16: MatMulNBits' rule), computed at
    `accuracy_level`; with onnx_weight_only the product stays FP32 (level 1) whatever it says, that mode's reason.
    embedding_scales: the type of the 4-bit embedding tables' scales (fp16 halves them; the lookup answers FP16,
    cast to FP32)."""

    linear_bits: int = 8
    block: int = 32
    accuracy_level: int = 4
    embedding_scales: str = "fp32"

    def __post_init__(self):
        if self.linear_bits not in LINEAR_BITS:
            raise ValueError(f"linear_bits must be one of {LINEAR_BITS}, got {self.linear_bits}")
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two >= 16 (MatMulNBits), got {self.block}")
        if self.accuracy_level not in ACCURACY_LEVELS:
            raise ValueError(f"accuracy_level must be one of {ACCURACY_LEVELS}, got {self.accuracy_level}")
        if self.embedding_scales not in SCALE_TYPES:
            raise ValueError(f"embedding_scales must be one of {', '.join(SCALE_TYPES)}, got {self.embedding_scales!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
