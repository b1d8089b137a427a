"""Regenerates python/dcoco/data/smollm2-corpus.npz, the token ids of the demo's training corpus: SmolLM2-135M's
own greedy responses (at most 128 new tokens) to the prompts shipped with dcoco and to rows of the paper's
suites shipped in python/dcoco/data/suites that the demo never evaluates (demo.training_prompts). Only ids ship:
the demo recomputes features and labels on the machine it runs on.

    python scripts/make_demo_corpus.py [--reuse CORPUS_DIR]   # about 30 min on 2 CPU cores

--reuse: a `dcoco train` corpus cache directory whose sequences are taken as they are (same target and
generation settings), so that only the prompts it lacks are generated.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dcoco.target import corpus, smollm2
from dcoco.cli import demo
from dcoco.suites import default_suites


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="python/dcoco/data/smollm2-corpus.npz")
    ap.add_argument("--reuse")
    args = ap.parse_args()
    tok, model = smollm2.load()
    ids = corpus.encode_prompts(tok, demo.training_prompts(default_suites()), max_tokens=300)
    have = {}
    if args.reuse:
        c = corpus.Corpus(args.reuse)
        for i in range(len(c)):
            s = c[i]
            n = int((~s["response"]).sum())
            have[tuple(s["ids"][:n].tolist())] = s["ids"][n:].tolist()
    todo = [p for p in ids if tuple(p) not in have]
    print(f"{len(ids)} prompts within 300 tokens, {len(ids) - len(todo)} reused, {len(todo)} to generate")
    t = time.time()
    settings = corpus.CorpusSettings((0,), max_new_tokens=128, gen_batch=32)
    eos = corpus.token_ids(model.generation_config.eos_token_id)
    have.update({tuple(p): r for p, r in corpus.generate(model, todo, settings, eos)})
    seqs = [(p, have[tuple(p)]) for p in ids]
    print(f"{sum(len(r) for _, r in seqs)} response tokens ({time.time() - t:.0f} s)")
    flat = np.array([t for p, r in seqs for t in p + r], dtype=np.uint16)
    np.savez_compressed(args.out, ids=flat, prompt_lengths=np.array([len(p) for p, _ in seqs], dtype=np.int32),
                        lengths=np.array([len(p) + len(r) for p, r in seqs], dtype=np.int32))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
