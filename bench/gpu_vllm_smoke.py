"""bench/gpu_check.sh step 6: the plugin on vLLM's GPU runner, CUDA graphs on (never run yet: vLLM must be on the
device image; gpu_check.sh checks first). A tiny random target (tests/test_vllm.py's) is served without
speculation, then with its tiny DCOCO drafter; greedy outputs must be equal, and the corrector must have been
prepared before graph capture and have drafted. One engine per process (vLLM's in-process engines share global
state), so it runs in two steps:

    python bench/gpu_vllm_smoke.py WORK plain    # writes WORK/vllm_plain.json
    python bench/gpu_vllm_smoke.py WORK dcoco    # writes WORK/vllm.json: the verdict gpu_report.py reads
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: the probes reach the drafter
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(work: Path, what: str) -> None:
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    import vllm_probes as probes
    from test_vllm import N, PROMPTS, _drafter, _spec_counters, _target

    models = work / "vllm_models"
    if what == "plain":
        _target(models / "target")
        _drafter(models / "dcoco")
    spec = None if what == "plain" else {"method": "dflash", "model": str(models / "dcoco"),
                                         "num_speculative_tokens": N}
    t = time.perf_counter()
    llm = vllm.LLM(model=str(models / "target"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
                   max_num_seqs=4, enforce_eager=False, disable_log_stats=False, seed=0, speculative_config=spec,
                   gpu_memory_utilization=0.3)
    start = time.perf_counter() - t
    state = llm.collective_rpc(probes.state)[0] if spec else None
    if spec:
        llm.collective_rpc(probes.record)
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, detokenize=False)
    tokens = [list(o.outputs[0].token_ids)
              for o in llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], sp, use_tqdm=False)]
    if what == "plain":
        (work / "vllm_plain.json").write_text(json.dumps({"tokens": tokens, "start_s": start}))
        return
    log = llm.collective_rpc(probes.recorded)[0]
    plain = json.loads((work / "vllm_plain.json").read_text())
    counters = _spec_counters(llm)
    res = {"vllm": vllm.__version__, "start_s": start, "state": {k: v for k, v in state.items() if k != "weight"},
           "greedy_equal": tokens == plain["tokens"], "corrected_calls": len(log["drafts"]),
           "entries": log["entries"], "counters": counters}
    res["passed"] = bool(res["greedy_equal"] and state["prepared"] and res["corrected_calls"] > 0)
    (work / "vllm.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
