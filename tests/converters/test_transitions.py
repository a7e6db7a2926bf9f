import itertools
import math

import pytest
import torch

from edgekit.converters.decoding import intent_slot_table
from edgekit.converters.transitions import FactoredCRF, TransitionConfig, TransitionInputs, fit_transitions
from edgekit.data.dataset import Example, load_dataset
from edgekit.scoring.score import labels_of

from ..conftest import DEMO
from .test_distill import teacher_and_student

TAGS = ["O", "B-a", "I-a", "B-b", "I-b"]


@pytest.mark.parametrize("tags", [TAGS, ["O", "B-a", "I-a", "I-c", "B-b"]])  # I-c without B-c, as in ATIS
def test_crf_likelihood_is_the_path_score_over_every_bio_path(tags):
    """nll = log sum over BIO-valid paths of exp(score) - the gold path's score, by enumeration."""
    g = torch.Generator().manual_seed(0)
    crf = FactoredCRF(tags)
    with torch.no_grad():
        for p in (crf.start, crf.unary, crf.from_b, crf.from_i):
            p.copy_(torch.randn(len(TAGS), generator=g))
    e, gold = torch.randn(1, 4, len(tags), generator=g), [1, 2, 0, tags.index("B-b")]
    trans, start = crf.trans().detach(), (crf.start + crf.start_mask).detach()

    def score(path):
        return float(start[path[0]] + sum(e[0, w, t] + crf.unary[t] for w, t in enumerate(path))
                     + sum(trans[a, b] for a, b in zip(path, path[1:])))

    z = math.log(sum(math.exp(score(p)) for p in itertools.product(range(len(tags)), repeat=4) if score(p) > -1e3))
    got = crf.nll(e, torch.ones(1, 4, dtype=torch.bool), torch.tensor([gold]))
    assert abs(float(got) - (z - score(gold))) < 1e-4
    assert trans[0, 2] < -1e3 and trans[gold[3], 2] < -1e3 and trans[1, 2] > -1e3  # I-a after O or B-b: blocked


def test_fit_lowers_train_nll_and_leaves_out_paths_the_graph_cannot_take():
    data, tok, _, student = teacher_and_student()
    labels = labels_of(data)
    bad = Example(["play", "abba"], data.splits["train"][0].intent, ["O", "I-" + labels["slot_tags"][1][2:]])
    allow = intent_slot_table(data.intents, data.slot_tags, None, len(data.intents) + 1)
    inputs = TransitionInputs(tok, data.splits["train"][:120] + [bad], labels, 32, allow)
    rec = fit_transitions(student, inputs, TransitionConfig(epochs=3, lr=0.1)).record
    x = rec.extra
    assert x["train_nll_after"] < x["train_nll_before"] and x["left_out"] == 1 and x["utterances"] > 0
    assert set(x["transitions"]) == {"start", "unary", "from_b", "from_i"}
    assert all(len(v) == len(data.slot_tags) for v in x["transitions"].values())
    with pytest.raises(ValueError):
        TransitionConfig(l2=-1.0)


def test_decoding_settings_check_the_transition_keys():
    from edgekit.engine.config import DecodingSettings

    assert DecodingSettings().transitions
    with pytest.raises(ValueError, match="transition epochs"):
        DecodingSettings(transition_epochs=-1)
    assert load_dataset(DEMO).slot_tags  # the demo data has slots: its builds fit transitions
