"""Ranking the size search's shortlist by brief distillation (edgekit/engine/rank.py, `search.rank_epochs`): a tiny
build through android's stages (fuse aside)."""

import pytest

from edgekit.engine import BuildConfig, build
from edgekit.engine.gating import BudgetMissed
from edgekit.engine.gating import past_budget as excess
from edgekit.engine.rank import score, winner
from edgekit.reporting.frontier import points
from tests.conftest import DEMO


def _settings(rank_epochs=1, **budget):
    return {"teacher": {"epochs": 1, "batch_size": 16, "lr": 5e-3, "head_lr": 1e-2}, "distill": {"epochs": 2},
            "compress": {"total_share": 1.0, "param_share": 0.5, "max_param_share": 0.5, "max_total_share": 1.0,
                         "prune_layers": 0},
            "budget": {"intent_drop_pts": 100.0, "slot_f1_drop_pts": 100.0, **budget},
            "package": {"bench_utterances": 0}, "decoding": {"compare_argmax": False},
            "limits": {"max_size": "10MB"},
            "search": {"embedding_ranks": [0, 16, 8], "layers": [2], "min_param_share": 0.1, "rank_epochs": rank_epochs,
                       "rank_top": 3}}


def _config(tmp_path, tiny_bert, **kw) -> BuildConfig:
    return BuildConfig(data=str(DEMO), out=str(tmp_path / "o"), base_model=str(tiny_bert), target="android",
                       stages=["teacher", "trim_vocab", "prune", "distill", "quantize", "export", "package"], **kw)


def test_a_brief_distillation_ranks_the_shortlist_and_the_build_goes_on_with_the_winner(tmp_path, tiny_bert):
    rep = build(_config(tmp_path, tiny_bert, settings=_settings()))
    s = rep["search"]
    ranked, short = s["ranking"]["candidates"], s["shortlist"]
    assert [r["index"] for r in ranked] == [p["index"] for p in short] and len(short) == 3  # one pick a rank
    assert {s["candidates"][p["index"]]["emb_rank"] for p in short} == {None, 16, 8}
    for r in ranked:  # each candidate scored as the gate weighs its drops
        assert r["score"] == round(score(r["drops"], rep["budget"]), 4) and r["dev"]["n"] > 0
        assert r["excess"] == round(excess(r["drops"], rep["budget"]), 4) == 0  # a budget of 100 points
        assert s["candidates"][r["index"]]["brief"] == {"epochs": 1, "dev": r["dev"], "score": r["score"]}
    win = winner(ranked)
    assert s["ranking"]["winner"] == short[win]["index"] and s["ranking"]["prior"] == short[0]["index"]
    assert [i for i, c in enumerate(s["candidates"]) if c["chosen"]] == [short[win]["index"]]
    # the build went on with the winner's settings: its trim and prune are the ranking's (reused), its
    # distillation the full one (2 epochs), new
    assert rep["config"]["settings"]["compress"] == short[win]["compress"]
    stages = {st["name"]: st for st in rep["stages"]}
    assert stages["trim_vocab"]["reused"] and stages["prune"]["reused"] and not stages["distill"]["reused"]
    assert rep["config"]["settings"]["distill"]["epochs"] == 2
    brief = [p for p in points(rep) if p["epochs"] == 1]
    assert len(brief) == 3 and not any(p["chosen"] for p in brief)
    md = (tmp_path / "o" / "report.md").read_text()
    assert "Size search ranked by 1-epoch distillation" in md and f"score {ranked[win]['score']:.3f}" in md


def test_a_candidate_within_the_budget_outranks_one_past_it_whatever_their_scores():
    budget = {"intent_drop_pts": 0.5, "slot_f1_drop_pts": 1.0}
    within, past = {"intent_drop_pts": 0.4, "slot_f1_drop_pts": 0.9}, {"intent_drop_pts": 0.0, "slot_f1_drop_pts": 1.2}
    rows = [{"excess": excess(d, budget), "score": score(d, budget)} for d in (past, within)]
    assert rows[0]["score"] < rows[1]["score"] and rows[0]["excess"] > 0 == rows[1]["excess"]
    assert winner(rows) == 1
    assert winner([rows[1], dict(rows[1])]) == 0  # a tie keeps the earlier: the prior's pick comes first


def test_a_gate_miss_under_a_size_budget_says_the_budget_pinned_the_student(tmp_path, tiny_bert):
    """The search pins the student's shape under a size budget (no back-off): a miss says so, and how to grow."""
    with pytest.raises(BudgetMissed) as e:
        build(_config(tmp_path, tiny_bert, settings=_settings(rank_epochs=0, intent_drop_pts=-100.0), strict=True))
    msg = str(e.value)
    assert msg.startswith("stage trim_vocab: dev accuracy budget") and e.value.exit_code == 3
    assert "the 10,000,000-byte size budget (limits.max_size) fixed the student's shape" in msg, msg
    assert "--max-size none lets it grow" in msg
