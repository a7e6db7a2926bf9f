"""The size search's candidates (edgekit/engine/search.py) and the frontier's points (edgekit/reporting/frontier.py)."""

import pytest

from edgekit.engine.search import (
    Facts,
    SearchSettings,
    candidates,
    choose,
    even_shape,
    fill,
    overhead,
    shape_params,
    smallest,
)
from edgekit.engine.sizes import QuantSpec, StudentShape, package_bytes
from edgekit.reporting.frontier import frontier, points
from tests.conftest import DEMO
from tests.engine.test_sizes import ANDROID_W4, SNIPS, snips_like_labels

MINILM_NONEMB = 10_646_784  # all-MiniLM-L6-v2's six layers


def snips_facts(**kw) -> Facts:
    labels, slots = snips_like_labels()
    quant = QuantSpec(weight4=ANDROID_W4 + ("word_proj",))
    return Facts(labels, 9793, 24, (16,), 6, MINILM_NONEMB, quant, intent_slots=slots, piece_utf8=70_920, **kw)


def size_of(facts: Facts, shape: StudentShape) -> int:
    return package_bytes(shape, facts.quant, facts.labels, facts.max_len, facts.buckets, facts.intent_slots,
                         piece_utf8=facts.piece_utf8)["size_bytes"]


def test_an_even_spread_of_the_pruned_students_parameters_costs_what_its_uneven_shape_costs():
    """The search spreads heads and channels evenly; the prune stage does not. At SNIPS's pruned parameter count the
    two packages differ by a few hundred bytes (of 4 MB)."""
    facts = snips_facts()
    n = shape_params(SNIPS)
    even = even_shape(facts, SNIPS.vocab, None, 4, n)
    assert abs(shape_params(even) - n) < 0.01 * n
    assert abs(size_of(facts, even) - size_of(facts, SNIPS)) < 1_000


@pytest.mark.parametrize("rank", [None, 128])
def test_fill_keeps_the_most_parameters_that_fit_with_the_reserve(rank):
    facts, budget = snips_facts(), 2_000_000
    c = fill(facts, 9793, rank, 4, budget, 1, 100_000, MINILM_NONEMB)
    if rank is None:  # the full 4-bit table alone (2.1 MB) leaves nothing
        assert c is None
        return
    assert c.size_bytes + c.reserve_bytes <= budget and c.reserve_bytes > 0
    assert c.size_bytes == size_of(facts, even_shape(facts, 9793, rank, 4, c.nonemb))
    bigger = even_shape(facts, 9793, rank, 4, int(c.nonemb * 1.02))  # 2% more no longer fits with its reserve
    assert size_of(facts, bigger) + c.reserve_bytes > budget


def test_candidates_fit_the_budget_and_a_budget_below_the_smallest_shape_has_none():
    facts = snips_facts()
    cfg = SearchSettings(vocab_budgets=[0, 6000], embedding_ranks=[0, 128], layers=[4, 3])
    got = candidates(facts, cfg, 2_000_000, 4, param_share=0.3)
    assert got and all(c.size_bytes + c.reserve_bytes <= 2_000_000 for c in got)
    assert {(c.vocab, c.emb_rank) for c in got} >= {(9793, 128), (6000, 128)}
    assert all(c.nonemb <= 0.3 * MINILM_NONEMB for c in got)
    floor = smallest(facts, cfg, 4)
    assert candidates(facts, cfg, floor - 1, 4) == [] and candidates(facts, cfg, floor + 200_000, 4)


def test_a_candidate_stands_for_pinned_compress_settings():
    facts = snips_facts()
    (c,) = candidates(facts, SearchSettings(embedding_ranks=[128]), 2_000_000, 4, param_share=0.3)
    s = c.settings(facts, 0)
    # the prune target counts the LayerNorms and heads too
    assert s["param_share"] == s["max_param_share"] == pytest.approx((c.nonemb + overhead(facts, 4)) / MINILM_NONEMB)
    assert s["embedding_rank"] == 128 and s["prune_layers"] == 2 and s["vocab_budget"] is None


def test_the_first_candidate_that_keeps_its_layers_is_chosen_over_a_whole_table_that_starves_them():
    """CLINC150's 6,070 pieces under 2 MB: the whole table fits only with about a quarter of the layer parameters
    its shape keeps without a budget; the rank-64 table keeps nearly all and is taken. Under 1 MB no SNIPS shape
    keeps half: the first in lever order is taken, as before."""
    labels, slots = snips_like_labels()
    facts = Facts({**labels, "slot_tags": ["O"]}, 6070, 24, (16,), 6, MINILM_NONEMB,
                  QuantSpec(4, 128, weight4=ANDROID_W4 + ("word_proj",)), piece_utf8=45_000)
    found = candidates(facts, SearchSettings(embedding_ranks=[0, 64], reserve_steps=0), 2_000_000, 4, 0.25)
    whole, r64 = found
    assert whole.emb_rank is None and whole.nonemb < 0.3 * whole.unbudgeted and r64.nonemb > 0.9 * r64.unbudgeted
    assert choose(found, 0.5) == r64 and choose(found, 0.2) == whole and choose(found, 1.0) == whole
    small = candidates(snips_facts(), SearchSettings(vocab_budgets=[6000, 4000], embedding_ranks=[64]), 1_000_000, 4,
                       0.25)
    assert all(c.nonemb < 0.5 * c.unbudgeted for c in small) and choose(small, 0.5) == small[0]
    assert choose([], 0.5) is None


@pytest.mark.parametrize("vocab,slots,buckets,chosen", [(9793, True, (16,), (9793, 64)),  # SNIPS
                                                        (6070, False, (16,), (6070, 128)),  # CLINC150
                                                        (1167, True, (16, 24), (1167, None))])  # ATIS
def test_the_android_profile_fits_2mb_with_the_shape_measured_for_each_benchmark(vocab, slots, buckets, chosen):
    """The android profile as shipped (its [limits], [search] and [quantize]): the shapes docs/experiments.md
    measured under 2 MB (2026-12-07). SNIPS takes every piece at rank 64, CLINC150 rank 128 (rank 64 lost
    out-of-scope recall), ATIS the whole table: the first in lever order that keeps 70% of its layer parameters."""
    from edgekit.engine import BuildConfig, resolve

    _, s = resolve(BuildConfig(data="x", out="y", target="android"))
    q = s.quantize
    labels, table = snips_like_labels()
    labels = labels if slots else {**labels, "slot_tags": ["O"]}
    facts = Facts(labels, vocab, 32 if buckets == (16, 24) else 24, buckets, 6, MINILM_NONEMB,
                  QuantSpec(q.embedding_bits, q.embedding_group, weight4=tuple(q.weight4)),
                  intent_slots=table if slots else None, piece_utf8=int(7.2 * vocab))
    found = candidates(facts, s.search, s.limits.max_size, 4, s.compress.param_share, s.compress.total_share)
    taken = choose(found, s.search.prefer_share)
    assert s.limits.max_size == 2_000_000 and (taken.vocab, taken.emb_rank) == chosen
    assert taken.nonemb >= 0.7 * taken.unbudgeted and taken.size_bytes <= 2_000_000
    earlier = found[:found.index(taken)]  # each shape before it in lever order starves its layers
    assert all(c.nonemb < s.search.prefer_share * c.unbudgeted for c in earlier)


@pytest.mark.parametrize("bad", [{"vocab_budgets": [100]}, {"embedding_ranks": [-1]}, {"layers": [0]},
                                 {"min_param_share": 0}, {"reserve_steps": -1},
                                 {"prefer_share": 0}, {"prefer_share": 1.5}, {"layers": "4"},
                                 {"reserve_steps": True}, {"layers": [True]}, {"rank_epochs": -1},
                                 {"rank_top": 1}, {"rank_epochs": 1.5}])
def test_bad_search_settings_are_refused_by_name(bad):
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        SearchSettings(**bad)


def test_the_frontier_draws_what_report_json_holds(tmp_path):
    cands = [{"vocab": 9793, "emb_rank": 128, "layers": 4, "nonemb": 1_156_832, "size_bytes": 1_949_944,
              "dev": {"intent_acc": 0.99, "slot_f1": 0.95}, "p50_ms": 0.9, "p50_ms_model": 0.85, "chosen": True},
             {"vocab": 6000, "emb_rank": None, "layers": 3, "nonemb": 452_268, "size_bytes": 1_972_912,
              "dev": {"intent_acc": 0.98, "slot_f1": 0.93}, "p50_ms": None, "chosen": False},
             {"vocab": 8000, "emb_rank": 96, "layers": 4, "nonemb": 1_686_032, "size_bytes": 1_928_884, "dev": None}]
    rep = {"dataset": {"name": "snips"}, "search": {"limits": {"max_size": 2_000_000}, "candidates": cands}}
    pts = points(rep)
    assert [(p["mb"], p["intent"], p["slot"], p["chosen"]) for p in pts] == [
        (c["size_bytes"] / 1e6, 100 * c["dev"]["intent_acc"], 100 * c["dev"]["slot_f1"], c["chosen"])
        for c in cands[:2]]
    assert [(p["p50_ms"], p["p50_ms_model"]) for p in pts] == [(0.9, 0.85), (None, None)]
    assert frontier(rep, tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert frontier({"search": {"candidates": cands[2:]}}, tmp_path / "none.png") is None


def _prepare(tiny_bert, tmp_path, max_size, search, max_latency=None, compress=None):
    from edgekit.engine import BuildConfig
    from edgekit.engine.runner import prepare

    return prepare(BuildConfig(data=str(DEMO), out=str(tmp_path / "out"), base_model=str(tiny_bert), target="android",
                               settings={"limits": {"max_size": max_size, "max_latency": max_latency},
                                         "search": search, "compress": {"prune_layers": 0, **(compress or {})}}))


def test_a_build_under_a_size_budget_takes_the_first_shape_that_fits_before_any_training(tiny_bert, tmp_path):
    from edgekit.engine.search import _bytes, facts_of
    from edgekit.engine.stages.trim_vocab import corpus
    from edgekit.modeling.pretrained import base_config

    search = {"embedding_ranks": [0, 16, 8], "layers": [2], "min_param_share": 0.1, "reserve_steps": 1}
    roomy = _prepare(tiny_bert, tmp_path, "10MB", search)
    first = roomy.search["candidates"][0]
    assert first["chosen"] and first["emb_rank"] is None and first["layers"] == 2  # the full shape fits 10 MB
    facts = facts_of(roomy.data, roomy.base_tokenizer, base_config(roomy.base_model), roomy.max_len,
                     roomy.length_stats["buckets"], roomy.settings.quantize, roomy.target.runtimes, corpus(roomy))
    # compress.base_words' words are kept beside the task's pieces: the search counts them as trim_vocab keeps them
    # (three utterances: the tiny vocabulary's every word is a task word of the whole corpus)
    few = [facts_of(roomy.data, roomy.base_tokenizer, base_config(roomy.base_model), roomy.max_len,
                    roomy.length_stats["buckets"], roomy.settings.quantize, roomy.target.runtimes, corpus(roomy)[:3],
                    n) for n in (0, 5)]
    assert few[1].task_vocab > few[0].task_vocab and few[1].piece_utf8 > few[0].piece_utf8
    low = int(0.1 * facts.teacher_nonemb)
    full, step = _bytes(facts, even_shape(facts, facts.task_vocab, None, 2, low))
    budget = full + step - 1  # the full table no longer fits at its fewest parameters, with its reserve
    tight = _prepare(tiny_bert, tmp_path, budget, search)
    chosen = next(c for c in tight.search["candidates"] if c["chosen"])
    assert chosen["emb_rank"] == 16 and chosen["layers"] == 2
    assert chosen["size_bytes"] + chosen["reserve_bytes"] <= budget and chosen["nonemb"] >= low
    c = tight.settings.compress
    assert c.embedding_rank == 16 and c.prune_layers == 0 and c.param_share == c.max_param_share
    assert tight.settings.quantize.max_fallback == 1  # the ladder may use the reserve, no more


def test_a_size_budget_no_shape_can_meet_is_refused_before_any_training(tiny_bert, tmp_path):
    from edgekit.errors import EdgekitError

    with pytest.raises(EdgekitError, match=r"no student shape fits; the smallest the \[search\] levers allow takes"):
        _prepare(tiny_bert, tmp_path, "20KB", {"embedding_ranks": [0, 8], "layers": [1]})


def test_an_intent_only_csv_is_searched_under_a_size_budget(tiny_bert, tmp_path):
    """No slot tags: the search sizes a package without slot head or decoding tables, and a budget the full table
    no longer meets with its reserve takes the factorised one."""
    import json

    from edgekit.engine import BuildConfig
    from edgekit.engine.runner import prepare

    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    csv = tmp_path / "intents.csv"
    csv.write_text("text,intent\n" + "".join(f'"{r["text"]}",{r["intent"]}\n' for r in rows))

    def plan(max_size):
        return prepare(BuildConfig(data=str(csv), out=str(tmp_path / "out"), base_model=str(tiny_bert),
                                   target="android", settings={"limits": {"max_size": max_size},
                                                               "search": {"embedding_ranks": [0, 8], "layers": [2],
                                                                          "min_param_share": 0.1},
                                                               "compress": {"prune_layers": 0}}))

    roomy = plan("10MB")
    assert roomy.data.slot_tags == [] and roomy.search["candidates"][0]["chosen"]
    full = roomy.search["candidates"][0]
    assert full["emb_rank"] is None
    tight = plan(full["size_bytes"] - 1)  # the full table at its most parameters no longer fits
    chosen = next(c for c in tight.search["candidates"] if c["chosen"])
    assert chosen["size_bytes"] + chosen["reserve_bytes"] <= full["size_bytes"] - 1
    assert chosen["emb_rank"] == 8 and tight.settings.compress.embedding_rank == 8
    with_slots = _prepare(tiny_bert, tmp_path, "10MB", {"embedding_ranks": [0], "layers": [2],
                                                        "min_param_share": 0.1})
    # the same shape with slots ships a slot head and the decoding tables: more bytes
    assert with_slots.search["candidates"][0]["size_bytes"] > full["size_bytes"]


def test_the_shortlist_is_the_priors_pick_then_the_first_of_each_other_rank_that_keeps_its_share():
    """search.rank_epochs ranks a few shapes, not the whole grid: the prior's pick, then per other embedding rank
    (in lever order) at the pick's vocabulary the first that keeps prefer_share of its layer parameters, else that
    rank's first."""
    from edgekit.engine.rank import shortlist
    from edgekit.engine.search import Candidate

    def cand(vocab, rank, kept):
        return Candidate(vocab, rank, 4, kept, 1_990_000, 0, unbudgeted=100)

    found = [cand(9793, 128, 51), cand(9793, 96, 63), cand(9793, 64, 75), cand(8000, 128, 62), cand(8000, 96, 73),
             cand(6000, None, 19), cand(6000, 128, 76), cand(4000, None, 52)]
    chosen = choose(found, 0.7)
    assert chosen is found[2]
    # the pick's vocabulary only; neither other rank keeps 70% there: each rank's first; no full table at 9,793
    assert shortlist(found, chosen, 0.7, 4) == [found[2], found[0], found[1]]
    assert shortlist(found, chosen, 0.7, 2) == [found[2], found[0]]
    wide = found + [cand(9793, 128, 80), cand(9793, None, 27)]  # e.g. fewer layers at the same rank
    assert shortlist(wide, chosen, 0.7, 4) == [found[2], wide[8], found[1], wide[9]]


def test_the_frontier_draws_brief_distillations_apart_from_the_full_one(tmp_path):
    cands = [{"vocab": 9793, "emb_rank": 64, "layers": 4, "nonemb": 1_972_100, "size_bytes": 1_999_656,
              "dev": {"intent_acc": 0.99, "slot_f1": 0.95}, "brief": {"epochs": 1, "dev": {"intent_acc": 0.97,
                                                                                           "slot_f1": 0.90}},
              "chosen": True},
             {"vocab": 6000, "emb_rank": 128, "layers": 4, "nonemb": 1_990_556, "size_bytes": 1_999_712,
              "brief": {"epochs": 1, "dev": {"intent_acc": 0.96, "slot_f1": 0.89}}, "chosen": False}]
    rep = {"dataset": {"name": "snips"}, "search": {"limits": {"max_size": 2_000_000}, "candidates": cands}}
    pts = points(rep)
    assert [(p["intent"], p["slot"], p["epochs"], p["chosen"]) for p in pts] == [
        (99.0, 95.0, None, True), (97.0, 90.0, 1, False), (96.0, 89.0, 1, False)]
    assert frontier(rep, tmp_path / "frontier.png").read_bytes()[:4] == b"\x89PNG"
