"""Shared fixtures: a tiny random BERT checkpoint folder in HF layout, and paths to the shared benchmark data."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one thread each, subprocesses too
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
DEMO = REPO / "examples" / "demo_intents.jsonl"


def oos_csv(folder: Path) -> Path:
    """The demo's utterances with 90 out-of-scope ones (`oos`) of random unrelated words, as an intent-only CSV."""
    import random

    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    rng = random.Random(0)
    words = "quantum bread violin glacier tax poem ladder orbit velvet cactus sermon piston".split()
    oos = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 6))) for _ in range(90)]
    csv = folder / "oos.csv"
    csv.write_text("text,label\n" + "".join(f'"{r["text"]}",{r["intent"]}\n' for r in rows)
                   + "".join(f"{t},oos\n" for t in oos))
    return csv


def need(ok: bool, what: str) -> None:
    """A test that needs what this machine lacks is skipped here and fails in CI: `.ci/run` sets CI and installs
    everything the suite needs (system tools, Node modules, the extras), so there a missing one is a broken
    install, not a reason to test less."""
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"needs {what}")
        pytest.skip(f"needs {what}", allow_module_level=True)


def need_module(name: str, what: str):
    """The module `name`, imported; or need() it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        need(False, what)


def make_vocab(words: list[str]) -> list[str]:
    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    return (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(words)) + chars
            + ["##" + c for c in chars])


def write_tiny_bert(folder: Path, words: list[str], hidden: int = 32, layers: int = 2, heads: int = 4,
                    ffn: int = 64, seed: int = 0) -> Path:
    """A random BERT checkpoint with HF parameter names, as a user's --base-model folder would look."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab = make_vocab(words)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers,
        "intermediate_size": ffn, "vocab_size": len(vocab), "max_position_embeddings": 128,
        "layer_norm_eps": 1e-12, "hidden_act": "gelu", "position_embedding_type": "absolute"}))
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    t = {"embeddings.word_embeddings.weight": r(len(vocab), hidden),
         "embeddings.position_embeddings.weight": r(128, hidden),
         "embeddings.token_type_embeddings.weight": r(2, hidden),
         "embeddings.LayerNorm.weight": torch.ones(hidden), "embeddings.LayerNorm.bias": torch.zeros(hidden)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            t[p + f"attention.self.{n}.weight"], t[p + f"attention.self.{n}.bias"] = r(hidden, hidden), r(hidden)
        t[p + "attention.output.dense.weight"], t[p + "attention.output.dense.bias"] = r(hidden, hidden), r(hidden)
        t[p + "attention.output.LayerNorm.weight"] = torch.ones(hidden)
        t[p + "attention.output.LayerNorm.bias"] = torch.zeros(hidden)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(ffn, hidden), r(ffn)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(hidden, ffn), r(hidden)
        t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"] = torch.ones(hidden), torch.zeros(hidden)
    save_file(t, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    words = [w.lower() for line in DEMO.read_text().splitlines() for w in json.loads(line)["text"].split()]
    return write_tiny_bert(tmp_path_factory.mktemp("tiny_bert"), words)


@pytest.fixture(scope="session", autouse=True)
def stage_cache(tmp_path_factory):
    """Every build in the suite (subprocesses too) uses a cache of its own, never the user's ~/.cache/edgekit."""
    path = tmp_path_factory.mktemp("edgekit_cache")
    old = os.environ.get("EDGEKIT_CACHE")
    os.environ["EDGEKIT_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("EDGEKIT_CACHE", None)
    else:
        os.environ["EDGEKIT_CACHE"] = old


# Test files by their cost in CI (seconds at one thread; measured with `--durations` and junit on 2026-12-05, a 2-core
# AMD EPYC, browser tests included), longest first. With `--dist loadfile --no-loadscope-reorder` (Makefile) the two
# workers take files in this order, so the long ones start first and neither worker idles at the end while the other
# runs a long file.
COST_S = {"test_integration.py": 305, "engine/test_pipeline.py": 285, "serve/test_serve.py": 200,
          "converters/test_quantize.py": 195, "cli/test_cli_fuzz.py": 120, "serve/test_faults.py": 110,
          "cli/test_cli.py": 95, "serve/test_web.py": 85, "engine/test_compress.py": 80,
          "converters/test_optimize_onnx.py": 130, "engine/test_latency.py": 90, "engine/test_strong_teacher.py": 60, "test_repro.py": 75, "test_golden.py": 70, "tools/test_doctor.py": 35,
          "converters/test_decoding.py": 50, "runtime/test_contract.py": 50, "converters/test_export.py": 50,
          "runtime/test_buckets.py": 35, "data/test_readers_fuzzed.py": 30, "runtime/test_package_json.py": 30,
          "runtime/test_package.py": 25, "runtime/test_rules.py": 20}


def pytest_collection_modifyitems(items):
    def cost(item) -> float:
        try:
            return -COST_S.get(Path(item.path).relative_to(REPO / "tests").as_posix(), 0)
        except ValueError:  # a test collected outside tests/
            return 0

    items.sort(key=cost)  # stable: within a file, and among the cheap files, the collected order stays
