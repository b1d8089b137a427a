"""The speculative-decoding engine: greedy losslessness (DFlash and DCOCO, every rule), KV-cache cropping, eos and
max_new_tokens edges, sampling losslessness (chi-square against the target's exact marginals; DCOCO's corrector and
Domino's and DSpark's heads too) and the metrics.
Tiny random Llama targets in memory; drafters are a random DFlashDrafter (almost every draft rejected) and a
scripted one that drafts chosen tokens (long accepted runs, full-block acceptance, chosen rejections)."""

from __future__ import annotations

import itertools

import pytest
import torch

pytest.importorskip("transformers", reason="the engine needs transformers (pip install '.[demo]')")

from scipy import stats

from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.modeling.domino import DominoHead
from dcoco.modeling.draft_vocab import DraftHead
from dcoco.modeling.dspark import DSparkHead
from dcoco.specdec.engine import KS, Engine, probs, summarize, target_only
from helpers.tiny_models import BS, PROMPTS, corrector, dflash_cfg, llama

class Scripted(DFlashDrafter):
    """Drafts script(anchor, context_len) -> B ids: the hidden states are chosen so that the target's LM head
    (V <= d: W pinv(W) = I) gives exactly 3 at the scripted token plus seeded noise below it (the other
    candidates)."""

    def __init__(self, head: torch.Tensor, script):
        super().__init__(dflash_cfg(head.shape[0]))
        self.pinv, self.script = torch.linalg.pinv(head), script

    def draft(self, anchor_ids, target_hidden, embed, context_len=None):
        C, V = target_hidden.shape[1], self.pinv.shape[1]
        want = torch.tensor(self.script(int(anchor_ids[0]), C))
        logits = torch.rand(BS - 1, V, generator=torch.Generator().manual_seed(C))
        logits[torch.arange(BS - 1), want] = 3.0
        h = logits @ self.pinv.T
        return torch.cat([torch.zeros(1, h.shape[1]), h])[None]


@pytest.fixture(scope="module")
def oracle(target):
    """Drafts oracle.seq (set it to prompt + greedy reference) after the anchor, one slot wrong every third round."""
    def script(anchor: int, C: int) -> list[int]:
        assert d.seq[C] == anchor
        out = (d.seq[C + 1:C + BS] + [0] * BS)[:BS - 1]
        if C % 3 == 0:
            out[C % (BS - 1)] = (out[C % (BS - 1)] + 1) % 64
        return out

    d = Scripted(target.get_output_embeddings().weight.detach(), script)
    return d


def engines(target, drafter):
    yield Engine(target, drafter, eos_token_id=None)
    for rule, anchor in itertools.product(("greedy", "global", "geometric"), (False, True)):
        yield Engine(target, drafter, corrector(anchor=anchor), rule=rule, num_candidates=8, eos_token_id=None)


@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_greedy_matches_target_only(target, refs, oracle, kind):
    torch.manual_seed(1)
    drafter = oracle if kind == "oracle" else DFlashDrafter(dflash_cfg(64)).eval()
    taus = []
    for eng in engines(target, drafter):
        results = []
        for p, ref in zip(PROMPTS, refs):
            oracle.seq = p + ref
            for n in (1, 2, 7, 23, 40):
                r = eng.generate(p, n)
                assert r.tokens == ref[:n], (eng.rule, eng.corrector is not None, p, n)
                results.append(r)
        s = summarize(results)
        assert s["tau"] >= 1
        taus.append(s["tau"])
        if kind == "oracle" and eng.corrector is None:
            assert s["tau"] > 2.5 and s["accept_counts"][-1] > 0  # full blocks accepted, so bonus tokens too
    if kind == "oracle":
        assert all(t < taus[0] for t in taus[1:])  # the corrector did re-pick (here always for the worse)


def test_cache_cropping_matches_full_recompute(target, refs, oracle):
    """Greedy by recomputing the whole sequence each step (no cache at all) = the engine's cached decode."""
    p, ids = PROMPTS[1], list(PROMPTS[1])
    oracle.seq = p + refs[1]
    with torch.no_grad():
        for _ in range(40):
            ids.append(int(target(torch.tensor([ids])).logits[0, -1].argmax()))
    assert Engine(target, oracle, eos_token_id=None).generate(p, 40).tokens == ids[len(p):]


def test_a_shortlisted_head_drafts_from_its_list_and_stays_lossless(target, refs, oracle):
    """A drafter whose head lists the even ids only: its candidates are all even, and decoding still equals the
    target's (the odd tokens the oracle scripts are never drafted, so fewer drafts are accepted)."""
    head = target.get_output_embeddings().weight.detach()
    evens = torch.arange(0, 64, 2)
    taus = {}
    for listed in (False, True):
        oracle.draft_head = DraftHead.from_target(head, evens) if listed else None
        for eng in (Engine(target, oracle, eos_token_id=None),
                    Engine(target, oracle, corrector(), num_candidates=8, eos_token_id=None)):
            results = []
            for p, ref in zip(PROMPTS, refs):
                oracle.seq = p + ref
                results.append(eng.generate(p, 40))
                assert results[-1].tokens == ref, (listed, eng.corrector is not None, p)
            taus[listed, eng.corrector is not None] = summarize(results)["tau"]
        if listed:
            ids, _ = eng.candidates(torch.randn(3, 5, 64))
            assert ids.shape == (3, 5, 16) and bool((ids % 2 == 0).all())
    oracle.draft_head = None
    assert taus[True, False] < taus[False, False]


def test_a_shortlisted_head_refuses_what_needs_the_whole_vocabulary(target, oracle):
    head = target.get_output_embeddings().weight.detach()
    oracle.draft_head = DraftHead.from_target(head, torch.arange(12))
    try:
        with pytest.raises(ValueError, match="a DominoHead reads the drafter's logits over the whole vocabulary"):
            Engine(target, oracle, DominoHead(64, 64, 64, gru_size=16, mid_size=16))
        with pytest.raises(ValueError, match="its draft vocabulary has 12 tokens, fewer than the 16 candidates"):
            Engine(target, oracle)
    finally:
        oracle.draft_head = None


def test_eos_stops(target, refs, oracle):
    eos = refs[0][9]
    stop = refs[0].index(eos) + 1
    base = target_only(target, PROMPTS[0], 40, eos_token_id=eos).tokens
    assert base == refs[0][:stop]
    oracle.seq = PROMPTS[0] + refs[0]
    for eng in (Engine(target, oracle, eos_token_id=[eos, 63]), Engine(target, oracle, corrector(), eos_token_id=eos)):
        assert eng.generate(PROMPTS[0], 40).tokens == base


def test_metrics_consistent(target, refs, oracle):
    oracle.seq = PROMPTS[0] + refs[0]
    rs = Engine(target, oracle, corrector(), num_candidates=8, eos_token_id=None).generate_batch([PROMPTS[0]] * 2, 31)
    for r in rs:
        assert len(r.tokens) == 1 + sum(r.committed) == 31
        assert all(c == a + 1 for c, a in zip(r.committed, r.accepted))
        assert (r.cover_hits <= r.cover_seen[:, None]).all()
        assert (r.cover_hits[:, 1:] >= r.cover_hits[:, :-1]).all()  # monotone in k
        assert r.rounds - 1 <= r.cover_seen[0] <= r.rounds  # a last round with one token left drafts nothing
    s = summarize(rs)
    acc = s["accept_counts"]
    assert s["tau"] == pytest.approx(sum(sum(r.committed) for r in rs) / s["rounds"]) and s["tau"] >= 1
    assert all(x >= y for x, y in zip(acc, acc[1:])) and sum(acc) == sum(sum(r.accepted) for r in rs)
    assert s["coverage_seen"][0] <= s["rounds"] and s["tokens_per_s"] > 0
    for i in range(BS - 1):
        cov = [s["coverage"][k][i] for k in KS]
        assert cov == [None] * len(KS) if s["coverage_seen"][i] == 0 else all(x <= y for x, y in zip(cov, cov[1:]))


def test_deterministic_sampling(target):
    torch.manual_seed(2)
    eng = Engine(target, DFlashDrafter(dflash_cfg(64)).eval(), corrector(), eos_token_id=None)
    a, b = (eng.generate(PROMPTS[0], 20, temperature=0.8, top_p=0.9, generator=torch.Generator().manual_seed(5))
            for _ in range(2))
    assert a.tokens == b.tokens


def _exact_marginals(model, prompt: list[int], steps: int, **kw) -> list[torch.Tensor]:
    """The target's distribution of each generated token t_1..t_steps (marginalised over earlier ones)."""
    V = model.config.vocab_size
    joint = torch.ones(1)  # over all prefixes of the generated tokens so far, in itertools.product order
    out = []
    with torch.no_grad():
        for s in range(steps):
            seqs = torch.tensor([prompt + list(t) for t in itertools.product(range(V), repeat=s)])
            q = probs(model(seqs).logits[:, -1].double(), **kw)
            joint = (joint[:, None] * q).reshape(-1)
            out.append(joint.view(-1, V).sum(0))
    return out


def _chi2_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square p-value, with cells expecting < 5 pooled; a count where the target has zero mass fails."""
    assert counts[expected == 0].sum() == 0
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).double()
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs.sum() / exp[keep].sum()).pvalue)


def _selection(kind: str, V: int):
    """What re-picks the drafts: nothing, DCOCO's corrector (plain or anchor-aware), or one of the sequential
    baselines' heads (Domino's, DSpark's) with their zero-initialised output layers drawn, so they do re-pick."""
    torch.manual_seed(0)
    if kind in ("corrector", "anchor"):
        return corrector(4, kind == "anchor")
    if kind == "domino":
        head = DominoHead(64, 64, V, gru_size=16, mid_size=16)
        torch.nn.init.normal_(head.out.weight, std=2.0)
        return head.eval()
    if kind == "dspark":
        head = DSparkHead(64, V, rank=8)
        torch.nn.init.normal_(head.markov_w2.weight, std=2.0)
        return head.eval()
    return None


@pytest.mark.slow  # each case samples thousands of rounds: about 20 s on 2 cores
@pytest.mark.parametrize("kind, method", [("none", "greedy"), ("corrector", "greedy"), ("corrector", "probabilistic"),
                                          ("anchor", "probabilistic"), ("domino", "greedy"), ("dspark", "greedy")])
def test_sampling_lossless(kind, method):
    V, prompt, kw, n = 12, [1, 5, 3], dict(temperature=0.9, top_p=0.95, top_k=0), 1500
    model = llama(V, 3)
    with torch.no_grad():  # round 1 drafts the target's mode, or its second choice after odd anchors
        q1 = probs(model(torch.tensor([[*prompt, a] for a in range(V)])).logits[:, -1], **kw)
        y1 = q1.topk(2, -1).indices[torch.arange(V), torch.arange(V) % 2]
        y2 = probs(model(torch.tensor([[*prompt, a, int(y1[a])] for a in range(V)])).logits[:, -1], **kw).argmax(-1)

    def script(anchor: int, C: int) -> list[int]:
        first = [int(y1[anchor]), int(y2[anchor])] if C == len(prompt) else [C % V, (C + 1) % V]
        return (first + [0] * BS)[:BS - 1]

    drafter = Scripted(model.get_output_embeddings().weight.detach(), script)
    eng = Engine(model, drafter, _selection(kind, V), num_candidates=4, eos_token_id=None,
                 draft_sample_method=method)
    gen = torch.Generator().manual_seed(0)
    samples = torch.tensor([eng.generate(prompt, 4, generator=gen, **kw).tokens for _ in range(n)])
    marginals = _exact_marginals(model, prompt, 4, **kw)
    for s, q in enumerate(marginals):  # a 1% test over the positions together (Bonferroni)
        p = _chi2_p(torch.bincount(samples[:, s], minlength=V), q * n)
        assert p > 0.01 / len(marginals), (s, p)


@pytest.mark.parametrize("with_corrector, anchor", [(False, False), (True, False), (True, True)])
def test_sampled_walk_proposal(target, with_corrector, anchor):
    """The probabilistic draft: each slot's proposal is a distribution over its K candidates only, the drawn token
    one of them with q > 0; at a temperature near 0 the walk is the greedy one (argmax, or the corrector's)."""
    drafter = DFlashDrafter(dflash_cfg(64)).eval()
    eng = Engine(target, drafter, corrector(1, anchor) if with_corrector else None, num_candidates=8,
                 eos_token_id=None, draft_sample_method="probabilistic")
    drafted, ids, vals, hc = eng._draft(7, drafter.target_features(target(torch.tensor([[3, 9, 7]]),
                                                                          output_hidden_states=True).hidden_states))
    n = BS - 1
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        drafts, q = eng.sample_walk(ids, vals, hc, n, 1.0, gen, 7)
        torch.testing.assert_close(q.sum(-1), torch.ones(n))
        for j, y in enumerate(drafts):
            assert set(q[j].nonzero()[:, 0].tolist()) <= set(ids[j, :8].tolist()) and q[j, y] > 0
    assert eng.sample_walk(ids, vals, hc, n, 1e-6, gen, 7)[0] == drafted[:n].tolist()
    with pytest.raises(ValueError, match="draft_sample_method"):
        Engine(target, drafter, draft_sample_method="beam")


@pytest.mark.parametrize("kw, name", [
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"),
    (dict(prompt_ids=[]), "prompt_ids"), (dict(prompt_ids=[64]), "prompt_ids")])
def test_bad_arguments(target, kw, name):
    eng = Engine(target, DFlashDrafter(dflash_cfg(64)), eos_token_id=None)
    args = {"prompt_ids": [1, 2], "max_new_tokens": 4, **kw}
    with pytest.raises(ValueError, match=name):
        eng.generate(**args)
    with pytest.raises(ValueError, match=name):
        target_only(target, **args)


def test_bad_engine(target):
    with pytest.raises(ValueError, match="drafter: vocab_size"):
        Engine(target, DFlashDrafter(dflash_cfg(32)))
    with pytest.raises(ValueError, match="rule"):
        Engine(target, DFlashDrafter(dflash_cfg(64)), rule="best")
    with pytest.raises(ValueError, match="num_candidates"):
        Engine(target, DFlashDrafter(dflash_cfg(64)), num_candidates=0)


class Runner(Scripted):
    """Drafts seq (prompt + greedy reference) after the anchor with slot C % (BS-1) wrong when C % 4 == 0, the
    reference token then at rank 1; every other candidate is noise below both."""

    def __init__(self, head: torch.Tensor):
        super().__init__(head, None)

    def draft(self, anchor_ids, target_hidden, embed, context_len=None):
        C, V = target_hidden.shape[1], self.pinv.shape[1]
        true = torch.tensor((self.seq[C + 1:C + BS] + [0] * BS)[:BS - 1])
        want = true.clone()
        if C % 4 == 0:  # not 3: full rounds step C by BS = 6
            want[C % (BS - 1)] = (want[C % (BS - 1)] + 1) % V
        logits = torch.rand(BS - 1, V, generator=torch.Generator().manual_seed(C))
        logits[torch.arange(BS - 1), true] = 2.5
        logits[torch.arange(BS - 1), want] = 3.0
        h = logits @ self.pinv.T
        return torch.cat([torch.zeros(1, h.shape[1]), h])[None]


@pytest.mark.parametrize("with_corrector", [False, True])
def test_oracle_metrics_exact(target, refs, with_corrector):
    """Per round: the plain engine accepts up to the wrong slot j; any-candidate oracle takes all n drafts; the
    prefix-first one too unless j is slot 1. A fresh corrector (Delta = 0) keeps rank 0, so its transition hits
    are the pairs whose successor is not the wrong slot."""
    drafter = Runner(target.get_output_embeddings().weight.detach())
    corr = Corrector(64, num_candidates=8, width=16, mlp_hidden=32).eval() if with_corrector else None
    eng = Engine(target, drafter, corr, num_candidates=8, eos_token_id=None)
    results = []
    for p, ref in zip(PROMPTS, refs):
        drafter.seq = p + ref
        for max_new in (23, 40):
            r = eng.generate(p, max_new, reference=ref)
            assert r.tokens == ref[:max_new] and len(r.oracle_walk) == r.rounds
            L, pairs, wrong_succ = 1, 0, 0
            for c, a, w, f in zip(r.committed, r.accepted, r.oracle_walk, r.oracle_prefix):
                n, C = min(BS - 1, max_new - L - 1), len(p) + L - 1
                j = C % (BS - 1) if C % 4 == 0 and C % (BS - 1) < n else None
                assert (a, w, f) == ((j, n + 1, n + 1 if j else 1) if j is not None else (n, n + 1, n + 1))
                pairs += max(n - 1, 0)
                wrong_succ += bool(j)
                L += c
            assert (r.trans_seen, r.trans_hits) == ((pairs, pairs - wrong_succ) if with_corrector else (0, 0))
            results.append(r)
    s = summarize(results)
    assert s["oracle_rounds"] == s["rounds"]
    assert s["tau_oracle_walk"] >= s["tau_oracle_prefix_first"] > s["tau"]
    assert (s["transition_hit_rate"] is not None) == with_corrector


def test_oracle_bounds_random_drafter(target, refs):
    """A random drafter: per round, committed <= prefix-first oracle <= oracle walk."""
    torch.manual_seed(4)
    eng = Engine(target, DFlashDrafter(dflash_cfg(64)).eval(), eos_token_id=None)
    for p, ref in zip(PROMPTS, refs):
        r = eng.generate(p, 40, reference=ref)
        assert all(c <= f <= w for c, f, w in zip(r.committed, r.oracle_prefix, r.oracle_walk))
    assert summarize([eng.generate(PROMPTS[0], 40)])["tau_oracle_walk"] is None  # no reference, no oracle
    with pytest.raises(ValueError, match="reference"):
        eng.generate(PROMPTS[0], 4, temperature=1.0, reference=refs[0])
