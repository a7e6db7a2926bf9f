"""Load a package and answer utterances: tokenize exactly as at build time, run a runtime, decode."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from edgekit.runtime.backends import BACKENDS
from edgekit.runtime.decode import decode
from edgekit.runtime.package import Package
from edgekit.runtime.tokenizer import Encoding, SentencePieceTokenizer, WordPieceTokenizer

log = logging.getLogger("edgekit.runtime")


def load_tokenizer(pkg: Package):
    spec = pkg.manifest["tokenizer"]
    if spec["type"] == "sentencepiece":
        return SentencePieceTokenizer.from_file(pkg.root / spec["file"], lowercase=spec.get("lowercase", True))
    if spec["type"] == "wordpiece":
        return WordPieceTokenizer.from_file(pkg.root / spec["file"], lowercase=spec.get("lowercase", True))
    raise ValueError(f"unknown tokenizer type {spec['type']!r}")


class Predictor:
    """`Predictor.open("build/snips-android").predict("play queen")` -> {"intent", "confidence", "slots"}."""

    def __init__(self, backend, tokenizer, labels: dict, max_len: int):
        self.backend, self.tokenizer, self.labels, self.max_len = backend, tokenizer, labels, max_len

    @classmethod
    def open(cls, package: str | Path | Package, runtime: str = "executorch", threads: int = 1) -> "Predictor":
        """Load a package folder for one runtime (`executorch` or `onnx`)."""
        pkg = package if isinstance(package, Package) else Package.load(package)
        if runtime not in BACKENDS:
            raise ValueError(f"unknown runtime {runtime!r}; choose {', '.join(BACKENDS)}")
        path = pkg.model_path(runtime)
        backend = BACKENDS[runtime](path) if runtime == "executorch" else BACKENDS[runtime](path, threads)
        return cls(backend, load_tokenizer(pkg), pkg.labels, pkg.max_len)

    def encode(self, text: str, warn: bool = True) -> Encoding:
        enc = self.tokenizer.encode(text, self.max_len)
        if enc.truncated and warn:
            log.warning("input has %d pieces, the package takes %d: truncated to the first %d words",
                        self.tokenizer.length(text), self.max_len, enc.n_words_kept)
        return enc

    def run(self, enc: Encoding) -> list[np.ndarray]:
        ids = np.asarray([enc.input_ids], dtype=np.int64)  # (1, T)
        mask = np.asarray([enc.attention_mask], dtype=np.int64)  # (1, T)
        return self.backend.run(ids, mask)

    def predict(self, text: str, warn: bool = True) -> dict:
        enc = self.encode(text, warn)
        return decode(text, enc, self.run(enc), self.labels)

    def latency(self, texts: list[str], warmup: int = 20) -> dict:
        """Single-utterance latency of the model call (tokenize and decode excluded), after warm-up."""
        encs = [self.tokenizer.encode(t, self.max_len) for t in texts]
        for enc in encs[:warmup]:
            self.run(enc)
        times = []
        for enc in encs:
            t0 = time.perf_counter()
            self.run(enc)
            times.append((time.perf_counter() - t0) * 1000)
        return {"p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)), "n": len(times)}
