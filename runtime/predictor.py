"""Load a package and answer utterances: tokenize exactly as at build time, run a runtime, decode."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from edgekit.runtime.arguments import (  # noqa: F401 (re-exported: the contract's checks, by their old home)
    MAX_THREADS,
    MAX_TIMEOUT_S,
    batch_allow,
    batch_reject,
    check_bool,
    check_names,
    check_number,
    check_open,
    is_list,
    shown,
)
from edgekit.runtime.backends import open_backend
from edgekit.runtime.cascade import DEFAULT_TIMEOUT_S, Fallback
from edgekit.runtime.decode import OOS, decode
from edgekit.runtime.interface import model_inputs, row, stack
from edgekit.runtime.latency import summary
from edgekit.runtime.package import Package, PackageError
from edgekit.runtime.tokenizer import Encoding, InputError, SentencePieceTokenizer

log = logging.getLogger("edgekit.runtime")


def load_tokenizer(pkg: Package) -> SentencePieceTokenizer:
    """The package's tokenizer.model, from its held bytes where the package has them (its normalizer does all
    pre-tokenization; the manifest's schema has checked the type). A model SentencePiece cannot load (a damaged
    normalizer table whose sha256 was recomputed) is a PackageError."""
    from google.protobuf.message import DecodeError

    spec = pkg.manifest["tokenizer"]
    held = pkg.held.get(spec["file"])
    try:
        tok = SentencePieceTokenizer(held, spec["lowercase"]) if held is not None else \
            SentencePieceTokenizer.from_file(pkg.root / spec["file"], lowercase=spec["lowercase"])
        normalizer = tok.normalizer  # the model parsed once, here: its errors are the package's too
    except (RuntimeError, OSError, ValueError, DecodeError) as e:
        raise PackageError(f"{pkg.root / spec['file']}: SentencePiece cannot load it ({str(e).strip()[:200]})") \
            from None
    if normalizer != spec["normalizer"]:  # e.g. a model without the compiled pre-tokenizer: other ids, silently
        raise PackageError(f"{pkg.root / spec['file']}: normalizer {normalizer!r}, the manifest's "
                           f"tokenizer.normalizer says {spec['normalizer']!r}")
    if tok.special_ids != spec["special_ids"]:
        raise PackageError(f"{pkg.root / spec['file']}: special ids {tok.special_ids}, the manifest's "
                           f"tokenizer.special_ids says {spec['special_ids']}")
    return tok


def _has(provider: str) -> bool:
    import onnxruntime as ort

    return provider in ort.get_available_providers()


def run_model(m: dict, runtime: str, providers: list[str] | None = None, root: str | Path = "") -> str:
    """The model file an open of `runtime` runs (a checked manifest's name for it): the runtime's, or for ONNX
    Runtime with TensorRT first the package's unfused FP32 graph (`tensorrt_model`), which TensorRT parses."""
    models = m["models"]
    if runtime not in models:
        raise PackageError(f"{root}: no model for runtime {runtime!r} (has {', '.join(models)})")
    names = providers or (m.get("serve") or {}).get("providers") or ["cpu"]
    if runtime == "onnx" and names[0] == "tensorrt" and m.get("tensorrt_model") and _has("TensorrtExecutionProvider"):
        return m["tensorrt_model"]
    return models[runtime]


def onnx_options(pkg: Package, providers: list[str] | None = None) -> dict:
    """ONNX Runtime's session settings for a package's graphs: providers by short name, in order (default: the
    package's, else CPU), with what their options need (the serve table, lengths, the dynamic sequence axis), and
    the graph optimizers the build left out on purpose."""
    serve = pkg.manifest.get("serve") or {}
    return {"providers": providers or serve.get("providers") or ["cpu"], "serve": serve, "max_len": pkg.max_len,
            "n_intents": len(pkg.labels["intents"]), "dynamic_seq": pkg.dynamic_seq,
            "disabled_optimizers": pkg.onnx_disabled_optimizers}


def check_answerable(name: str, names: list[str], answerable: set[str] | None) -> None:
    """ValueError when an allow list names no intent the graph can choose (docs/package-format.md R14; answerable
    None: every intent). `edgekit serve` checks a request's list with it too."""
    if answerable is not None and answerable.isdisjoint(names):
        raise ValueError(f"{name}: none of {shown(names)} can be answered by this package (decoding.allowed_intents)")


class Predictor:
    """`Predictor.open("build/snips-android").predict("play queen")` -> {"intent", "confidence", "slots", "tags",
    "path_confidence"} (the last two with slots)."""

    def __init__(self, backend, tokenizer, labels: dict, max_len: int, decoding: bool = False, batched: bool = False,
                 fallback: Fallback | None = None, oos_answer: str | None = None, mask_dtype: str = "int32",
                 oos_id: int | None = None, answerable: list[str] | None = None):
        self.backend, self.tokenizer, self.labels, self.max_len = backend, tokenizer, labels, max_len
        # what a rejection and an utterance that says nothing answer: the manifest's decoding.oos_answer (R13)
        self.oos_answer = oos_answer or labels.get("oos_label") or OOS
        self.oos_id = len(labels["intents"]) if oos_id is None else oos_id  # the manifest's decoding.oos_id
        self.mask_dtype = mask_dtype  # intent_mask and reject: int32, or bool in a schema 2 package
        self.answerable = None if answerable is None else set(answerable)  # G (R14); None: every intent
        self.decoding = decoding  # the graph decodes (intent mask, rejection, Viterbi) and returns final ids
        self.batched = batched  # the graph has a dynamic batch axis (server profiles)
        self.fallback = fallback  # device first, a server when unsure (runtime/cascade.py)
        self.path_score = False  # the graph answers path_confidence (schema 4 with slots)
        self.outputs: list[str] | None = None  # the manifest's outputs, which every call's must match in number

    @classmethod
    def open(cls, package: str | Path | Package, runtime: str = "executorch", threads: int | None = None,
             providers: list[str] | None = None, digest: str | None = None, fallback_url: str | None = None,
             escalate_below: float | None = None, fallback_timeout_s: float | None = None,
             spin: bool = True) -> "Predictor":
        """Load a package folder for one runtime (`executorch` or `onnx`). providers: ONNX Runtime execution
        providers by short name, in order (default: the package's, else CPU); `provider` says which runs.
        digest: the sha256 of the manifest the app was tested with; any other package is refused.
        fallback_url: an `edgekit serve` server that answers when the device answer's score (the manifest's
        `cascade.score`: `path_confidence`, or `confidence`) is below `escalate_below` (default: the manifest's
        `cascade.threshold`) within `fallback_timeout_s` (default:
        the manifest's `cascade.timeout_s`); answers then carry `escalated` (and `fallback` when the server
        could not answer; an utterance that says nothing is never escalated). spin: ONNX Runtime's threads spin-wait
        between calls (off on a shared server). A wrong type is a TypeError, a bad value a ValueError, naming the
        parameter; a package that cannot be used is a PackageError.

        The model, tokenizer and labels are read into memory once, checked there (size, sha256, the package's
        rules), and the runtimes load those bytes: a file changed or swapped later changes no answer.
        threads: ONNX Runtime's intra-op threads (None: 1); ExecuTorch's pool is process-wide (`threads`): None keeps
        it as it is (1 at the first load), a count it does not hold is a ValueError once a program is loaded."""
        providers = check_open(package, runtime, threads, providers, digest, fallback_url, spin)
        check_number("escalate_below", escalate_below, 0, 1)
        check_number("fallback_timeout_s", fallback_timeout_s, 0, MAX_TIMEOUT_S, low_open=True)

        root = package.root if isinstance(package, Package) else package

        def runs(m: dict) -> list[str]:  # the files this open runs from: read once, checked, then used as read
            return [run_model(m, runtime, providers, root), m["tokenizer"]["file"], m["labels"]]

        if isinstance(package, Package):
            if digest is not None and package.digest != digest.removeprefix("sha256:").lower():
                raise PackageError(f"{package.root}: package digest sha256:{package.digest} is not the pinned {digest}")
            pkg = package.holding(runs)  # each file checked again, on the bytes that will run, against the pin
        else:
            pkg = Package.load(package, digest=digest, hold=runs)
        model, onnx = run_model(pkg.manifest, runtime, providers), {}
        if runtime == "onnx":
            onnx = onnx_options(pkg, providers) | {"spin": spin}
        fallback = None
        if fallback_url is not None:
            cas = pkg.manifest.get("cascade") or {}
            tau = escalate_below if escalate_below is not None else cas.get("threshold")
            if tau is None:
                raise ValueError(f"{pkg.root}: the manifest has no cascade.threshold (edgekit compare DEVICE SERVER "
                                 "--data DATA calibrates one); give a threshold: escalate_below, --escalate-below on "
                                 "the command line")
            fallback = Fallback(fallback_url, float(tau), float(fallback_timeout_s or cas.get("timeout_s")
                                                                or DEFAULT_TIMEOUT_S), cas.get("score", "confidence"))
        backend = open_backend(runtime, pkg.held[model], threads, pkg.buckets(runtime), file=model, **onnx)
        dec = pkg.manifest["decoding"]
        pred = cls(backend, load_tokenizer(pkg), pkg.labels, pkg.max_len, True, pkg.batched, fallback,
                   dec["oos_answer"], pkg.mask_dtype, dec["oos_id"], pkg.answerable)
        pred.path_score = "path_confidence" in pkg.manifest["outputs"]
        pred.outputs = pkg.manifest["outputs"]
        return pred

    @property
    def threads(self) -> int | None:
        """The threads the runtime runs this model on, as it reports them (ExecuTorch: its process-wide pool)."""
        return getattr(self.backend, "threads", None)

    @property
    def provider(self) -> str:
        """The execution provider that runs the model (ExecuTorch: "xnnpack")."""
        return getattr(self.backend, "provider", "xnnpack")

    def intent_mask(self, allow: list[str] | None) -> np.ndarray | None:
        """Names -> the `intent_mask` input (None: all intents allowed); see `allowed`."""
        return self.allowed(allow)[1]

    def allowed(self, allow, name: str = "allow_intents") -> tuple[list[str] | None, np.ndarray | None]:
        """allow_intents checked -> (the names, read once from any iterable; the `intent_mask` input). None: every
        intent, no mask."""
        names = check_names(name, allow)
        if names is None:
            return None, None
        if not names:
            raise ValueError(f"{name}: give a non-empty list of intent names (None allows every intent)")
        if not self.decoding:
            raise ValueError(f"{name}: this package's graph has no intent_mask input (built without decoding)")
        intents = self.labels["intents"]
        unknown = [a for a in names if a not in intents]
        if unknown:
            raise ValueError(f"{name}: unknown intent {shown(unknown[0])}; the package knows: {', '.join(intents)}")
        check_answerable(name, names, self.answerable)
        return names, np.asarray([i in names for i in intents], dtype=bool)

    def encode(self, text: str, warn: bool = True) -> Encoding:
        """Tokenize as at build time; raises InputError (a ValueError) on text that is not a valid str."""
        enc = self.tokenizer.encode(text, self.max_len)
        if enc.truncated and warn:
            log.warning("input truncated to the package's %d pieces: the model saw its first %d words (up to "
                        "character %d of %d)", self.max_len, enc.n_words_kept, enc.chars_read, len(text))
        return enc

    def inputs(self, enc: Encoding, intent_mask: np.ndarray | None = None, reject: bool = True) -> list[np.ndarray]:
        return model_inputs(enc, len(self.labels["intents"]), self.decoding, intent_mask, reject, self.batched,
                            self.mask_dtype)

    def run(self, enc: Encoding, intent_mask: np.ndarray | None = None, reject: bool = True) -> list[np.ndarray]:
        return self.call(*self.inputs(enc, intent_mask, reject))

    def call(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """One model call; a graph that answers other than the manifest's outputs (a `.pte` whose outputs are not
        checked on load) is a PackageError, not a misread answer."""
        out = self.backend.run(*inputs)
        if self.outputs is not None and len(out) != len(self.outputs):
            raise PackageError(f"{getattr(self.backend, 'file', 'the model')}: the graph answered {len(out)} "
                               f"outputs, the manifest's outputs say {self.outputs}")
        return out

    def predict(self, text: str, warn: bool = True, allow_intents: list[str] | None = None,
                reject: bool = True) -> dict:
        """Answer one utterance. allow_intents restricts the answer to those intents (the confidence is
        renormalised over them); reject=False turns out-of-scope rejection off. With a fallback server, an unsure
        answer is escalated (see `open`). Checked before the model runs: text not a valid str is an InputError;
        warn and reject must be bools, allow_intents None or a non-empty iterable of the package's intent names."""
        enc = self.encode(text, check_bool("warn", warn))
        names, mask = self.allowed(allow_intents)
        return self.answer(text, enc, names, mask, check_bool("reject", reject))

    def answer(self, text: str, enc: Encoding, names: list[str] | None, mask: np.ndarray | None,
               reject: bool) -> dict:
        """One utterance's answer, its arguments already checked (predict)."""
        if enc.empty:  # nothing to answer: no model call, no server asked
            return self.no_words(enc) | ({"escalated": False} if self.fallback else {})
        ans = decode(text, enc, self.run(enc, mask, reject), self.labels, self.decoding, self.oos_id, self.oos_answer)
        return self.fallback.answer(ans, text, names, reject) if self.fallback else ans

    def no_words(self, enc: Encoding) -> dict:
        """The answer to an utterance that says nothing (`enc.empty`: empty, separators only, words past the read
        limit only, or words of zero-width and control characters only): the package's out-of-scope answer,
        confidence 0, no slots, "O" for each word read. The graph would answer [CLS] [SEP] alone with one of the
        intents, and confidently (SNIPS: 0.73), and a zero-width space ([CLS] [unk] [SEP]) with 0.56, a slot on
        it too, though nothing was said."""
        ans = {"intent": self.oos_answer, "confidence": 0.0, "slots": []}
        if self.labels.get("slot_tags"):
            ans["tags"] = ["O"] * len(enc.words)
        if self.path_score:
            ans["path_confidence"] = 0.0
        if enc.truncated:  # separators past the length limit, and a word after them
            ans["truncated"] = enc.kept()
        return ans

    def predict_batch(self, texts: list[str], allow_intents: list[list[str] | None] | None = None,
                      reject: list[bool] | bool = True, warn: bool = False) -> list[dict]:
        """Answer several utterances, each with its own options; one model call on a batched graph, one call
        per utterance otherwise. Same answers as `predict` on each. texts: a list (or any iterable, not a str) of
        str. allow_intents: None, one list of intent names for all, or one entry (None or a list of names) per
        text. reject: one bool for all, or one per text. Every argument is checked before any model call."""
        if not is_list(texts):
            raise TypeError(f"texts: expected a list of str, got {shown(texts)}")
        texts, warn = list(texts), check_bool("warn", warn)
        encs = [self.encode_row(k, t, warn) for k, t in enumerate(texts)]
        n = len(texts)
        shared, allow = batch_allow(allow_intents, n)
        if shared is not None:  # one list for all: checked once
            opts = [self.allowed(shared)] * n
        else:  # every row's options checked, words or not
            opts = [self.allowed(a, f"allow_intents[{k}]") for k, a in enumerate(allow)]
        rej = batch_reject(reject, n)
        if not self.batched:
            return [self.answer(t, e, *o, r) for t, e, o, r in zip(texts, encs, opts, rej)]
        run = [i for i, e in enumerate(encs) if not e.empty]  # the rows the model answers, in order
        out = self.call(*stack([self.inputs(encs[i], opts[i][1], rej[i]) for i in run])) if run else None
        k = iter(range(len(run)))
        return [self.no_words(e) if e.empty else decode(t, e, row(out, next(k)), self.labels, self.decoding,
                                                         self.oos_id, self.oos_answer)
                for t, e in zip(texts, encs)]

    def encode_row(self, k: int, text: str, warn: bool) -> Encoding:
        """texts[k] encoded; its InputError names the row."""
        try:
            return self.encode(text, warn)
        except InputError as e:
            raise InputError(f"texts[{k}]: {e}") from None

    def latency(self, texts: list[str], warmup: int = 20) -> dict:
        """Single-utterance latency of the model call (tokenize and decode excluded), after warm-up."""
        inputs = [self.inputs(self.tokenizer.encode(t, self.max_len)) for t in texts]
        for x in inputs[:warmup]:
            self.backend.run(*x)
        times = []
        for x in inputs:
            t0 = time.perf_counter()
            self.backend.run(*x)
            times.append((time.perf_counter() - t0) * 1000)
        return summary(times)


def paired_latency(a: Predictor, b: Predictor, texts: list[str], rounds: int = 3, warmup: int = 20,
                   block: int = 1) -> tuple[dict, dict]:
    """Latency of two predictors measured in alternation (see alternating_latency)."""
    return tuple(alternating_latency([a, b], texts, rounds, warmup, block))


def alternating_latency(preds: list[Predictor], texts: list[str], rounds: int = 3, warmup: int = 20,
                        block: int = 1) -> list[dict]:
    """Latency of several predictors measured in alternation (order reversed every other block), so that all
    see the same machine state; a shared CPU drifts by more than the differences being measured. block=1
    alternates utterance by utterance (graphs of one model); a larger block runs that many utterances of one
    before the next, so that a small model is not timed with its caches just flushed by a big one (package
    against teacher)."""
    xs = [[p.inputs(p.tokenizer.encode(t, p.max_len)) for t in texts] for p in preds]
    for k in range(min(warmup, len(texts))):
        for p, x in zip(preds, xs):
            p.backend.run(*x[k])
    times: list[list[float]] = [[] for _ in preds]
    order = list(range(len(preds)))
    for r in range(rounds):
        for s in range(0, len(texts), block):
            for j in (order if (s // block + r) % 2 == 0 else order[::-1]):
                for k in range(s, min(s + block, len(texts))):
                    t0 = time.perf_counter()
                    preds[j].backend.run(*xs[j][k])
                    times[j].append((time.perf_counter() - t0) * 1000)
    return [summary(t) for t in times]
