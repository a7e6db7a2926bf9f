"""edgekit's MPNet on the real all-mpnet-base-v2 weights against transformers' MPNetModel (docs/experiments.md).

    pip install -e '.[dev,mpnet]'
    python examples/mpnet_parity.py --data ../shared/data/snips

Both read the same ids: the SNIPS test utterances as the build tokenizes them (the base vocabulary as SentencePiece,
MPNet's specials), right-padded in batches, plus one long input that reaches every relative-position bucket. The
figure is the largest absolute difference of the final hidden states over all real (unpadded) tokens.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from edgekit.data.dataset import load_dataset
from edgekit.modeling.model import gather_embeddings
from edgekit.modeling.pretrained import base_folder, load_pretrained, specials
from edgekit.text.vocab import from_wordpiece
from edgekit.text.wordpiece import WordPieceTokenizer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="../shared/data/snips")
    ap.add_argument("--models", default=None, help="where to assemble the model (default: a temporary folder)")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    from transformers import MPNetModel

    torch.set_num_threads(torch.get_num_threads())
    models = Path(args.models or tempfile.mkdtemp())
    t0 = time.perf_counter()
    folder = base_folder("mpnet", models)
    print(f"all-mpnet-base-v2 at {folder} ({time.perf_counter() - t0:.1f} s)")
    sp = specials(folder)
    wp = WordPieceTokenizer.from_file(folder / "vocab.txt", specials=sp)
    tok, rows = from_wordpiece(wp.vocab, specials=sp)
    ours = load_pretrained(folder, 2, 2).eval()
    gather_embeddings(ours, rows)  # the build's ids: SentencePiece ids -> the base model's rows
    theirs = MPNetModel.from_pretrained(str(folder), use_safetensors=True, add_pooling_layer=False).eval()
    texts = [ex.text for ex in load_dataset(args.data).splits["test"]]
    texts.append(" ".join(texts[:40])[:2000])  # one long input: key-query distances up to about 500
    worst, tokens = 0.0, 0
    for i in range(0, len(texts), args.batch):
        chunk = texts[i: i + args.batch]
        T = min(max(tok.length(t) for t in chunk), ours.cfg.max_positions)
        encs = [tok.encode(t, T) for t in chunk]
        sp_ids = torch.tensor([e.input_ids for e in encs])
        mask = torch.tensor([e.attention_mask for e in encs])
        wp_ids = torch.tensor(rows)[sp_ids]  # the same pieces as MPNet's own ids
        with torch.no_grad():
            a = ours.encode(sp_ids, mask)[-1]  # (B, T, 768)
            b = theirs(input_ids=wp_ids, attention_mask=mask).last_hidden_state  # (B, T, 768)
        real = mask.bool()
        worst = max(worst, (a - b).abs()[real].max().item())
        tokens += int(real.sum())
    print(f"{len(texts)} inputs, {tokens} tokens: max abs difference of the final hidden states {worst:.3e}")


if __name__ == "__main__":
    main()
