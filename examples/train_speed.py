"""Teacher training speed on this CPU: random vs length-grouped batches, FP32 vs bf16 autocast.

    python examples/train_speed.py ../shared/data/snips --steps 40 [--base-model mpnet] [--grouped-only] [--fp32-only]

Times `steps` optimizer steps of the teacher's loss (MiniLM-L6 or another base model, batch 32) through edgekit's one training loop,
after 5 warm-up steps, and prints milliseconds per step and the pieces actually computed per step (padding included).
Accuracy is not measured here: a full teacher build with `--set teacher.bf16=true` does that (docs/experiments.md).
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from edgekit.data.dataset import load_dataset
from edgekit.engine.cache import default_dir
from edgekit.modeling.model import gather_embeddings
from edgekit.modeling.pretrained import base_folder, load_pretrained, specials
from edgekit.modeling.training import collate, featurize, fit, joint_loss
from edgekit.scoring.score import labels_of
from edgekit.text.vocab import from_wordpiece
from edgekit.text.wordpiece import WordPieceTokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--base-model", default="minilm", help="minilm, mpnet or a folder (edgekit build's --base-model)")
    ap.add_argument("--grouped-only", action="store_true", help="only length-grouped batches (the build's)")
    ap.add_argument("--fp32-only", action="store_true", help="no bf16 run (emulated, and slow, without AVX-512 bf16)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load_dataset(args.data)
    base = base_folder(args.base_model, default_dir() / "models")
    sp = specials(base)
    tok, rows = from_wordpiece(WordPieceTokenizer.from_file(base / "vocab.txt", specials=sp).vocab, specials=sp)
    labels = labels_of(data)
    feats = featurize(data.splits["train"], tok, labels, 128)
    lengths = [len(x) for x in feats.ids]
    print(f"threads {args.threads}, {len(lengths)} train utterances, mean {sum(lengths) / len(lengths):.1f} pieces")
    for grouped in (True,) if args.grouped_only else (False, True):
        for bf16 in (False,) if args.fp32_only else (False, True):
            torch.manual_seed(0)
            model = load_pretrained(base, len(data.intents), len(data.slot_tags))
            gather_embeddings(model, rows)
            pieces = []

            def step_loss(idx):
                ids, mask, intents, slots = collate(feats, idx, tok.pad_id)
                pieces.append(ids.numel())
                return joint_loss(model(ids, mask), intents, slots, 1.0)

            def run(steps):  # one short epoch of the training loop; no evaluation worth the name
                fit(model, [{"params": list(model.parameters())}], len(lengths), step_loss,
                    lambda m: {"intent_acc": 0.0, "slot_f1": None}, epochs=1, batch_size=32, lr=1e-4, warmup=0.1,
                    rng=random.Random(0), lengths=lengths if grouped else None, bf16=bf16, steps_limit=steps,
                    desc="speed")

            run(5)  # warm-up
            pieces.clear()
            t0 = time.perf_counter()
            run(args.steps)
            dt = (time.perf_counter() - t0) / args.steps
            print(f"grouped={grouped!s:5} bf16={bf16!s:5}  {dt * 1000:7.1f} ms/step  "
                  f"{sum(pieces) / len(pieces):7.1f} pieces/step")


if __name__ == "__main__":
    main()
