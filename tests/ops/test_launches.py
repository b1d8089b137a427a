"""The native backend's shape on a GPU, counted: kernel-launching ops per call (dcoco.ops.launches on the meta
device, where nothing computes and no host sync can hide). Counts are deterministic, so the bounds are exact
assertions, and they must not grow with the number of requests."""

import pytest
import torch

import dcoco
from dcoco.serve import hook
from dcoco.ops.launches import count
from dcoco.ops.select import select

B, K, V = 15, 16, 4096
FORWARD_MAX = 40  # Corrector.forward with the prepared table
PATH_RULE_MAX = 60  # the grid and a path rule (hook.tokens: score, select, the tokens)
# the whole compute_logits hook: top-K with rank 0 = the argmax (4 ops over the top-K), the corrector, the hand-back
HOOK_MAX = 46
ANCHOR_HOOK_MAX = 50  # the same with an anchor-aware corrector: the anchor joined to its block, slot 0's K copies
TRAIN_CHUNK_MAX = 120  # score + backward, one chunk of requests
ANCHOR_SLOT = 2  # the anchor transition's slot 0 (docs/spec.md): one cat of the ids, one pad of the logits
REQUESTS = (1, 8, 32)


@pytest.fixture(scope="module")
def corrector():
    with dcoco.use_backend("native"):
        m = dcoco.Corrector(1024).to("meta").requires_grad_(False)
        embed = torch.empty(V, 1024, device="meta")
        m.prepare_inference(embed)
        yield m, embed


def inputs(R, d=1024, dtype=torch.float32):
    return (torch.empty(R, B, d, device="meta", dtype=dtype), torch.empty(R, B, K, device="meta", dtype=torch.int64),
            torch.empty(R, B, K, device="meta"))


def counted(fn, *args):
    with dcoco.use_backend("native"), torch.no_grad():  # no_grad: composite ops show their kernels
        _, c = count(fn, *args)
    assert c.syncs == 0, c.ops
    return c


def test_forward_launches_a_few_dozen_kernels_at_any_batch(corrector):
    m, embed = corrector
    counts = {R: counted(m, *inputs(R), embed).count for R in REQUESTS}
    assert len(set(counts.values())) == 1, counts  # whole-batch ops: no per-request or per-slot loop
    assert counts[1] <= FORWARD_MAX, counted(m, *inputs(1), embed).by_op()


@pytest.mark.parametrize("rule", ["global", "geometric"])
def test_path_rules_scan_in_a_few_dozen_kernels(corrector, rule):
    m, embed = corrector
    counts = {R: counted(hook.tokens, m, embed, rule, *inputs(R)).count for R in REQUESTS}
    assert len(set(counts.values())) == 1, counts
    assert counts[1] <= PATH_RULE_MAX, counted(hook.tokens, m, embed, rule, *inputs(1)).by_op()


@pytest.mark.parametrize("point_mass", [False, True])
def test_the_vllm_hook_as_a_whole(corrector, point_mass):
    """What the plugin runs on a compute_logits call: bf16 logits and hidden states, as vLLM hands them."""
    m, embed = corrector

    def run(R):
        logits = torch.empty(R * B, V, device="meta", dtype=torch.bfloat16)
        hidden = torch.empty(R * B, 1024, device="meta", dtype=torch.bfloat16)
        correct = hook.rows(lambda h, i, lg: hook.tokens(m, embed, "greedy", h, i, lg), B)
        return counted(hook.on_logits, correct, hidden, logits, K, point_mass)

    counts = {R: run(R).count for R in REQUESTS}
    assert len(set(counts.values())) == 1, counts
    assert counts[1] <= HOOK_MAX, run(1).by_op()


@pytest.mark.parametrize("point_mass", [False, True])
def test_the_vllm_hook_with_the_anchor_transition(point_mass):
    """The plugin's compute_logits hook for an anchor-aware corrector: the anchor rows (R, d) are strided views of
    the drafter pass and the anchor ids (R,) int32, as vLLM's input buffer holds them."""
    with dcoco.use_backend("native"):
        m = dcoco.Corrector(1024, anchor_transition=True).to("meta").requires_grad_(False)
        embed = torch.empty(V, 1024, device="meta")
        m.prepare_inference(embed)

    def run(R):
        logits = torch.empty(R * B, V, device="meta", dtype=torch.bfloat16)
        hidden = torch.empty(R * B, 1024, device="meta", dtype=torch.bfloat16)
        block = torch.empty(R * (B + 1), 1024, device="meta", dtype=torch.bfloat16)  # the pass's rows
        ids = torch.empty(R * (B + 1), device="meta", dtype=torch.int32)
        correct = hook.rows(lambda h, i, lg, a: hook.tokens(m, embed, "greedy", h, i, lg, a), B)
        return counted(hook.on_logits, correct, hidden, logits, K, point_mass, block[::B + 1], ids[::B + 1])

    counts = {R: run(R).count for R in REQUESTS}
    # the draft is a column slice of the walk's (R, B+1) tokens: flat without a copy at R = 1 only
    assert counts[8] == counts[32] == counts[1] + 1, counts
    assert counts[8] <= ANCHOR_HOOK_MAX, run(8).by_op()


def test_the_training_path_is_whole_tensor_ops_too():
    """score + backward: whole-batch ops in chunks of requests (recomputed in the backward); at d=1024 a chunk
    holds 8 requests, so R = 1 and 8 are one chunk each."""
    with dcoco.use_backend("native"):
        m = dcoco.Corrector(1024).to("meta")
        embed = torch.empty(V, 1024, device="meta")

        def step(R):
            h, ids, lg = inputs(R)
            h.requires_grad_()
            _, c = count(lambda: m.score(h, ids, lg, embed).sum().backward())
            assert c.syncs == 0, c.ops
            return c

        for R in (1, 8):
            assert step(R).count <= TRAIN_CHUNK_MAX, step(R).by_op()


@pytest.fixture(scope="module")
def anchor_corrector(corrector):
    """The same weights with the anchor transition on (docs/spec.md, "Anchor transition"), prepared."""
    m, embed = corrector
    with dcoco.use_backend("native"):
        a = dcoco.Corrector(1024, anchor_transition=True).to("meta").requires_grad_(False)
        a.prepare_inference(embed)
        yield a, embed


def anchor_inputs(R):
    _, ids, lg = inputs(R)
    return torch.empty(R, B + 1, 1024, device="meta"), ids, lg, torch.empty(R, device="meta", dtype=torch.int64)


def anchor_rule(m, embed, rule, hidden, ids, logits, anchor):
    """A path rule from the anchor: the B+1-slot grid, walk_inputs, select, the tokens."""
    first, grid = m.walk_inputs(m.score(hidden, ids, logits, embed, anchor_ids=anchor), logits)
    return ids.gather(2, select(grid, first, rule)[..., None])[..., 0]


def test_the_anchor_forward_adds_its_slot_and_nothing_per_request(corrector, anchor_corrector):
    """The anchor's slot 0 goes through the same whole-batch walk: exactly ANCHOR_SLOT more kernels than the
    paper's forward, the same at every R, no host sync."""
    m, embed = corrector
    a, _ = anchor_corrector
    plain = counted(m, *inputs(1), embed).count
    counts = {R: counted(lambda h, i, lg, t: a(h, i, lg, embed, anchor_ids=t), *anchor_inputs(R)).count
              for R in REQUESTS}
    assert set(counts.values()) == {plain + ANCHOR_SLOT}, (plain, counts)
    assert plain + ANCHOR_SLOT <= FORWARD_MAX


@pytest.mark.parametrize("rule", ["global", "geometric"])
def test_the_anchor_path_rules_add_only_the_slot(corrector, anchor_corrector, rule):
    m, embed = corrector
    a, _ = anchor_corrector
    plain = counted(hook.tokens, m, embed, rule, *inputs(1)).count
    counts = {R: counted(anchor_rule, a, embed, rule, *anchor_inputs(R)).count for R in REQUESTS}
    assert set(counts.values()) == {plain + ANCHOR_SLOT}, (plain, counts)
    assert plain + ANCHOR_SLOT <= PATH_RULE_MAX


def test_the_anchor_training_path():
    """score + backward from the anchor: the paper's training path plus the slot's ANCHOR_SLOT kernels at every
    chunk size, no sync."""
    with dcoco.use_backend("native"):
        plain = dcoco.Corrector(1024).to("meta")
        a = dcoco.Corrector(1024, anchor_transition=True).to("meta")
        embed = torch.empty(V, 1024, device="meta")

        def step(m, R):
            h, ids, lg, t = anchor_inputs(R) if m is a else (*inputs(R), None)
            h.requires_grad_()
            kw = {"anchor_ids": t} if m is a else {}
            _, c = count(lambda: m.score(h, ids, lg, embed, **kw).sum().backward())
            assert c.syncs == 0, c.ops
            return c

        for R in (1, 8):
            assert step(a, R).count == step(plain, R).count + ANCHOR_SLOT <= TRAIN_CHUNK_MAX, step(a, R).by_op()
