"""Pretrained base encoders: `--base-model` names (base_models.toml) or folders, their configs, specials and weights.

Weights load from safetensors (never pickle) through a name table per architecture (`ARCHS`: BERT, MPNet).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from edgekit.errors import EdgekitError
from edgekit.modeling import mpnet
from edgekit.modeling.base_models import BASE_MODELS, DEFAULT, base_folder  # noqa: F401 (their home before)
from edgekit.modeling.model import JointModel, ModelConfig
from edgekit.text.wordpiece import BERT_SPECIALS

# Hugging Face BERT parameter names -> ours, after stripping an optional "bert." prefix.
BERT_NAMES = [
    (r"^embeddings\.word_embeddings\.weight$", "word_emb.weight"),
    (r"^embeddings\.position_embeddings\.weight$", "pos_emb.weight"),
    (r"^embeddings\.LayerNorm\.(weight|bias)$", r"emb_ln.\1"),
    (r"^embeddings\.token_type_embeddings\.weight$", "type_emb"),  # row 0 only: one segment
    (r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$", r"layers.\1.attn.\2.\3"),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)$", r"layers.\1.attn.out.\2"),
    (r"^encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.ln1.\2"),
    (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)$", r"layers.\1.fc1.\2"),
    (r"^encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)$", r"layers.\1.fc2.\2"),
    (r"^encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)$", r"layers.\1.ln2.\2"),
]
_LEGACY = {"gamma": "weight", "beta": "bias"}  # older checkpoints name LayerNorm parameters gamma/beta


@dataclass(frozen=True)
class Arch:
    """How one `model_type` maps onto JointModel: its names, extra config fields and tensor conversion."""

    names: list
    prefix: str
    fields: Callable[[dict], dict] = lambda hf: {"max_positions": hf["max_position_embeddings"]}
    convert: Callable = lambda name, t, hf: t[0] if name == "type_emb" else t
    optional: tuple = field(default=("type_emb",))  # ours that a checkpoint may lack (then left at their init)
    specials: dict = field(default_factory=lambda: dict(BERT_SPECIALS))  # without a special_tokens_map.json


ARCHS = {
    "bert": Arch(BERT_NAMES, r"^bert\."),
    "mpnet": Arch(mpnet.NAME_TABLE, mpnet.PREFIX, mpnet.config_fields, mpnet.convert, (), mpnet.SPECIALS),
}
SIZE_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
             "max_position_embeddings")


def base_config(folder: str | Path) -> dict:
    """A base model folder's config.json, checked before any work: the folder's three files are there, the config
    names the sizes as positive integers and an architecture in ARCHS. One EdgekitError naming the file otherwise."""
    folder = Path(folder)
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        if not (folder / name).is_file():
            raise EdgekitError(f"{folder / name}: missing; a base model folder needs config.json, "
                               "model.safetensors and vocab.txt")
    path = folder / "config.json"
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise EdgekitError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise EdgekitError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if not isinstance(hf, dict):
        raise EdgekitError(f"{path}: a JSON object of the model's sizes expected")
    bad = [k for k in SIZE_KEYS if not isinstance(hf.get(k), int) or isinstance(hf.get(k), bool) or hf[k] < 1]
    if bad:
        raise EdgekitError(f"{path}: {bad[0]} must be a positive integer, got {hf.get(bad[0])!r}")
    kind = hf.setdefault("model_type", "bert")
    if kind not in ARCHS:
        raise EdgekitError(f"{path}: model_type {kind!r} is not supported (one of {', '.join(ARCHS)})")
    if hf.get("position_embedding_type", "absolute") != "absolute" or hf.get("hidden_act", "gelu") != "gelu":
        raise EdgekitError(f"{path}: only encoders with absolute positions and GELU are supported")
    return hf


def max_positions(hf: dict) -> int:
    """The positions a token can take (MPNet: two fewer than its table, which starts after the padding id)."""
    return ARCHS[hf["model_type"]].fields(hf)["max_positions"]


def specials(folder: str | Path) -> dict[str, str]:
    """The base vocabulary's pad, unk, cls and sep pieces: special_tokens_map.json's where the folder has one, else
    its architecture's (BERT: [PAD], [UNK], [CLS], [SEP]; MPNet: <pad>, [UNK], <s>, </s>; an MPNet vocabulary holds
    BERT's pieces too, which it was never trained with)."""
    path = Path(folder) / "special_tokens_map.json"
    if not path.is_file():
        return dict(ARCHS[base_config(folder)["model_type"]].specials)
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EdgekitError(f"{path}: not a JSON object of special tokens ({e})") from None
    out = {}
    for key, default in BERT_SPECIALS.items():
        v = found.get(f"{key}_token", default) if isinstance(found, dict) else None
        v = v.get("content") if isinstance(v, dict) else v
        if not isinstance(v, str) or not v:
            raise EdgekitError(f"{path}: {key}_token must be a piece of vocab.txt, got {v!r}")
        out[key] = v
    return out


def _rename(arch: Arch, name: str) -> str | None:
    name = re.sub(arch.prefix, "", name)
    name = re.sub(r"\.(gamma|beta)$", lambda m: "." + _LEGACY[m.group(1)], name)
    for pat, rep in arch.names:
        if re.match(pat, name):
            return re.sub(pat, rep, name)
    return None


def load_pretrained(folder: str | Path, n_intents: int, n_slots: int, dropout: float = 0.1) -> JointModel:
    """Build a JointModel from a base model folder (config.json, model.safetensors, vocab.txt).

    Heads are freshly initialised; the encoder weights are copied by the architecture's name table."""
    from safetensors import safe_open

    folder = Path(folder)
    hf = base_config(folder)
    arch = ARCHS[hf["model_type"]]
    H, nh, L = hf["hidden_size"], hf["num_attention_heads"], hf["num_hidden_layers"]
    cfg = ModelConfig(vocab_size=hf["vocab_size"], hidden=H, heads=[nh] * L, ffn=[hf["intermediate_size"]] * L,
                      head_dim=H // nh, eps=hf.get("layer_norm_eps", 1e-12), dropout=dropout, n_intents=n_intents,
                      n_slots=n_slots, **arch.fields(hf))
    model = JointModel(cfg)
    own = model.state_dict()  # tensors sharing the parameters' storage: copy_ fills the model
    loaded = set()
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        for key in f.keys():
            ours = _rename(arch, key)
            if ours is None or ours not in own:
                continue
            t = arch.convert(ours, f.get_tensor(key), hf)
            if t.shape != own[ours].shape:
                raise EdgekitError(f"{folder / 'model.safetensors'}: {key} has shape {tuple(t.shape)}, "
                                   f"config.json implies {tuple(own[ours].shape)}")
            with torch.no_grad():
                own[ours].copy_(t)
            loaded.add(ours)
    heads = ("intent_head", "slot_head", "cont") + arch.optional
    missing = [k for k in own if k not in loaded and not k.startswith(heads)]
    if missing:
        raise EdgekitError(f"{folder / 'model.safetensors'}: weights missing for {missing[:3]} "
                           f"({len(missing)} in all); is this a {hf['model_type']} checkpoint?")
    return model
