"""Length buckets: the runtime runs the shortest exported length that holds the utterance, with inputs cut to it."""

import numpy as np
import pytest
import torch

from edgekit.runtime.backends import Bucketed, fit, open_backend
from edgekit.runtime.interface import word_positions

INTENTS, TAGS = ["play", "stop", "weather"], ["O", "B-a", "I-a", "B-b", "I-b"]
T = 16


class Recorder:
    name = "fake"

    def __init__(self, length):
        self.length, self.seen = length, []

    def run(self, *inputs):
        self.seen.append([a.shape for a in inputs])
        return [np.asarray([self.length])]


def decoded_inputs(n_pieces: int, seed: int = 0) -> list[np.ndarray]:
    """Graph inputs at full length T for an utterance of n_pieces ([CLS] ... [SEP]), one piece per word."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((1, T), np.int64)
    ids[0, :n_pieces] = rng.integers(4, 60, n_pieces)
    mask = np.zeros((1, T), np.int64)
    mask[0, :n_pieces] = 1
    word_index = [-1] + list(range(n_pieces - 2)) + [-1] * (T - n_pieces + 1)
    return [ids, mask, word_positions(word_index).reshape(1, -1), np.ones(len(INTENTS), np.int32), np.asarray([1], np.int32)]


def test_bucketed_picks_the_shortest_length_that_holds_the_utterance_and_cuts_inputs():
    runners = {8: Recorder(8), 12: Recorder(12), T: Recorder(T)}
    b = Bucketed(runners)
    for n, want in ((3, 8), (8, 8), (9, 12), (12, 12), (13, T), (T, T)):
        assert b.run(*decoded_inputs(n))[0][0] == want, n
    assert runners[8].seen[0] == [(1, 8), (1, 8), (1, 6), (3,), (1,)]  # sequences, word positions (T - 2), rest
    assert runners[T].seen[0] == [(1, T), (1, T), (1, T - 2), (3,), (1,)]  # full length: passed as it is


def test_fit_keeps_every_real_piece_and_word_position():
    x = decoded_inputs(7)
    cut = fit(x, 8)
    assert cut[1].sum() == x[1].sum() == 7 and np.array_equal(cut[0][0], x[0][0, :8])
    assert np.array_equal(cut[2][0], x[2][0, :6]) and x[2][0, 6:].sum() == 0  # only padding was cut


@pytest.fixture(scope="module")
def bucketed_pte(tmp_path_factory):
    from edgekit.converters.decoding import DecodingConfig, with_decoding
    from edgekit.converters.export_executorch import ExecuTorchExportConfig, export_executorch
    from edgekit.modeling.model import JointModel, ModelConfig

    torch.manual_seed(0)
    raw = JointModel(ModelConfig(vocab_size=60, hidden=16, heads=[2, 4], ffn=[32, 16], head_dim=4,
                                 n_intents=len(INTENTS), n_slots=len(TAGS))).eval()
    model, _ = with_decoding(raw, DecodingConfig(INTENTS, TAGS))
    path = tmp_path_factory.mktemp("b") / "m.pte"
    checks = [decoded_inputs(n, seed=n) for n in (4, 6, 8, 11, 15)]
    rec = export_executorch(model, ExecuTorchExportConfig(T, (8,)), path, checks)
    return model, path, rec


def test_executorch_export_with_buckets_writes_one_method_per_length_each_checked(bucketed_pte):
    model, path, rec = bucketed_pte
    assert rec.extra["buckets"] == [{"max_len": 8, "method": "forward_8"}, {"max_len": T, "method": "forward"}]
    per = rec.extra["parity"]["buckets"]
    assert per["8"]["n"] == 3 and per[str(T)]["n"] == 5  # the 8-method is checked on the inputs that fit it
    assert rec.extra["parity"]["intent_argmax_agree"] == 1.0 and rec.extra["parity"]["slot_argmax_agree"] == 1.0
    assert not rec.warnings or all("bucket" not in w for w in rec.warnings)


def test_bucketed_package_answers_as_the_full_length_graph(bucketed_pte):
    _, path, rec = bucketed_pte
    full = open_backend("executorch", path)
    both = open_backend("executorch", path, buckets=rec.extra["buckets"])
    assert isinstance(both, Bucketed) and both.lengths == [8, T]
    assert both.threads == full.threads is not None  # ExecuTorch's pool, read back through the buckets too
    for n in (3, 5, 8, 9, 14):
        x = decoded_inputs(n, seed=100 + n)
        a, b = full.run(*x), both.run(*x)
        assert a[0][0] == b[0][0] and abs(a[1][0] - b[1][0]) < 1e-4  # intent, confidence
        assert np.array_equal(a[2][0, : n - 2], b[2][0, : n - 2])  # a tag per word
