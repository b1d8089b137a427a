"""`dcoco train`: its options, TOML recipes with stages, and the checks before any stage runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def arguments(p: argparse.ArgumentParser) -> None:
    from ..train.config import TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("what to train")
    g.add_argument("--config", help="a TOML recipe: any of these options as keys (e.g. max_new_tokens = 1024), and "
                                    "optionally [[stages]] run in order, each starting from the one before; flags "
                                    "given here override the file (recipes/ has examples)")
    g.add_argument("--mode", choices=("drafter", "corrector", "joint"), default=d.mode,
                   help="drafter: DFlash loss; corrector: L_corr on a frozen drafter (needs --init); joint: both "
                        "(default: %(default)s)")
    g.add_argument("--out", default=d.out,
                   help="checkpoint directory: serving layout, train_state.pt, log.jsonl (default: %(default)s)")
    g.add_argument("--init", help="DFlash or DCOCO checkpoint to start from")
    g.add_argument("--resume", action="store_true", help="continue the run saved in --out (its settings must match)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace a run already in --out (without --resume or --overwrite such an --out is refused)")
    g = p.add_argument_group("target and corpus")
    g.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded, the default) or a transformers causal LM path")
    g.add_argument("--prompts", help="JSONL of {\"prompt\": ...} lines (default: the set shipped with dcoco)")
    g.add_argument("--data", help="`dcoco data generate`'s output folder: train on those samples (token ids) "
                                  "instead of generating answers here (--prompts is then unused)")
    g.add_argument("--cache-dir", help="corpus cache (default: $DCOCO_CACHE/corpus or ~/.cache/dcoco/corpus)")
    g.add_argument("--max-prompt-tokens", type=int, default=300, help="longer prompts are dropped (%(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="response length cap (%(default)s)")
    g.add_argument("--gen-batch", type=int, default=16, help="generation batch (%(default)s)")
    g.add_argument("--feat-batch", type=int, default=8, help="feature-pass batch (%(default)s)")
    g.add_argument("--features", choices=("auto", "cache", "online"), default="auto",
                   help="online: the frozen target runs on every batch (no feature cache; each rank its share); "
                        "cache: a feature cache built first; auto: online on CUDA, a cache on a CPU (%(default)s)")
    g.add_argument("--shard-target", action="store_true",
                   help="shard the online target over the torchrun ranks (FSDP2, one unit per layer); needs --data")
    g.add_argument("--thinking", action="store_true",
                   help="thinking on in the chat template (enable_thinking; off by default, as DFlash drafters are)")
    g = p.add_argument_group("new drafter (ignored with --init)")
    g.add_argument("--layers", type=int, default=2, help="drafter layers (%(default)s)")
    g.add_argument("--target-layers", type=_ints,
                   help="target taps, e.g. 1,15,27 (default: smollm2 1,15,27, else 3 evenly spaced)")
    g.add_argument("--block-size", type=int, default=16, help="anchor + drafted slots (%(default)s)")
    g.add_argument("--mask-token-id", type=int, help="default: the tokenizer's mask, else the first spare row "
                                                     "(smollm2: 16)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=d.epochs, help="(%(default)s)")
    g.add_argument("--steps", type=int, help="schedule length (default: epochs x steps per epoch)")
    g.add_argument("--stop-at", type=int, help="stop after this global step (resumable; schedule unchanged)")
    g.add_argument("--max-time", type=float, help="stop after this many seconds (resumable; schedule unchanged)")
    g.add_argument("--seqs-per-step", type=int, default=d.seqs_per_step,
                   help="sequences per micro-batch per rank (%(default)s)")
    g.add_argument("--grad-accum", type=int, default=d.grad_accum,
                   help="micro-batches per optimizer step (%(default)s)")
    g.add_argument("--anchors", type=int, help="anchors per sequence, at most (default: 512 on CUDA, 32 on a CPU)")
    g.add_argument("--lr", type=float, default=d.lr, help="AdamW, cosine schedule (%(default)s)")
    g.add_argument("--warmup", type=float, default=d.warmup, help="warmup fraction (%(default)s)")
    g.add_argument("--candidates", type=int, default=d.num_candidates, help="K (%(default)s)")
    g.add_argument("--width", type=int, default=d.width, help="corrector width r (%(default)s)")
    g.add_argument("--mlp-hidden", type=int, default=d.mlp_hidden, help="corrector MLP width (%(default)s)")
    g.add_argument("--corr-grad", type=float, default=d.corr_grad,
                   help="joint: weight of L_corr's gradient into the drafter; 0 trains the drafter on the DFlash "
                        "loss alone while the corrector learns on it (%(default)s: the paper's sum)")
    g.add_argument("--loss-vocab", type=int,
                   help="drafter mode: the DFlash loss over the corpus's N most frequent response tokens plus each "
                        "batch's labels instead of the whole vocabulary (a cheaper step; default: all of it)")
    g.add_argument("--seed", type=int, default=d.seed, help="(%(default)s)")
    g.add_argument("--save-every", type=int, default=d.save_every, help="steps between checkpoints (%(default)s)")
    g.add_argument("--log-every", type=int, default=d.log_every, help="steps per printed summary (%(default)s)")
    g.add_argument("--eval-sequences", type=int, default=d.eval_sequences,
                   help="corpus sequences held out; their teacher-forced tau goes to eval.jsonl (%(default)s)")
    g.add_argument("--eval-every", type=int, help="steps between held-out evaluations (default: --save-every)")
    g.add_argument("--device", default=d.device, help="auto: cuda:LOCAL_RANK when available, else cpu")
    g = p.add_argument_group("memory and runs")
    g.add_argument("--logit-chunk", type=int, help="rows per LM-head chunk for the loss and top-K (default: 256 MB "
                                                   "of float32 logits per chunk)")
    g.add_argument("--grad-checkpoint", action="store_true",
                   help="recompute the drafter layers' activations in backward: less memory, about 1/3 more compute")
    g.add_argument("--save-dtype", choices=("bfloat16", "float16", "float32"), default=d.save_dtype,
                   help="the serving checkpoint's dtype; train_state.pt keeps float32 (%(default)s)")
    g.add_argument("--dist-timeout", type=float, default=d.dist_timeout,
                   help="minutes a torchrun collective may wait (%(default)s)")
    g.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("memory plan (--dry-run: print it and exit; no weights are loaded)")
    g.add_argument("--dry-run", action="store_true", help="print the per-rank memory plan of this configuration")
    g.add_argument("--world-size", type=int, help="ranks to plan for (default: WORLD_SIZE, else 1)")
    g.add_argument("--gpu-memory", type=float, help="GiB per GPU to plan for (default: this machine's GPU)")
    g.add_argument("--plan-json", help="also write the plan of every stage to this JSON file")
    g.add_argument("--seq-len", type=int, help="the longest sequence, in tokens (default: --max-prompt-tokens + "
                                               "--max-new-tokens)")


STAGE_KEYS = ("mode", "out", "init", "epochs", "steps", "lr", "warmup", "seqs_per_step", "grad_accum", "anchors",
              "save_every", "eval_sequences", "eval_every", "stop_at", "max_time")


def recipe_options(path: str, argv: list[str]) -> tuple[argparse.Namespace, list[dict]]:
    """(arguments, stages) of `dcoco train --config path ...argv`: the file's keys become the defaults, so flags
    in argv win. ValueError names an unknown key."""
    import tomllib
    from pathlib import Path

    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--config: cannot read {path}: {e}") from None
    p = argparse.ArgumentParser(prog="dcoco train")
    arguments(p)
    dests = {a.dest for a in p._actions} - {"help", "config"}
    stages = data.pop("stages", [])
    for where, keys in [("", data)] + [(f"[[stages]] {i + 1}: ", st) for i, st in enumerate(stages)]:
        bad = sorted(k for k in keys if k.replace("-", "_") not in (dests if not where else STAGE_KEYS))
        if bad:
            allowed = sorted(dests) if not where else list(STAGE_KEYS)
            raise ValueError(f"--config {path}: {where}unknown key(s) {bad}; expected some of {allowed}")
    p.set_defaults(**{k.replace("-", "_"): v for k, v in data.items()})
    return p.parse_args(argv), [{k.replace("-", "_"): v for k, v in st.items()} for st in stages]


def run(argv: list[str], args: argparse.Namespace) -> int:
    """`dcoco train`: one run, or a recipe's stages in order. A recipe's stage is skipped when its folder holds
    that stage finished, resumed when it holds it interrupted, and refused when it holds anything else (unless
    --overwrite); every stage's settings are checked before any work. Without a recipe, an --out holding a run
    needs --resume or --overwrite."""
    from ..train import recipe

    stages, given = [{}], _given_out(argv)  # a ValueError here or below: main's one line, "dcoco train: ..."
    if args.config:
        args, stages = recipe_options(args.config, argv[argv.index("train") + 1:])
    runs = _stage_runs(args, stages or [{}], given)
    plans, n = [], len(runs)
    for i, (a, cfg, kw) in enumerate(runs):
        if a.dry_run:
            plans.append(_dry_run(a, cfg, kw))
            continue
        if args.config:
            state = _stage_state(cfg, args.overwrite)
            if os.environ.get("RANK", "0") == "0":  # torchrun: one line, not one per rank
                print(f"dcoco train: stage {i + 1}/{n} ({a.mode}, {a.out})" + (": done, skipped" if state == "done"
                                                                               else ": resumed" if state == "resume"
                                                                               else ""))
            if state == "done":
                continue
            cfg = dataclasses.replace(cfg, resume=state == "resume", overwrite=state == "fresh" and args.overwrite)
        recipe.run(cfg, **kw)
    if args.dry_run and args.plan_json:
        from pathlib import Path

        Path(args.plan_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.plan_json).write_text(json.dumps({"config": args.config, "stages": plans}, indent=1) + "\n")
        print(f"wrote {args.plan_json}")
    return 0


def _given_out(argv: list[str]) -> bool:
    return any(x == "--out" or x.startswith("--out=") for x in argv)


def _stage_runs(args: argparse.Namespace, stages: list[dict], given_out: bool) -> list[tuple]:
    """(arguments, TrainConfig, recipe.run keywords) of every stage, all checked before any runs. With several
    stages each has its own folder: a stage's `out`, or under an --out given on the command line (the root) the
    last part of it (default stage-<i>-<mode>). Two stages in one folder are an error."""
    from pathlib import Path

    runs, seen, prev = [], {}, None
    for i, st in enumerate(stages):
        a = argparse.Namespace(**{**vars(args), **st})
        if len(stages) > 1 and (given_out or "out" not in st):
            name = Path(st["out"]).name if "out" in st else f"stage-{i + 1}-{a.mode}"
            a.out = str(Path(args.out) / name)
        if i and "init" not in st and not args.dry_run:
            a.init = prev  # each stage starts from the one before (a dry run plans the same drafter shape)
        prev = a.out
        key = Path(a.out).resolve()
        if key in seen:
            raise ValueError(f"[[stages]] {seen[key] + 1} and {i + 1} both write to {a.out}; give each its own out")
        seen[key] = i
        try:
            cfg, kw = train_options(a)
        except ValueError as e:
            raise ValueError(f"[[stages]] {i + 1}: {e}" if len(stages) > 1 else str(e)) from None
        runs.append((a, cfg, kw))
    return runs


def _stage_state(cfg, overwrite: bool) -> str:
    """What a recipe's stage does with its folder: "done" (finished with these settings), "resume" (interrupted
    with them) or "fresh"; ValueError when it holds another run and overwrite is off."""
    from ..train.runs import run_differences, run_files, saved_progress

    held = run_files(cfg.out)
    if not held:
        return "fresh"
    saved = saved_progress(cfg.out) if "train_state.pt" in held else None
    diff = run_differences(cfg.out, cfg) if saved else ["no saved state"]
    if not diff:
        return "done" if saved[0] >= saved[1] else "resume"
    if overwrite:
        return "fresh"
    raise ValueError(f"out: {cfg.out} holds another run ({', '.join(diff)}); rerun with --overwrite to replace it, "
                     "or give the stage another out")


def _dry_run(a: argparse.Namespace, cfg, kw: dict) -> dict:
    from ..train import recipe

    world = a.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    seq_len = a.seq_len or a.max_prompt_tokens + a.max_new_tokens
    try:
        plan = recipe.plan(cfg, kw["target"], kw["init"], kw["layers"], kw["target_layer_ids"], kw["block_size"],
                           kw["features"], kw["shard_target"], world, seq_len, a.gpu_memory)
    except (ValueError, OSError) as e:
        raise SystemExit(f"dcoco train --dry-run: {e}") from None
    print(f"dcoco train --dry-run: {cfg.mode}, {world} rank(s), sequences of {seq_len} tokens, per rank:")
    print(plan.format())
    return {"mode": cfg.mode, "world": world, "seq_len": seq_len, "target": kw["target"], "init": kw["init"],
            "features": kw["features"], "shard_target": kw["shard_target"], **plan.to_dict()}


def train_options(args: argparse.Namespace) -> tuple:
    """(TrainConfig, keyword arguments of recipe.run) from parsed `dcoco train` arguments."""
    from ..train.config import TrainConfig

    cfg = TrainConfig(mode=args.mode, out=args.out, epochs=args.epochs, steps=args.steps, stop_at=args.stop_at,
                      max_time=args.max_time, seqs_per_step=args.seqs_per_step, grad_accum=args.grad_accum,
                      anchors=args.anchors, lr=args.lr, logit_chunk=args.logit_chunk, save_dtype=args.save_dtype,
                      dist_timeout=args.dist_timeout, grad_checkpoint=args.grad_checkpoint,
                      warmup=args.warmup, num_candidates=args.candidates, width=args.width,
                      mlp_hidden=args.mlp_hidden, corr_grad=args.corr_grad, loss_vocab=args.loss_vocab, seed=args.seed,
                      save_every=args.save_every,
                      log_every=args.log_every, eval_sequences=args.eval_sequences, eval_every=args.eval_every,
                      resume=args.resume, overwrite=args.overwrite, device=args.device)
    kw = dict(target=args.target, prompts=args.prompts, data=args.data, cache=args.cache_dir, init=args.init,
              layers=args.layers,
              target_layer_ids=args.target_layers, block_size=args.block_size, mask_token_id=args.mask_token_id,
              max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
              gen_batch=args.gen_batch, feat_batch=args.feat_batch, thinking=args.thinking, features=args.features,
              shard_target=args.shard_target,
              progress=not args.no_progress)
    return cfg, kw
