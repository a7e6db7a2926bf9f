"""MPNet, as far as it differs from the BERT encoder in `edgekit.modeling.model`.

MPNet-base (all-mpnet-base-v2) is BERT's post-LayerNorm block with three differences:
- a relative-position bias: the key-query distance falls into one of 32 log-spaced buckets, and one (buckets, heads)
  table, shared by every layer, adds a learned value per head to the attention scores (`RelativeBias`);
- absolute positions start after the padding id (fairseq's convention): the first token reads row `pad_id + 1` of the
  position table. A package pads on the right and never attends to padding, so a real token at position i always
  reads row `pad_id + 1 + i`; the loader drops the rows below (`position_rows`), and the encoder then reads row i as
  BERT does;
- no token types (`ModelConfig.token_types = False`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Hugging Face MPNet parameter names -> ours, after stripping an optional "mpnet." prefix. The MLM head, the pooler
# and the stored position ids are not the encoder's: left out.
NAME_TABLE = [
    (r"^embeddings\.word_embeddings\.weight$", "word_emb.weight"),
    (r"^embeddings\.position_embeddings\.weight$", "pos_emb.weight"),
    (r"^embeddings\.LayerNorm\.(weight|bias)$", r"emb_ln.\1"),
    (r"^encoder\.layer\.(\d+)\.attention\.attn\.q\.(weight|bias)$", r"layers.\1.attn.query.\2"),
    (r"^encoder\.layer\.(\d+)\.attention\.attn\.k\.(weight|bias)$", r"layers.\1.attn.key.\2"),
    (r"^encoder\.layer\.(\d+)\.attention\.attn\.v\.(weight|bias)$", r"layers.\1.attn.value.\2"),
    (r"^encoder\.layer\.(\d+)\.attention\.attn\.o\.(weight|bias)$", r"layers.\1.attn.out.\2"),
    (r"^encoder\.layer\.(\d+)\.attention\.LayerNorm\.(weight|bias)$", r"layers.\1.ln1.\2"),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)$", r"layers.\1.fc1.\2"),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)$", r"layers.\1.fc2.\2"),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.ln2.\2"),
    (r"^encoder\.relative_attention_bias\.weight$", "rel.table.weight"),
]
PREFIX = r"^mpnet\."
SPECIALS = {"pad": "<pad>", "unk": "[UNK]", "cls": "<s>", "sep": "</s>"}  # all-mpnet-base-v2's special_tokens_map
MAX_DISTANCE = 128  # MPNet's bucket function: distances from 128 on share the last bucket


def relative_buckets(T: int, buckets: int, max_distance: int = MAX_DISTANCE, device=None) -> torch.Tensor:
    """(T, T) int64: the bucket of key j seen from query i. Half the buckets for keys on the left, half on the right;
    in each half, distances below a quarter of `buckets` get a bucket each, longer ones share log-spaced buckets."""
    pos = torch.arange(T, device=device)
    n = pos[:, None] - pos[None, :]  # (T, T): i - j, positive for keys on the left
    half = buckets // 2
    side = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    # clamp(min=1): the log is only read where n >= exact, but must not be -inf (NaN-free graphs export cleanly)
    far = exact + (torch.log(n.clamp(min=1).float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    far = far.clamp(max=half - 1)
    return side + torch.where(n < exact, n, far)


class RelativeBias(nn.Module):
    """The shared relative-position bias: one learned value per (bucket, head), added to every layer's scores."""

    def __init__(self, buckets: int, heads: int, max_distance: int = MAX_DISTANCE):
        super().__init__()
        self.buckets, self.max_distance = buckets, max_distance
        self.table = nn.Embedding(buckets, heads)

    def forward(self, T: int) -> torch.Tensor:
        idx = relative_buckets(T, self.buckets, self.max_distance, self.table.weight.device)  # (T, T)
        return self.table(idx).permute(2, 0, 1).unsqueeze(0)  # (1, nh, T, T)


def position_rows(hf: dict) -> int:
    """The first position row a token reads: one after the padding id."""
    return hf.get("pad_token_id", 1) + 1


def config_fields(hf: dict) -> dict:
    """ModelConfig fields an MPNet config.json sets beyond BERT's sizes."""
    return {"rel_buckets": hf.get("relative_attention_num_buckets", 32), "token_types": False,
            "max_positions": hf["max_position_embeddings"] - position_rows(hf)}


def convert(name: str, tensor: torch.Tensor, hf: dict) -> torch.Tensor:
    """A checkpoint tensor in our layout: the position table loses the rows no real token reads."""
    return tensor[position_rows(hf):] if name == "pos_emb.weight" else tensor
