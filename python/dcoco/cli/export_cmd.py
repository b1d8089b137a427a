"""`dcoco export`: a serving checkpoint rewritten in another dtype, or its drafter alone, or its drafter with a
trained corrector attached, or with a trained DSpark head in the Qwen3 DSpark layout vLLM serves as `method:
"dspark"`, or with a shortlisted draft head (the most frequent response tokens of a corpus), or as the one GGUF
file llama.cpp's DFlash drafter loads."""

from __future__ import annotations

import argparse

from .exits import exits


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", help="a serving checkpoint directory: DFlash, DCOCO, or a drafter trained with a "
                                      "DSpark or Domino head (`dcoco train --method`), rewritten in its own layout")
    p.add_argument("out", help="destination folder (with --format gguf: the .gguf file)")
    p.add_argument("--drafter-only", action="store_true",
                   help="write the plain DFlash checkpoint (the corrector dropped): the same drafter, corrector off")
    p.add_argument("--format", choices=("dflash", "dspark", "gguf"), default="dflash",
                   help="dflash (default): the DFlash/DCOCO layout; dspark: the checkpoint's drafter with the "
                        "DSpark head given by --head, as a Qwen3 DSpark checkpoint (its corrector left out); gguf: "
                        "the drafter (and its corrector, under dcoco.* names) as llama.cpp's DFlash GGUF, with the "
                        "tokenizer of --target's GGUF (docs/llamacpp.md)")
    p.add_argument("--head", help="with --format dspark: a trained DSparkHead, as a safetensors file of its "
                                  "state_dict or a folder with model.safetensors (`dcoco demo`'s dspark stage)")
    p.add_argument("--corrector", help="with --format dflash: attach this trained corrector to the checkpoint's "
                                       "drafter (replacing any): a safetensors file of a dcoco.Corrector's "
                                       "state_dict or a folder with model.safetensors (`dcoco demo`'s corrector "
                                       "and anchor stages)")
    p.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), help="stored dtype (default: as saved)")
    p.add_argument("--draft-vocab", type=int, metavar="N",
                   help="draft over the N most frequent response tokens of --data only (a shortlisted LM head, "
                        "lossless: the target verifies every token); use the N of the drafter's training loss "
                        "(--loss-vocab) and its corpus, which gives the same list")
    p.add_argument("--data", help="with --draft-vocab: the corpus whose response tokens are counted (a `dcoco data "
                                  "generate` folder, e.g. dcoco's shipped python/dcoco/data/smollm2-corpus)")
    p.add_argument("--target", default="smollm2",
                   help="with --draft-vocab: the target whose LM head rows the list takes (%(default)s; loading it "
                        "needs dcoco[demo]); with --format gguf: the target's GGUF file (or a folder with one) "
                        "whose tokenizer the file carries")


def _draft_head(args: argparse.Namespace):
    """The shortlisted head of --draft-vocab over --data's response tokens, rows of --target's LM head."""
    from ..modeling.draft_vocab import DraftHead
    from ..target.features import TokenCorpus
    from ..target.load import load_target
    from ..train import datagen
    from ..train.batches import frequent_tokens

    if args.data is None:
        raise ValueError("--data: --draft-vocab counts the response tokens of a corpus; give its folder")
    if args.draft_vocab < 1:
        raise ValueError(f"--draft-vocab: expected an integer >= 1, got {args.draft_vocab}")
    head = load_target(args.target)[1].get_output_embeddings().weight.detach()
    corpus = TokenCorpus(datagen.load(args.data, head.shape[0]))
    ids = frequent_tokens(corpus, args.draft_vocab)
    if len(ids) < args.draft_vocab:
        raise ValueError(f"--draft-vocab: {args.data} has only {len(ids)} distinct response tokens, fewer than "
                         f"{args.draft_vocab}")
    return DraftHead.from_target(head, ids)


def run(args: argparse.Namespace) -> int:
    from ..modeling import checkpoint

    with exits("dcoco export"):
        dspark = args.format == "dspark"
        if dspark and args.head is None:
            raise ValueError("--head: --format dspark needs the DSpark head to write (a safetensors file or folder)")
        if not dspark and args.head is not None:
            raise ValueError("--head: only read with --format dspark")
        if args.corrector is not None and args.format != "dflash":
            raise ValueError(f"--corrector: attached with --format dflash only; write that checkpoint first, then "
                             f"export it with --format {args.format}")
        if args.format == "gguf" and args.draft_vocab is not None:
            raise ValueError("--draft-vocab: write the shortlisted checkpoint first (dcoco export CKPT DIR "
                             "--draft-vocab N --data DATA), then export DIR with --format gguf")
        if dspark and args.drafter_only:
            raise ValueError("--drafter-only: a DSpark checkpoint never holds a corrector; leave it out with "
                             "--format dspark")
        if args.format == "gguf":
            from ..modeling import llamacpp

            from ..target import smollm2

            target = smollm2.gguf_path() if args.target == "smollm2" else args.target
            print(llamacpp.export(args.checkpoint, args.out, target, args.drafter_only, args.dtype))
            return 0
        draft_head = None if args.draft_vocab is None else _draft_head(args)
        print(checkpoint.export(args.checkpoint, args.out, drafter_only=args.drafter_only, dtype=args.dtype,
                                dspark_head=args.head, draft_head=draft_head, corrector=args.corrector))
    return 0
