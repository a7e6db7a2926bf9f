"""The student's shape under a size or latency budget (issue 56): a small grid of levers, each candidate's package
bytes from `sizes.package_bytes` before any training, and the non-embedding parameters solved to fill what the
budget leaves; under a latency budget, capped where `latency.py`'s model of this machine predicts the budget.

Levers, from the profile's `[search]` table: the vocabulary (every task piece, or a budget of the most frequent), the
word embedding's rank (the full (V, H) table, or an SVD factorisation that distillation recovers), and the student's
layers. For each combination the prune target is the most non-embedding parameters whose package fits `max_size`
less a reserve for the quantize fallback ladder (`reserve_steps` 4-bit Linears moved to INT8), so that no later
growth passes the budget. Heads and FFN channels are spread evenly over the layers in the teacher's proportion: the
prune stage spreads them unevenly, which moves the package by a few hundred bytes (tests/engine/test_search.py).

No training here: the first candidate in the profile's lever order that keeps at least `prefer_share` of the layer
parameters its shape would have without the size budget is taken (`choose`), else the first. With `rank_epochs`,
rank.py then measures a shortlist of them after the teacher stage and may build another.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from dataclasses import dataclass, field

from edgekit.engine.sizes import SEGMENT, QuantSpec, StudentShape, linear_tensors, linears, package_bytes

log = logging.getLogger("edgekit")


@dataclass
class SearchSettings:
    """[search]: the levers the size search may move, each a list of the values it tries."""

    # Each lever's values in the order they are tried; []: the profile's own ([compress] vocab_budget,
    # embedding_rank; the teacher's layers less compress.prune_layers).
    vocab_budgets: list[int] = field(default_factory=list)  # most pieces kept; 0: every task piece
    embedding_ranks: list[int] = field(default_factory=list)  # factorised table's rank; 0: the full table
    layers: list[int] = field(default_factory=list)
    min_param_share: float = 0.04  # fewer non-embedding parameters than this share of the teacher's: no candidate
    # The first candidate in lever order that keeps at least this share of the layer parameters its shape has
    # without the size budget is taken; none does: the first. CLINC150 under 2 MB: the whole table with 27% of them
    # gave 92.60 / 74.4 (in scope / out-of-scope recall, one seed), a rank-64 table with all of them 93.81 / 79.0
    # (two seeds; docs/experiments.md, 2026-12-07, CLINC150 under 2 MB). On SNIPS too, more layer parameters
    # beat a wider table: rank 64 with 1.97 M gave 94.28 slot F1 (three seeds), rank 128 with 1.40 M 93.73 (one).
    # devices/android.toml sets 0.7, which gives CLINC150 rank 128 with 85% of them: 93.68 / 81.9 (two seeds).
    prefer_share: float = 0.5
    reserve_steps: int = 1  # quantize fallback steps the size budget keeps room for (the ladder is capped there)
    # Brief distillation to rank a shortlist (edgekit/engine/rank.py): epochs each (0: none, `prefer_share` picks)
    # and how many candidates: the prior's pick, then at its vocabulary the first keeping `prefer_share` per rank.
    rank_epochs: int = 0
    rank_top: int = 3

    def __post_init__(self):
        from edgekit.text.vocab import N_FIXED

        for name, low in (("vocab_budgets", 0), ("embedding_ranks", 0), ("layers", 1)):
            values = getattr(self, name)
            if not isinstance(values, list) or any(not isinstance(v, int) or isinstance(v, bool) or v < low
                                                   for v in values):
                raise ValueError(f"{name} must be a list of whole numbers >= {low}, got {values!r}")
        if any(0 < v <= N_FIXED for v in self.vocab_budgets):
            raise ValueError(f"vocab_budgets must be 0 (every task piece) or above the {N_FIXED} special and byte "
                             f"pieces, got {self.vocab_budgets!r}")
        for name in ("min_param_share", "prefer_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not isinstance(self.reserve_steps, int) or isinstance(self.reserve_steps, bool) or self.reserve_steps < 0:
            raise ValueError(f"reserve_steps must be a whole number >= 0, got {self.reserve_steps!r}")
        for name, low in (("rank_epochs", 0), ("rank_top", 2)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be a whole number >= {low}, got {v!r}")


@dataclass(frozen=True)
class Facts:
    """What the search knows before training: the data's labels and lengths, the task vocabulary, the teacher's
    shape and the quantize settings. piece_utf8: the task pieces' UTF-8 bytes (None: sizes' average)."""

    labels: dict
    task_vocab: int  # pieces with every task piece (specials and byte pieces included)
    max_len: int
    buckets: tuple[int, ...]
    teacher_layers: int
    teacher_nonemb: int
    quant: QuantSpec
    intent_slots: dict | None = None
    hidden: int = 384
    head_dim: int = 32
    attn_share: float = 1 / 3  # attention's share of a layer's parameters (BERT: 4H^2 of 12H^2)
    piece_utf8: int | None = None
    runtimes: tuple[str, ...] = ("executorch", "onnx")
    teacher_embedding: int = 0  # the teacher's embedding parameters (word, position and token-type rows)


@dataclass(frozen=True)
class Candidate:
    """One shape: its levers, the non-embedding parameters that fill the budget, its predicted bytes, its p50 as
    the latency model predicts it (None without a latency budget), and the layer parameters it would keep without
    the size budget (under the profile's shares and the latency cap)."""

    vocab: int
    emb_rank: int | None
    layers: int
    nonemb: int
    size_bytes: int
    reserve_bytes: int
    p50_ms_model: float | None = None
    unbudgeted: int = 0  # layer parameters without the size budget; 0: unknown (never passed over by `choose`)

    def settings(self, facts: Facts, vocab_budget: int) -> dict:
        """The build settings this candidate stands for ([compress]): the prune target as a share of the teacher's
        non-embedding parameters (which count the LayerNorms and heads too), pinned: no back-off may grow it past
        the budget."""
        share = min(1.0, (self.nonemb + overhead(facts, self.layers)) / facts.teacher_nonemb)
        return {"vocab_budget": vocab_budget or None, "embedding_rank": self.emb_rank, "param_share": share,
                "max_param_share": share, "total_share": 1.0, "max_total_share": 1.0,
                "prune_layers": facts.teacher_layers - self.layers}


def overhead(facts: Facts, layers: int) -> int:
    """Non-embedding parameters that are not heads or FFN channels: the LayerNorms and the intent and slot heads."""
    H, n_int, n_tags = facts.hidden, len(facts.labels["intents"]), len(facts.labels["slot_tags"])
    return 2 * H + 4 * H * layers + (H + 1) * n_int + (H + 1) * n_tags


def even_shape(facts: Facts, vocab: int, rank: int | None, layers: int, nonemb: int) -> StudentShape:
    """A student of `nonemb` non-embedding parameters over `layers` layers, heads and FFN channels in the teacher's
    proportion (at least one head and one channel a layer)."""
    H, hd = facts.hidden, facts.head_dim
    head_cost, ffn_cost = 4 * H * hd + 3 * hd, 2 * H + 1
    per = nonemb / layers
    heads = max(1, round(facts.attn_share * per / head_cost))
    ffn = max(1, round((per - heads * head_cost) / ffn_cost))
    return StudentShape(vocab, (heads,) * layers, (ffn,) * layers, hidden=H, head_dim=hd, emb_rank=rank or None)


def shape_params(shape: StudentShape) -> int:
    """Non-embedding parameters of the shape's layers (the prune stage's target counts these, LayerNorms aside)."""
    H, hd = shape.hidden, shape.head_dim
    return sum(h * (4 * H * hd + 3 * hd) + f * (2 * H + 1) for h, f in zip(shape.heads, shape.ffn))


def _bytes(facts: Facts, shape: StudentShape) -> tuple[int, int]:
    """(package bytes, one fallback step: the largest move of a Linear up one rung of the ladder, a 4-bit one to
    INT8 or an INT8 one (the heads) to FP32). Prune spreads channels unevenly, so a real FFN Linear may be wider
    than the even shape's: the package check after the build still holds the budget (exit 3)."""
    got = package_bytes(shape, facts.quant, facts.labels, facts.max_len, facts.buckets, facts.intent_slots,
                        runtimes=facts.runtimes, piece_utf8=None if facts.piece_utf8 is None else
                        round(facts.piece_utf8 * shape.vocab / facts.task_vocab))
    dims = {name: (o, i, bias) for name, o, i, bias in linears(shape, len(facts.labels["intents"]),
                                                               len(facts.labels["slot_tags"]))}
    up = {"int4": "int8", "int8": "fp32"}
    step = max((sum(-(-b // SEGMENT) * SEGMENT for b in linear_tensors(*dims[name], up[kind])) - n
                for name, (kind, n) in got["linears"].items() if kind in up), default=0)
    return got["size_bytes"], step


def fill(facts: Facts, vocab: int, rank: int | None, layers: int, max_size: int | None, reserve_steps: int,
         low: int, high: int) -> Candidate | None:
    """The candidate with the most non-embedding parameters in [low, high] whose bytes plus reserve fit max_size
    (None: any; bisection: bytes grow with parameters), or None when even `low` does not fit. The even shape's
    heads and channels are whole, so its parameters may pass `high` by a rounding: they never do."""
    def fits(n: int) -> tuple[bool, int, int]:
        shape = even_shape(facts, vocab, rank, layers, n)
        size, step = _bytes(facts, shape)
        # `low` is the floor the levers allow: its rounding is taken as it comes
        ok = (max_size is None or size + reserve_steps * step <= max_size) and (n == low or shape_params(shape) <= high)
        return ok, size, step

    if not fits(low)[0]:
        return None
    while high - low > 256:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid)[0] else (low, mid)
    shape = even_shape(facts, vocab, rank, layers, low)
    _, size, step = fits(low)
    return Candidate(vocab, rank or None, layers, shape_params(shape), size, reserve_steps * step)


def profile_target(facts: Facts, vocab: int, rank: int | None, layers: int, param_share: float = 1.0,
                   total_share: float = 1.0) -> int:
    """The heads' and FFN channels' parameters the profile's shares give a student of this vocabulary and rank (as
    stages/common.target_params computes the prune target, less the LayerNorms and heads it also counts)."""
    H = facts.hidden
    emb = vocab * (rank or H) + (rank or 0) * H + facts.max_len * H + H
    total = facts.teacher_nonemb + facts.teacher_embedding
    target = min(param_share * facts.teacher_nonemb, total_share * total - emb) if facts.teacher_embedding else \
        param_share * facts.teacher_nonemb
    return int(target) - overhead(facts, layers)


def lowest(facts: Facts, cfg: SearchSettings) -> int:
    """The fewest layer parameters a candidate may keep (min_param_share of the teacher's)."""
    return int(cfg.min_param_share * facts.teacher_nonemb)


def widest(facts: Facts, layers: int) -> int:
    """The most layer parameters `layers` layers may keep: each as wide as a teacher layer (prune removes, it never
    adds a head or a channel)."""
    return layers * (facts.teacher_nonemb - overhead(facts, facts.teacher_layers)) // facts.teacher_layers


def candidates(facts: Facts, cfg: SearchSettings, max_size: int | None, default_layers: int, param_share: float = 1.0,
               total_share: float = 1.0, latency=None, most: int | None = None) -> list[Candidate]:
    """Every lever combination that fits max_size (None: any), each filled to the budget but never past what the
    profile's shares give it (the search shrinks a student to fit; it does not grow one), in the order of the
    levers. latency: (LatencyModel, ms): also no more parameters than the model predicts within ms (each candidate
    carries its predicted p50). most: no more layer parameters than this."""
    out, seen = [], set()
    low = lowest(facts, cfg)
    for budget, rank, layers in itertools.product(cfg.vocab_budgets or [0], cfg.embedding_ranks or [0],
                                                  cfg.layers or [default_layers]):
        vocab = min(budget or facts.task_vocab, facts.task_vocab)
        if layers > facts.teacher_layers or rank >= facts.hidden or (vocab, rank, layers) in seen:
            continue
        seen.add((vocab, rank, layers))
        high = min(max(low, profile_target(facts, vocab, rank, layers, param_share, total_share)),
                   widest(facts, layers))
        if most is not None:
            high = min(high, max(low, most))
        if latency is not None and most is None:
            high = min(high, latency[0].max_params(layers, latency[1]))
            if high < low:
                continue
        c = fill(facts, vocab, rank, layers, max_size, cfg.reserve_steps, low, high)
        if c is not None:
            p50 = None if latency is None else round(latency[0].predict(layers, c.nonemb), 4)
            # a shape the latency cap holds back is not starved by the size budget: only the size budget counts
            out.append(dataclasses.replace(c, p50_ms_model=p50, unbudgeted=high))
    return out


def smallest(facts: Facts, cfg: SearchSettings, default_layers: int) -> int:
    """Bytes of the smallest package the levers allow (the fewest pieces, the lowest rank, the fewest layers, the
    least parameters): a size budget below it cannot be met by any shape."""
    vocab = min([b or facts.task_vocab for b in cfg.vocab_budgets] + [facts.task_vocab])
    ranks = [r for r in cfg.embedding_ranks if 0 < r < facts.hidden]
    shape = even_shape(facts, vocab, min(ranks) if ranks else None, min(cfg.layers or [default_layers]),
                       lowest(facts, cfg))
    size, step = _bytes(facts, shape)
    return size + cfg.reserve_steps * step



def facts_of(data, tokenizer, hf: dict, max_len: int, buckets: list[int], quant, runtimes, corpus: list[str],
             n_base_words: int = 0) -> Facts:
    """The search's facts for a build: the task vocabulary as trim_vocab keeps it (every piece the base tokenizer
    makes on the corpus, single characters included, and compress.base_words' words beside them) and the teacher's
    shape from the base model's config. The
    decoding tables are counted without the intent-to-slot whitelist: whether it ships is decided after training
    (kept where it costs no dev slot F1), so the budget holds either way (SNIPS: 31.6 KB more than with it)."""
    from edgekit.converters.trim_vocab import base_words, piece_counts, select_pieces
    from edgekit.engine.sizes import QuantSpec
    from edgekit.scoring.score import labels_of
    from edgekit.text.vocab import N_FIXED

    counts, chars = piece_counts(tokenizer, corpus)
    kept = select_pieces(tokenizer, counts, chars, None, base_words(tokenizer, n_base_words))
    H, L, inner = hf["hidden_size"], hf["num_hidden_layers"], hf["intermediate_size"]
    heads = hf["num_attention_heads"]
    labels = labels_of(data)
    hd = H // heads
    units = heads * (4 * H * hd + 3 * hd) + inner * (2 * H + 1)
    emb = (tokenizer.vocab_size + hf.get("max_position_embeddings", 512) + 1) * H
    f = Facts(labels, N_FIXED + len(kept), max_len, tuple(buckets), L, 0, QuantSpec(
        quant.embedding_bits, quant.embedding_group, weight4=tuple(quant.weight4), keep_fp32=tuple(quant.keep_fp32)),
        intent_slots=None, hidden=H, head_dim=hd,
        piece_utf8=sum(len(p.encode()) for p in kept), runtimes=tuple(runtimes), teacher_embedding=emb)
    return dataclasses.replace(f, teacher_nonemb=L * units + overhead(f, L))


def record(facts: Facts, limits: dict, found: list[Candidate], chosen: Candidate | None, seconds: float,
           latency: dict | None = None) -> dict:
    """report.json's `search`: the budgets, every candidate (its shape, bytes, predicted p50 and what it was scored),
    the one chosen, the latency model (with --max-latency) and the search's cost (the model's probes included)."""
    return {"limits": limits, "task_vocab": facts.task_vocab, "seconds": round(seconds, 2),
            "candidates": [dataclasses.asdict(c) | {"chosen": c == chosen} for c in found]} | \
        ({"latency_model": latency} if latency else {})


def choose(found: list[Candidate], prefer_share: float) -> Candidate | None:
    """The first candidate in the profile's lever order (listed cheapest first; docs/experiments.md measures each)
    that keeps at least `prefer_share` of the layer parameters its shape has without the size budget, else the
    first: a whole table that leaves the layers a quarter of their parameters loses to a factorised one that keeps
    them all. Every candidate keeps at least min_param_share of the teacher's parameters."""
    return next((c for c in found if c.nonemb >= prefer_share * c.unbudgeted), found[0] if found else None)


def probe_shapes(facts: Facts, depths: list[int], low: int, high_of) -> list[StudentShape]:
    """The latency model's probes: the fewest and the most layers, each at `low` and at `high_of(layers)` layer
    parameters (the range the candidates span), over the task vocabulary."""
    return [even_shape(facts, facts.task_vocab, None, n, p) for n in sorted({min(depths), max(depths)})
            for p in sorted({low, max(low, min(high_of(n), widest(facts, n)))})]


def within_latency(ctx, facts: Facts, levers: SearchSettings, layers: int, max_size: int | None) -> tuple[list, dict]:
    """The candidates the latency model (fitted, or read from the cache) predicts within limits.max_latency less
    latency.MARGIN; when none is, the fastest shape (the depth predicted fastest, at the fewest parameters), which
    the package stage's measure then holds to the budget (exit 3 when over). (candidates, report.json's
    latency_model)."""
    from edgekit.engine.latency import MARGIN, latency_model
    from edgekit.errors import EdgekitError

    c, max_ms = ctx.settings.compress, ctx.settings.limits.max_latency
    low = lowest(facts, levers)
    depths = [n for n in levers.layers or [layers] if n <= facts.teacher_layers]
    if not depths:
        raise EdgekitError(f"search.layers {levers.layers}: none is at most the teacher's {facts.teacher_layers} "
                           "layers")
    shapes = probe_shapes(facts, depths, low, lambda n: profile_target(facts, facts.task_vocab, None, n,
                                                                        c.param_share, c.total_share))
    model, cached = latency_model(ctx, facts.labels, shapes, [shape_params(s) for s in shapes])
    info = model.to_dict() | {"cached": cached, "margin": MARGIN}
    found = candidates(facts, levers, max_size, layers, c.param_share, c.total_share, (model, max_ms * (1 - MARGIN)))
    if not found:
        depth = min(depths, key=lambda n: (model.predict(n, low), n))
        info["fastest_ms"] = round(model.predict(depth, low), 4)
        log.warning("limits.max_latency %g ms: no shape is predicted within it less the %d%% margin (%.3f ms); the "
                    "fastest the [search] levers allow is predicted at %.3f ms on this machine: building that one, "
                    "and the package stage's measure decides", max_ms, round(100 * MARGIN), max_ms * (1 - MARGIN),
                    info["fastest_ms"])
        found = candidates(facts, dataclasses.replace(levers, layers=[depth]), max_size, layers, c.param_share,
                           c.total_share, (model, max_ms), most=low)
    return found, info


def plan(ctx) -> dict | None:
    """Under limits.max_size or limits.max_latency, for a build that prunes and lowers to ExecuTorch (the package
    sizes.py computes): the candidates, and report.json's `search`. When the profile's own shape fits, its settings
    stay and only its growth is pinned (no back-off past its shares, no vocabulary growth, the ladder capped at the
    reserve); else the chosen candidate's [compress] settings replace them (they enter the stage keys as any
    setting does). A size budget below the smallest shape the levers allow: EdgekitError, before any training."""
    import time

    from edgekit.engine.stages.trim_vocab import corpus
    from edgekit.errors import EdgekitError
    from edgekit.modeling.pretrained import base_config

    s, c = ctx.settings, ctx.settings.compress
    max_size, max_ms = s.limits.max_size, s.limits.max_latency
    if (max_size is None and max_ms is None) or not {"prune", "quantize"} <= set(ctx.stages) or \
            ctx.target.primary_runtime != "executorch":
        if s.search.rank_epochs:
            log.warning("search.rank_epochs: no size search in this build (no budget, or no ExecuTorch student)")
        return None  # the budgets are still held against the package written (limits.held)
    t0 = time.perf_counter()
    facts = facts_of(ctx.data, ctx.base_tokenizer, base_config(ctx.base_model), ctx.max_len,
                     ctx.length_stats["buckets"], s.quantize, ctx.target.runtimes, corpus(ctx), c.base_words)
    layers = max(1, facts.teacher_layers - c.prune_layers)
    own = (c.vocab_budget or 0, c.embedding_rank or 0, layers)
    levers = dataclasses.replace(s.search, vocab_budgets=s.search.vocab_budgets or [own[0]],
                                 embedding_ranks=s.search.embedding_ranks or [own[1]])
    found, latency = within_latency(ctx, facts, levers, layers, max_size) if max_ms is not None else \
        (candidates(facts, levers, max_size, layers, c.param_share, c.total_share), None)
    if not found and max_size is None:  # a latency budget alone: no lever combination the teacher allows
        raise EdgekitError("[search]: no lever combination fits the teacher (layers, or ranks below its width)")
    if not found:
        floor = smallest(facts, levers, layers)
        raise EdgekitError(f"limits.max_size {max_size:,} bytes: no student shape fits; the smallest the [search] "
                           f"levers allow takes {floor:,} bytes (--max-size, or widen [search])")
    chosen = choose(found, s.search.prefer_share)
    budget = budget_of(levers, facts, chosen)
    as_profile = (budget, chosen.emb_rank or 0, chosen.layers) == own and chosen.nonemb + 256 >= profile_target(
        facts, chosen.vocab, chosen.emb_rank, chosen.layers, c.param_share, c.total_share)
    pinned = {"max_param_share": c.param_share, "max_total_share": c.total_share} if as_profile else \
        chosen.settings(facts, budget)
    try:
        ctx.settings.compress = dataclasses.replace(c, max_retries=0, **pinned)
        if max_size is not None:  # the ladder grows the package: capped at the reserve the size budget kept
            ctx.settings.quantize = dataclasses.replace(s.quantize, max_fallback=min(s.quantize.max_fallback,
                                                                                     s.search.reserve_steps))
    except ValueError as e:
        raise EdgekitError(f"[search]: the chosen shape's settings are refused: {e}") from None
    out = record(facts, {"max_size": max_size, "max_latency": max_ms}, found, chosen, time.perf_counter() - t0,
                 latency)
    if s.search.rank_epochs and not {"trim_vocab", "distill"} <= set(ctx.stages):
        log.warning("search.rank_epochs: the stages lack trim_vocab or distill, which the ranking compares; no ranking")
    elif s.search.rank_epochs:  # ranked after the teacher (rank.py), by these settings
        from edgekit.engine.rank import shortlist

        picks = shortlist(found, chosen, s.search.prefer_share, s.search.rank_top)
        # the chosen one as pinned above; the others by their own shape's settings, pinned
        out["shortlist"] = [{"index": found.index(x), "compress": dataclasses.asdict(
            ctx.settings.compress if x is chosen else
            dataclasses.replace(c, max_retries=0, **x.settings(facts, budget_of(levers, facts, x))))} for x in picks]
    return out | {"kept_profile_shape": as_profile}


def budget_of(levers: SearchSettings, facts: Facts, c: Candidate) -> int:
    """The vocabulary budget (a lever's value) that gives the candidate's vocabulary."""
    return next(b for b in levers.vocab_budgets if min(b or facts.task_vocab, facts.task_vocab) == c.vocab)
