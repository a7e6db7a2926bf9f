"""Turn model outputs into the package's answer: intent, confidence and word-level slots as text spans."""

from __future__ import annotations

import numpy as np

from edgekit.runtime.package import PackageError
from edgekit.runtime.tokenizer import Encoding

OOS = "oos"  # the reserved intent a package answers when it rejects an utterance as out of scope


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def tag_names(ids, tags: list[str]) -> list[str]:
    """Tag ids the graph answered -> names; an id labels.json has no name for (its slot_tags edited to fewer than
    the graph has) is a PackageError, not an IndexError."""
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < len(tags)]
    if bad:
        raise PackageError(f"labels.json: slot_tags has {len(tags)} names, the graph answered tag id {bad[0]}")
    return [tags[i] for i in ids]


def word_tags(slot_logits: np.ndarray, enc: Encoding, tags: list[str]) -> list[str]:
    """BIO tag per word from (T, S) logits at each word's first piece; words cut by truncation get O."""
    out = ["O"] * len(enc.words)
    for pos, w in enumerate(enc.word_index):
        if w >= 0:
            (out[w],) = tag_names([slot_logits[pos].argmax()], tags)
    return out


def spans(words: list[tuple[str, int, int]], text: str, tags: list[str]) -> list[dict]:
    """Group BIO word tags into slots with the original text's character span (I-x after O opens a slot)."""
    out: list[dict] = []
    cur = None
    for (_, s, e), t in zip(words, tags):
        if t == "O":
            cur = None
            continue
        kind, name = t[:1], t[2:]
        if kind == "I" and out and cur is not None and out[-1]["slot"] == name:
            out[-1]["end"] = e
            out[-1]["value"] = text[out[-1]["start"]:e]
        else:
            out.append({"slot": name, "value": text[s:e], "start": s, "end": e})
        cur = name
    return out


def intent_name(k: int, labels: dict, oos_id: int | None = None, oos_answer: str = OOS) -> str:
    """Intent id -> name (docs/package-format.md R12): 0 <= k < I its name; k = I, the reserved id, `oos_answer`
    when `oos_id` is I (None: I). Any other id is a PackageError, never another intent's name."""
    n = len(labels["intents"])
    if 0 <= k < n:
        return labels["intents"][k]
    if k == n == (n if oos_id is None else oos_id):
        return oos_answer
    raise PackageError(f"labels.json: intents has {n} names (decoding.oos_id {n if oos_id is None else oos_id}), "
                       f"the graph answered intent id {k}")


def decode(text: str, enc: Encoding, outputs: list[np.ndarray], labels: dict, decoded: bool = False,
           oos_id: int | None = None, oos_answer: str = OOS) -> dict:
    """Raw graph: outputs [intent_logits (1, I)] or [intent_logits (1, I), slot_logits (1, T, S)], decoded here
    by argmax. Decoded graph (decoded=True): [intent (1,), confidence (1,)] or [..., tags (1, T)] (schema 4: then
    path_confidence (1,)), final ids, the intent named by `intent_name` (oos_id, oos_answer: the manifest's
    decoding)."""
    if decoded:
        k, conf = int(np.asarray(outputs[0]).reshape(-1)[0]), float(np.asarray(outputs[1]).reshape(-1)[0])
        tags = None
        if len(outputs) > 2:  # word tags for the words that fit; words cut by truncation get O
            ids = np.asarray(outputs[2])[0, : enc.n_words_kept]
            tags = tag_names(ids, labels["slot_tags"]) + ["O"] * (len(enc.words) - enc.n_words_kept)
    else:
        probs = softmax(np.asarray(outputs[0], dtype=np.float64)[0])
        k, conf = int(probs.argmax()), float(probs.max())
        tags = word_tags(outputs[1][0], enc, labels["slot_tags"]) if len(outputs) > 1 else None
    result = {"intent": intent_name(k, labels, oos_id, oos_answer), "confidence": conf,
              "slots": spans(enc.words, text, tags) if tags else []}
    if tags is not None:
        result["tags"] = tags
    if decoded and len(outputs) > 3:  # the whole answer's probability (schema 4): what the cascade escalates on
        result["path_confidence"] = float(np.asarray(outputs[3]).reshape(-1)[0])
    if enc.truncated:  # how much the answer saw: {"chars": read, "words": kept (the last may be cut)}
        result["truncated"] = enc.kept()
    return result
