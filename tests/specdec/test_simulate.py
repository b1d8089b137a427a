"""Simulated greedy decoding (simulate.py) against the engine's real decode, round by round and metric by metric,
for plain DFlash, every corrector rule, the DFlash2 selector and Domino's and DSpark's heads (greedy losslessness
included); teacher-forced
coverage; references over suites."""

from __future__ import annotations


import itertools

import pytest
import torch

pytest.importorskip("transformers", reason="the engine needs transformers (pip install '.[demo]')")

from helpers.tiny_models import BS, PROMPTS, corrector, dflash_cfg

from dcoco.modeling.dflash import DFlashDrafter
from dcoco.modeling.domino import DominoHead
from dcoco.modeling.dspark import DSparkHead
from dcoco.modeling.selector import CandidateSelector
from dcoco.specdec.simulate import simulate
from dcoco.specdec.engine import KS, Engine, Result, summarize, target_only

FIELDS = ("tokens", "committed", "accepted", "oracle_walk", "oracle_prefix", "trans_hits", "trans_seen")


class Scripted(DFlashDrafter):
    """Drafts the continuation of seq after each anchor, one slot wrong (the right token second) at anchors
    C % 3 == 0, through the blocks
    path both decoding (draft) and simulation (forward) use: hidden states whose LM-head logits are 3 at the
    scripted token and seeded noise below it (V <= d: W pinv(W) = I)."""

    def __init__(self, head: torch.Tensor):
        super().__init__(dflash_cfg(head.shape[0]))
        self.pinv, self.seq = torch.linalg.pinv(head), []

    def _blocks(self, anchor_ids, target_hidden, anchors, embed):
        V = self.pinv.shape[1]
        out = torch.zeros(*anchors.shape, BS, self.pinv.shape[0])
        for (n, a), C in zip(((n, a) for n in range(anchors.shape[0]) for a in range(anchors.shape[1])),
                             anchors.flatten().tolist()):
            want = (self.seq[C + 1:C + BS] + [0] * BS)[:BS - 1]
            logits = torch.rand(BS - 1, V, generator=torch.Generator().manual_seed(C))
            if C % 3 == 0:  # the right token becomes the runner-up
                logits[C % (BS - 1), want[C % (BS - 1)]] = 2.0
                want[C % (BS - 1)] = (want[C % (BS - 1)] + 1) % V
            logits[torch.arange(BS - 1), torch.tensor(want)] = 3.0
            out[n, a, 1:] = logits @ self.pinv.T
        return out


def selector(seed: int = 0) -> CandidateSelector:
    torch.manual_seed(seed)
    s = CandidateSelector(64, 64, rank=8, num_candidates=8)
    torch.nn.init.normal_(s.succ.weight, std=2.0)  # non-zero: it does re-pick candidates, slot 1 included
    return s.eval()


def baselines(seed: int = 0) -> list:
    """Domino's and DSpark's heads with their zero-initialised output layers drawn, so they re-pick tokens."""
    torch.manual_seed(seed)
    domino, dspark = DominoHead(64, 64, 64, gru_size=16, mid_size=16), DSparkHead(64, 64, rank=8)
    torch.nn.init.normal_(domino.out.weight, std=2.0)
    torch.nn.init.normal_(dspark.markov_w2.weight, std=2.0)
    return [domino.eval(), dspark.eval()]


def engines(target, drafter, eos=None):
    yield Engine(target, drafter, eos_token_id=eos)
    for rule, anchor in itertools.product(("greedy", "global", "geometric"), (False, True)):
        yield Engine(target, drafter, corrector(anchor=anchor), rule=rule, num_candidates=8, eos_token_id=eos)
    yield Engine(target, drafter, selector(), num_candidates=8, eos_token_id=eos)
    for head in baselines():
        yield Engine(target, drafter, head, num_candidates=8, eos_token_id=eos)


def same(sim: Result, real: Result) -> None:
    for f in FIELDS:
        assert getattr(sim, f) == getattr(real, f), f
    assert torch.equal(sim.cover_hits, real.cover_hits) and torch.equal(sim.cover_seen, real.cover_seen)


@pytest.mark.parametrize("kind", ["scripted", "random"])
def test_simulation_equals_decoding(target, refs, kind):
    torch.manual_seed(3)
    head = target.get_output_embeddings().weight.detach()
    drafter = Scripted(head) if kind == "scripted" else DFlashDrafter(dflash_cfg(64)).eval()
    for eng in engines(target, drafter):
        taus = []
        for p, ref in zip(PROMPTS, refs):
            drafter.seq = p + ref
            for n in (1, 2, 7, 23, 40):
                sim = simulate(eng, p, ref, n, chunk=5)  # several drafter passes per prompt
                same(sim, eng.generate(p, n, reference=ref))
                assert sim.tokens == ref[:n]  # the decode was lossless
                taus.append(summarize([sim])["tau"])
        if kind == "scripted" and eng.corrector is None:
            assert max(t for t in taus if t) > 2.5  # long accepted runs, not only rejections


def test_simulation_stops_at_eos(target, refs):
    head = target.get_output_embeddings().weight.detach()
    drafter = Scripted(head)
    eos = refs[0][9]
    base = target_only(target, PROMPTS[0], 40, eos_token_id=eos).tokens
    drafter.seq = PROMPTS[0] + refs[0]
    for eng in engines(target, drafter, eos):
        sim, real = simulate(eng, PROMPTS[0], base, 40), eng.generate(PROMPTS[0], 40, reference=base)
        assert sim.tokens == real.tokens == base and sim.committed == real.committed


def test_teacher_forced_coverage(target, refs):
    head = target.get_output_embeddings().weight.detach()
    drafter = Scripted(head)
    drafter.seq = PROMPTS[1] + refs[1]
    r = simulate(Engine(target, drafter, eos_token_id=None), PROMPTS[1], refs[1], 40)
    T = 40
    assert r.tf_seen.tolist() == [T - 1 - i for i in range(BS - 1)]  # every anchor, slots with a reference token
    assert (r.tf_hits[:, 1:] >= r.tf_hits[:, :-1]).all() and (r.tf_hits <= r.tf_seen[:, None]).all()
    # one slot wrong at anchors C % 3 == 0 (C = len(prompt) + L - 1): top-1 misses exactly those slots
    C = torch.arange(len(PROMPTS[1]), len(PROMPTS[1]) + T - 1)
    wrong = torch.zeros(T - 1, BS - 1, dtype=torch.bool)
    wrong[(C % 3 == 0).nonzero()[:, 0], (C % (BS - 1))[C % 3 == 0]] = True
    valid = torch.arange(T - 1)[:, None] + torch.arange(1, BS) < T
    assert r.tf_hits[:, 0].tolist() == (valid & ~wrong).sum(0).tolist()
    assert r.tf_hits[:, KS.index(2)].tolist() == valid.sum(0).tolist()  # the right token is the runner-up
    s = summarize([r])
    assert s["coverage_tf_seen"] == r.tf_seen.tolist() and s["coverage_tf"][2] == [1.0] * (BS - 1)


def test_simulation_rejects_a_bad_reference(target, refs):
    eng = Engine(target, DFlashDrafter(dflash_cfg(64)).eval(), eos_token_id=None)
    with pytest.raises(ValueError, match="reference"):
        simulate(eng, PROMPTS[0], refs[0][:10], 20)  # too short for max_new_tokens, no eos
    with pytest.raises(ValueError, match="reference"):
        simulate(eng, PROMPTS[0], [], 20)
    with pytest.raises(ValueError, match="max_new_tokens"):
        simulate(eng, PROMPTS[0], refs[0], 0)


def test_suites_references_cached_and_report(target, refs, tmp_path, monkeypatch):
    from dcoco.specdec import simulate as sim

    suites = {"a": [PROMPTS[0], PROMPTS[1]], "b": [PROMPTS[1]]}
    got = sim.references(target, suites, 40, [], tmp_path, progress=False)
    assert got == {"a": [refs[0], refs[1]], "b": [refs[1]]}
    eos = refs[0][9]  # batched generation (padded), checked against the one-prompt pass
    batched = sim.references(target, suites, 40, [eos], None, progress=False)
    assert batched == {n: [target_only(target, p, 40, eos_token_id=eos).tokens for p in ps] for n, ps in suites.items()}
    assert batched["a"][0][-1] == eos
    monkeypatch.setattr("dcoco.specdec.engine.target_only", lambda *a, **k: pytest.fail("not read from the cache"))
    assert sim.references(target, suites, 40, [], tmp_path, progress=False) == got
    head = target.get_output_embeddings().weight.detach()
    drafter = Scripted(head)
    drafter.seq = PROMPTS[1] + refs[1]  # right on prompt 1, wrong (mostly) on prompt 0
    engines = {"DFlash": Engine(target, drafter, eos_token_id=None),
               "selector": Engine(target, drafter, selector(), num_candidates=8, eos_token_id=None)}
    per = sim.simulate_all(engines, suites, got, 40, progress=False)  # one target and drafter pass per prompt
    for m, e in engines.items():
        for n, ps in suites.items():
            for p, r, res in zip(ps, got[n], per[m][n]):
                same(res, simulate(e, p, r, 40))
    rep = sim.report(per, "DFlash")
    assert set(rep) == set(engines) and set(rep["DFlash"]["suites"]) == {"a", "b"}
    o = rep["selector"]["overall"]
    assert o["prompts"] == 3 and o["ratio_ci"][0] <= o["ratio"] <= o["ratio_ci"][1]
    assert rep["DFlash"]["suites"]["b"]["tau_ci"] is None  # one prompt: no interval
    assert rep["DFlash"]["suites"]["b"]["tau"] > rep["DFlash"]["suites"]["a"]["tau"]


def test_the_baseline_heads_re_pick_tokens(target):
    """Domino's and DSpark's drafts in Engine.draft are theirs, not the drafter's argmax (which the
    simulation-equals-decoding check would pass with too)."""
    drafter = DFlashDrafter(dflash_cfg(64)).eval()
    h = torch.randn(4, BS, 64, generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([1, 2, 3, 4])
    for head in baselines():
        drafted, ids, _, _ = Engine(target, drafter, head, num_candidates=8, eos_token_id=None).draft(h, anchors)
        assert drafted.shape == ids.shape[:2] and (drafted != ids[..., 0]).any(), type(head).__name__
