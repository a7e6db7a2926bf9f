"""Pass: structured pruning of attention heads, FFN channels and (when emptied) whole layers.

Importance is first-order Taylor on the task loss (Molchanov et al. 2019): for a head or an FFN channel,
the gradient of the loss with respect to a gate on its output, which equals the sum of weight * grad over
the output-projection columns it feeds. Squared per batch and summed. Units are ranked globally by
importance per parameter (normalised within each layer and unit kind, so layers compete fairly) and removed
until the non-embedding parameter target is met. The result is a real, smaller module.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from edgekit.modeling.model import JointModel, ModelConfig, count_params, param_bytes
from edgekit.record import PassRecord, PassResult


@dataclass
class PruneConfig:
    target_params: int  # non-embedding parameters to keep (at most)
    drop_layers: int = 0  # whole layers removed first, those whose removal raises the task loss least
    min_heads: int = 0  # per surviving layer

    def __post_init__(self):
        if self.target_params <= 0:
            raise ValueError("target_params must be positive")


def importance(model: JointModel, batches: list, loss_fn) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer: head scores (nh,) and FFN channel scores (ffn,)."""
    model.eval()  # no dropout: scores reflect the deterministic network
    heads = [torch.zeros(layer.attn.heads if layer.attn is not None else 0) for layer in model.layers]
    ffn = [torch.zeros(layer.fc1.out_features if layer.fc1 is not None else 0) for layer in model.layers]
    for ids, mask, intents, slots in batches:
        model.zero_grad(set_to_none=True)
        loss_fn(model(ids, mask), intents, slots).backward()
        for i, layer in enumerate(model.layers):
            a = layer.attn
            if a is not None:
                wg = (a.out.weight * a.out.weight.grad).sum(0)  # (nh*hd,)
                heads[i] += wg.view(a.heads, a.head_dim).sum(1).pow(2).detach()
            if layer.fc1 is not None:
                ffn[i] += (layer.fc2.weight * layer.fc2.weight.grad).sum(0).pow(2).detach()  # (ffn,)
    model.zero_grad(set_to_none=True)
    return heads, ffn


@torch.no_grad()
def layer_sensitivity(model: JointModel, batches: list, loss_fn) -> list[float]:
    """Loss increase on the calibration batches when each layer is skipped (the residual stream passes by)."""
    model.eval()

    def loss() -> float:
        return sum(float(loss_fn(model(ids, mask), i, s)) for ids, mask, i, s in batches)

    base, layers, out = loss(), model.layers, []
    try:
        for k in range(len(layers)):
            model.layers = nn.ModuleList(layer for j, layer in enumerate(layers) if j != k)
            out.append(loss() - base)
    finally:
        model.layers = layers
    return out


def _normalised(scores: list[torch.Tensor]) -> list[torch.Tensor]:
    return [s / s.mean().clamp_min(1e-12) if s.numel() else s for s in scores]


def plan(model: JointModel, heads: list[torch.Tensor], ffn: list[torch.Tensor], cfg: PruneConfig,
         dropped: list[int] = ()):
    """Choose which heads and channels stay.

    The cut is shared between attention and FFN in proportion to their current size (a global ranking by
    importance per parameter would trade whole attention blocks for FFN channels, and slot tagging needs
    attention). Within each kind the ranking is global across layers, on scores normalised per layer, so
    layers keep uneven numbers of heads and channels. A layer left with neither goes away whole.
    """
    H, hd = model.cfg.hidden, model.cfg.head_dim
    head_cost, ffn_cost = 4 * H * hd + 3 * hd, 2 * H + 1
    total = count_params(model, embeddings=False)
    for i in dropped:  # whole layers already gone: their weights and LayerNorms no longer count
        layer = model.layers[i]
        total -= sum(p.numel() for p in layer.parameters())
    attn_params = sum(len(h) for h in heads) * head_cost
    ffn_params = sum(len(f) for f in ffn) * ffn_cost
    cut = max(0, total - cfg.target_params)
    cut_attn = cut * attn_params / max(1, attn_params + ffn_params)
    keep_h = [set(range(len(h))) for h in heads]
    keep_f = [set(range(len(f))) for f in ffn]
    for scores, keep, cost, budget in ((heads, keep_h, head_cost, cut_attn), (ffn, keep_f, ffn_cost, cut - cut_attn)):
        ranked = sorted((float(s), i, j) for i, layer in enumerate(_normalised(scores)) for j, s in enumerate(layer))
        removed = 0.0
        for _, i, j in ranked:
            if removed >= budget:
                break
            if keep is keep_h and len(keep[i]) <= cfg.min_heads:
                continue
            keep[i].discard(j)
            removed += cost
    return [sorted(k) for k in keep_h], [sorted(k) for k in keep_f]


def _rows(linear: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    new = nn.Linear(linear.in_features, len(idx))
    new.weight.data.copy_(linear.weight.data[idx])
    new.bias.data.copy_(linear.bias.data[idx])
    return new


def _cols(linear: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    new = nn.Linear(len(idx), linear.out_features)
    new.weight.data.copy_(linear.weight.data[:, idx])
    new.bias.data.copy_(linear.bias.data)
    return new


def apply_plan(model: JointModel, keep_h: list[list[int]], keep_f: list[list[int]]) -> JointModel:
    """A new, smaller JointModel holding the kept heads, channels and non-empty layers."""
    hd = model.cfg.head_dim
    live = [i for i in range(model.cfg.layers) if keep_h[i] or keep_f[i]]
    cfg = ModelConfig(**{**model.cfg.__dict__, "heads": [len(keep_h[i]) for i in live],
                         "ffn": [len(keep_f[i]) for i in live]})
    new = JointModel(cfg)
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("layers.")}
    new.load_state_dict(own, strict=False)
    for n, i in enumerate(live):
        src, dst = model.layers[i], new.layers[n]
        if keep_h[i]:
            cols = torch.tensor([h * hd + d for h in keep_h[i] for d in range(hd)], dtype=torch.long)
            for name in ("query", "key", "value"):
                setattr(dst.attn, name, _rows(getattr(src.attn, name), cols))
            dst.attn.out = _cols(src.attn.out, cols)
        if keep_f[i]:
            f = torch.tensor(keep_f[i], dtype=torch.long)
            dst.fc1, dst.fc2 = _rows(src.fc1, f), _cols(src.fc2, f)
        dst.ln1.load_state_dict(src.ln1.state_dict())
        dst.ln2.load_state_dict(src.ln2.state_dict())
    return new


def prune(model: JointModel, batches: list, loss_fn, cfg: PruneConfig) -> PassResult:
    """Structured pruning to cfg.target_params non-embedding parameters. `batches`: (ids, mask, intents, slots)
    task batches the importance is measured on; `loss_fn(outputs, intents, slots)`: the task loss."""
    t0 = time.perf_counter()
    if not batches:
        raise ValueError("prune needs task batches")
    if model.rel is not None:  # every layer reads one (buckets, heads) table: a layer cannot lose heads alone
        raise ValueError("an encoder with a shared relative-position bias (MPNet) cannot be pruned; the device "
                         "student is pruned from a MiniLM-derived model")
    rec = PassRecord("prune", params_before=count_params(model), bytes_before=param_bytes(model))
    before = count_params(model, embeddings=False)
    heads, ffn = importance(model, batches, loss_fn)
    sens = layer_sensitivity(model, batches, loss_fn) if cfg.drop_layers else []
    dropped = sorted(range(len(sens)), key=sens.__getitem__)[: cfg.drop_layers]
    for i in dropped:  # an emptied layer is removed whole by apply_plan; plan() then spends the rest
        heads[i], ffn[i] = heads[i][:0], ffn[i][:0]
    keep_h, keep_f = plan(model, heads, ffn, cfg, dropped)
    new = apply_plan(model, keep_h, keep_f).eval()
    rec.params_after, rec.bytes_after = count_params(new), param_bytes(new)
    rec.extra = {"nonembedding_before": before, "nonembedding_after": count_params(new, embeddings=False),
                 "target_params": cfg.target_params, "heads": new.cfg.heads, "ffn": new.cfg.ffn,
                 "layers_before": model.cfg.layers, "layers_after": new.cfg.layers,
                 "kept_layers": [i for i in range(model.cfg.layers) if keep_h[i] or keep_f[i]],
                 "layer_sensitivity": sens}
    if rec.extra["nonembedding_after"] > cfg.target_params:
        rec.warnings.append(f"could not reach {cfg.target_params} non-embedding parameters "
                            f"({rec.extra['nonembedding_after']} left)")
    rec.seconds = time.perf_counter() - t0
    return PassResult(new, rec)
