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
    from ..train.config import MEMORY, OPTIM, WHAT

    g = p.add_argument_group(WHAT)
    g.add_argument("--config", help="a TOML recipe: any of these options as keys (e.g. max_new_tokens = 1024), and "
                                    "optionally [[stages]] run in order, each starting from the one before; flags "
                                    "given here override the file (recipes/ has examples)")
    _config_options(g, WHAT, {"out": lambda: g.add_argument("--init", help="DFlash or DCOCO checkpoint to start "
                                                                           "from")})
    g = p.add_argument_group("target and corpus")
    g.add_argument("--target", default="smollm2",
                   help="'smollm2' (embedded, the default) or a transformers causal LM path")
    g.add_argument("--prompts", help="JSONL of {\"prompt\": ...} lines (default: the set shipped with dcoco)")
    g.add_argument("--data", help="`dcoco data generate`'s output folder: train on those samples (token ids) "
                                  "instead of generating answers here (--prompts is then unused)")
    g.add_argument("--data-samples", type=int, help="train on N of --data's samples: the first N of one fixed "
                                                    "permutation, so a smaller subset lies inside every larger one "
                                                    "(default: all)")
    g.add_argument("--cache-dir", help="corpus cache (default: $DCOCO_CACHE/corpus or ~/.cache/dcoco/corpus)")
    g.add_argument("--max-prompt-tokens", type=int, default=300, help="longer prompts are dropped (%(default)s)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="response length cap (%(default)s)")
    g.add_argument("--gen-batch", type=int, default=16, help="generation batch (%(default)s)")
    g.add_argument("--feat-batch", type=int, default=8, help="feature-pass batch (%(default)s)")
    g.add_argument("--features", choices=("auto", "cache", "online"), default="auto",
                   help="online: the frozen target runs on every batch (no feature cache; each rank its share); "
                        "cache: a feature cache built first; auto: online on CUDA, a cache on a CPU (%(default)s)")
    g.add_argument("--labels", choices=("argmax", "corpus"), default="argmax",
                   help="online features: the target's argmax, or the corpus's own next tokens, equal to it on the "
                        "target's greedy answers (--data from `dcoco data generate`) and a shorter target pass, "
                        "which stops at the last tap (%(default)s)")
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
    _config_options(p.add_argument_group(OPTIM), OPTIM)
    g = p.add_argument_group(MEMORY)
    _config_options(g, MEMORY)
    g.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("memory plan (--dry-run: print it and exit; no weights are loaded)")
    g.add_argument("--dry-run", action="store_true", help="print the per-rank memory plan of this configuration")
    g.add_argument("--world-size", type=int, help="ranks to plan for (default: WORLD_SIZE, else 1)")
    g.add_argument("--gpu-memory", type=float, help="GiB per GPU to plan for (default: this machine's GPU)")
    g.add_argument("--plan-json", help="also write the plan of every stage to this JSON file")
    g.add_argument("--seq-len", type=int, help="the longest sequence, in tokens (default: --max-prompt-tokens + "
                                               "--max-new-tokens)")


def _config_fields(group: str | None = None) -> list:
    """TrainConfig's fields that are `dcoco train` options (of one option group when given), in field order."""
    from ..train.config import TrainConfig

    return [f for f in dataclasses.fields(TrainConfig)
            if f.metadata["group"] is not None and group in (None, f.metadata["group"])]


def _dest(field) -> str:
    """The argparse destination (and recipe key) of a TrainConfig field's option."""
    return field.metadata["flag"] or field.name


def _config_options(g, group: str, after: dict | None = None) -> None:
    """The options of one group's TrainConfig fields; after[name]() adds options that follow that field's."""
    for f in _config_fields(group):
        kw = {"help": f.metadata["help"]}
        if f.type == "bool":
            kw["action"] = "store_true"
        else:
            kw.update(type={"int": int, "float": float, "str": str}[f.type.split(" | ")[0]], default=f.default)
        if f.metadata["choices"]:
            kw["choices"] = f.metadata["choices"]
        g.add_argument("--" + _dest(f).replace("_", "-"), **kw)
        if after and f.name in after:
            after[f.name]()


def stage_keys() -> tuple[str, ...]:
    """What a recipe's [[stages]] may set: --init and the TrainConfig fields marked as stage settings."""
    return ("init",) + tuple(_dest(f) for f in _config_fields() if f.metadata["stage"])


def recipe_options(path: str, argv: list[str]) -> tuple[argparse.Namespace, list[dict]]:
    """(arguments, stages) of `dcoco train --config path ...argv`: the file's keys become the defaults, so flags
    in argv win. ValueError names an unknown key."""
    import tomllib
    from pathlib import Path

    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ValueError(f"--config: cannot read {path} as UTF-8 TOML: {e}") from None
    p = argparse.ArgumentParser(prog="dcoco train")
    arguments(p)
    dests = set(vars(p.parse_args([]))) - {"config"}
    stages = data.pop("stages", [])
    if not isinstance(stages, list) or not all(isinstance(st, dict) for st in stages):
        raise ValueError(f"--config {path}: stages: expected [[stages]] tables, got {stages!r}")
    for where, keys in [("", data)] + [(f"[[stages]] {i + 1}: ", st) for i, st in enumerate(stages)]:
        allowed = sorted(dests if not where else stage_keys())
        bad = sorted(k for k in keys if k.replace("-", "_") not in allowed)
        if bad:
            raise ValueError(f"--config {path}: {where}unknown key(s) {bad}; expected some of {allowed}")
    p.set_defaults(**{k.replace("-", "_"): v for k, v in data.items()})
    return p.parse_args(argv), [{k.replace("-", "_"): v for k, v in st.items()} for st in stages]


def run(argv: list[str], args: argparse.Namespace) -> int:
    """`dcoco train`: one run, or a recipe's stages in order. A recipe's stage is skipped when its folder holds
    that stage finished (train/stages.py: its done.json holds the recipe, lineage included, that this stage would
    write), resumed when it holds it interrupted, and refused when it holds anything else (unless --overwrite);
    every stage's settings are checked before any work. A stage stopped before its end (--stop-at, --max-time)
    ends the recipe there. Without a recipe, an --out holding a run needs --resume or --overwrite."""
    from ..train import recipe, stages as stage_records

    stages: list[dict]
    stages, given = [{}], _given_out(argv)  # a ValueError here or below: main's one line, "dcoco train: ..."
    if args.config:
        args, stages = recipe_options(args.config, argv[argv.index("train") + 1:])
    runs = _stage_runs(args, stages or [{}], given)
    plans, n = [], len(runs)
    for i, (a, cfg, kw) in enumerate(runs):
        if a.dry_run:
            plans.append(_dry_run(a, cfg, kw))
            continue
        writer = os.environ.get("RANK", "0") == "0"  # torchrun: one line and one record, not one per rank
        want = stage_records.recipe(cfg, _upstream(a.init))
        if args.config:
            state = _stage_state(cfg, want, args.overwrite, writer)
            if writer:
                print(f"dcoco train: stage {i + 1}/{n} ({a.mode}, {a.out})" + (": done, skipped" if state == "done"
                                                                               else ": resumed" if state == "resume"
                                                                               else ""))
            if state == "done":
                continue
            cfg = dataclasses.replace(cfg, resume=state == "resume", overwrite=state == "fresh" and args.overwrite)
        res = recipe.run(cfg, **kw)
        if res.step < res.total:
            if args.config and writer:
                print(f"dcoco train: stage {i + 1}/{n} stopped at step {res.step} of {res.total}; rerun to resume it")
            break
        if writer:
            stage_records.write(cfg.out, want, steps=res.step)
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

    seen: dict[Path, int]  # each stage's folder: the first stage writing there
    runs, seen, prev = [], {}, None
    for i, st in enumerate(stages):
        a = argparse.Namespace(**{**vars(args), **st})
        if len(stages) > 1 and (given_out or "out" not in st):
            name = Path(st["out"]).name if "out" in st else f"stage-{i + 1}-{a.mode}"
            a.out = str(Path(args.out) / name)
        if i and "init" not in st and not args.dry_run:
            a.init = prev  # each stage starts from the one before (a dry run plans the same drafter shape)
        elif args.dry_run and "init" in st and Path(st["init"]).resolve() in seen:
            a.init = args.init  # an earlier stage's folder, not written yet: planned like an implicit chain
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


def _upstream(init: str | None) -> dict | None:
    """The lineage a stage starting from init records: the recipe of the stage that wrote init, else init's name
    (a checkpoint from elsewhere), else None (a fresh drafter)."""
    from pathlib import Path

    from ..train import stages as stage_records

    if init is None:
        return None
    done = stage_records.read(init) if Path(init).is_dir() else None
    return done["recipe"] if done is not None else {"init": str(init)}


def _stage_state(cfg, want: dict, overwrite: bool, writer: bool = True) -> str:
    """What a recipe's stage does with its folder: "done" (finished with recipe want: its done.json, or, in a
    folder without one, a finished run with these settings, which then gets it when writer), "resume"
    (interrupted with them: from train_state.pt, or from the weights and progress.json kept where the optimizer
    state is not) or "fresh"; ValueError when it holds another run or stage and overwrite is off. A folder kept
    with neither state (weights and logs only) is finished when its log reached the stage's steps."""
    from ..train import stages as stage_records
    from ..train.runs import PROGRESS, STATE, logged_steps, run_differences, run_files, saved_run

    other = stage_records.check(cfg.out, want)
    if other is not None:
        if not other:
            return "done"
        if overwrite:
            return "fresh"
        raise stage_records.refusal(cfg.out, other)
    held = run_files(cfg.out)
    if not held:
        return "fresh"
    finished_at = None
    if STATE not in held and PROGRESS not in held and "model.safetensors" in held and cfg.steps is not None \
            and logged_steps(cfg.out) >= cfg.steps and not overwrite:
        finished_at = cfg.steps
    else:
        saved = saved_run(cfg.out)  # read once: progress.json's check hashes the weights
        diff = run_differences(saved, cfg) if saved else ["no saved state"]
        if saved and not diff:  # (diff is empty only with a saved state)
            if saved["step"] < saved["total"]:
                return "resume"
            finished_at = saved["step"]
    if finished_at is not None:
        if writer:
            stage_records.write(cfg.out, want, steps=finished_at)
        return "done"
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

    cfg = TrainConfig(**{f.name: getattr(args, _dest(f)) for f in _config_fields()})
    kw = dict(target=args.target, prompts=args.prompts, data=args.data, data_samples=args.data_samples,
              cache=args.cache_dir, init=args.init,
              layers=args.layers,
              target_layer_ids=args.target_layers, block_size=args.block_size, mask_token_id=args.mask_token_id,
              max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
              gen_batch=args.gen_batch, feat_batch=args.feat_batch, thinking=args.thinking, features=args.features,
              shard_target=args.shard_target, labels=args.labels,
              progress=not args.no_progress)
    return cfg, kw
