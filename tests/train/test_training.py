"""Training: corpus cache, the three modes, exact resume, the serving checkpoint, the CLI and torchrun (DDP).
All on a tiny random Llama target built in a temp dir (vocab 100, hidden 64)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from safetensors.torch import load_file, save_file

from dcoco.modeling import checkpoint
from dcoco import cli
from dcoco.target import corpus as corpus_mod
from dcoco.train import recipe
from dcoco.testing import tiny
from helpers.torchrun import WRAPPER
from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.train.training import (Objective, Schedule, TrainConfig, _tau, frequent_tokens,
                                  sample_anchors, train)

TAPS = tiny.TAPS
SETTINGS = corpus_mod.CorpusSettings(TAPS, max_new_tokens=24, gen_batch=4, feat_batch=4)


def drafter_cfg(target):
    tok, model = target
    return recipe.drafter_config(model, tok, layers=1, target_layer_ids=list(TAPS), block_size=8)


def frozen(target):
    w = target[1].get_input_embeddings().weight.detach()
    return w, target[1].get_output_embeddings().weight.detach()


def small(**kw) -> TrainConfig:
    return TrainConfig(**{"anchors": 8, "num_candidates": 32, "width": 16, "mlp_hidden": 32, "seqs_per_step": 2,
                          "save_every": 1000, "log_every": 1000, **kw})


def test_corpus_contents_and_cache_hit(target, target_dir, corpus, monkeypatch):
    tok, model = target
    assert len(corpus) == 10 and corpus.feature_dim == 2 * 64 and corpus.hidden.dtype == torch.float16
    ids = corpus_mod.encode_prompts(tok, corpus_mod.load_prompts(target_dir / "prompts.jsonl"))
    for i in (0, 7):
        s = corpus[i]
        n = len(ids[i])
        assert s["ids"][:n].tolist() == ids[i] and not s["response"][:n].any() and s["response"][n:].all()
        resp = s["ids"][n:].tolist()
        assert 1 not in resp[:-1] and (resp[-1] == 1 or len(resp) == SETTINGS.max_new_tokens)
        with torch.no_grad():
            o = model(s["ids"][None], output_hidden_states=True)
        feats = torch.cat([o.hidden_states[t + 1][0] for t in TAPS], -1)
        torch.testing.assert_close(s["hidden"].float(), feats, atol=2e-3, rtol=2e-3)
        assert torch.equal(s["labels"][1:], o.logits[0, :-1].argmax(-1))
    # a second build is a cache hit: no generation at all
    monkeypatch.setattr(corpus_mod, "generate", lambda *a: pytest.fail("cache miss"))
    again = corpus_mod.build_corpus(model, ids, corpus.path.parent, SETTINGS, progress=False)
    assert again.path == corpus.path and torch.equal(again.hidden, corpus.hidden)
    other = corpus_mod.CorpusSettings(TAPS, max_new_tokens=23, gen_batch=4, feat_batch=4)
    assert corpus_mod.corpus_key(model, ids, other) != corpus.path.name


def test_corpus_features_resume_after_a_kill(target, target_dir, corpus, tmp_path, monkeypatch):
    """The features are memory-mapped from hidden.npy and filled batch by batch: a build killed part way resumes at
    the first batch not recorded, and ends with the same tensors as one uninterrupted build."""
    tok, model = target
    ids = corpus_mod.encode_prompts(tok, corpus_mod.load_prompts(target_dir / "prompts.jsonl"))
    responses = [corpus[i]["ids"][len(p):].tolist() for i, p in enumerate(ids)]
    settings = corpus_mod.CorpusSettings(TAPS, max_new_tokens=SETTINGS.max_new_tokens, feat_batch=1)
    calls, forward = [], type(model).forward

    def dies_at_the_70th(self, *a, **kw):  # batches are recorded as done every 64: 64 are on disk
        calls.append(1)
        if len(calls) == 70:
            raise KeyboardInterrupt
        return forward(self, *a, **kw)

    many = ids * 8  # 80 one-sequence batches
    monkeypatch.setattr(type(model), "forward", dies_at_the_70th)
    with pytest.raises(KeyboardInterrupt):
        corpus_mod.build_corpus(model, many, tmp_path, settings, progress=False, responses=responses * 8)
    (partial,) = tmp_path.glob("*.partial")
    assert json.loads((partial / "progress.json").read_text())["batches"] == 64
    calls.clear()
    c = corpus_mod.build_corpus(model, many, tmp_path, settings, progress=False, responses=responses * 8)
    assert len(calls) == 80 - 64 and not partial.exists() and isinstance(c.hidden, torch.Tensor)
    for k in (0, 3, 79):  # a resumed batch and a first-run one match the uninterrupted corpus
        s, ref = c[k], corpus[k % 10]
        assert torch.equal(s["ids"], ref["ids"]) and torch.equal(s["labels"], ref["labels"])
        torch.testing.assert_close(s["hidden"].float(), ref["hidden"].float(), atol=2e-3, rtol=2e-3)


def test_shipped_prompts():
    prompts = corpus_mod.load_prompts()
    assert len(prompts) >= 300 and len(set(prompts)) == len(prompts)


def test_anchors_tau_and_sharding(corpus):
    response = torch.tensor([0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    assert sample_anchors(response, 100, g).tolist() == [2, 3, 6, 7, 8]  # p and p+1 both in the response
    a = sample_anchors(response, 3, g)
    assert len(a) == 3 and a.tolist() == sorted(set(a.tolist()))
    sel = torch.tensor([[5, 6, 7], [5, 0, 7], [1, 6, 7], [5, 6, 7]])
    target = torch.tensor([[5, 6, 7]] * 4)
    valid = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    real = torch.tensor([True, True, True, False])
    assert float(_tau(sel, target, valid, real)) == 4 + 2 + 1  # the padded block does not count
    r0, r1 = (Schedule(corpus, 0, 2, 8, rank, 2) for rank in (0, 1))
    for step in (0, 1, r0.steps_per_epoch):
        b0, b1 = r0.batch(step), r1.batch(step)
        rows0, rows1 = ({tuple(x[x != 0].tolist()) for x in b["ids"]} for b in (b0, b1))
        assert not rows0 & rows1  # ranks see different sequences
        assert torch.equal(b0["anchors"], r0.batch(step)["anchors"])  # deterministic


@pytest.mark.parametrize("mode", ["drafter", "corrector", "joint"])
def test_each_mode_learns_a_repeated_batch(mode, target, corpus):
    embed, head = frozen(target)
    cfg = small(mode=mode)
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_cfg(target))
    corrector = Corrector(64, 32, 16, 32) if mode != "drafter" else None
    drafter.requires_grad_(mode != "corrector")
    out = _learns_a_repeated_batch(Objective(drafter, corrector, cfg), corpus, embed, head)
    assert ("tau_dcoco" in out) == (mode != "drafter") and float(out["blocks"]) > 0


def _learns_a_repeated_batch(obj: Objective, corpus, embed, head) -> dict:
    """12 AdamW steps on one batch lower the loss by 10% at least; returns the last step's outputs."""
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    opt = torch.optim.AdamW([p for p in obj.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(12):
        out = obj(batch, embed, head)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        losses.append(float(out["loss"].detach()))
    assert losses[-1] < 0.9 * losses[0], losses
    return out


def test_shortlisted_loss_learns_and_evaluates_on_the_whole_head(target, corpus):
    embed, head = frozen(target)
    vocab = frequent_tokens(corpus, 20)
    counts = torch.bincount(corpus.ids[corpus.response])
    assert len(vocab) == 20 and torch.equal(vocab, vocab.sort().values)
    assert counts[vocab].min() >= counts.sort(descending=True).values[19]  # the 20 most frequent
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_cfg(target))
    obj = Objective(drafter, None, small(mode="drafter", loss_vocab=20), vocab)
    _learns_a_repeated_batch(obj, corpus, embed, head)
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    with torch.no_grad():  # evaluation: the loss over every row of the head, as without a shortlist
        whole = Objective(drafter, None, small(mode="drafter"))(batch, embed, head)
        assert torch.equal(obj(batch, embed, head)["dflash"], whole["dflash"])
        assert torch.equal(obj(batch, embed, head)["tau_dflash"], whole["tau_dflash"])
    # a training step's tau is the shortlist's top-1 (its rows plus the batch's labels): logged apart, never as
    # the drafter's tau_dflash
    out = obj(batch, embed, head)
    assert "tau_shortlist" in out and "tau_dflash" not in out and float(out["tau_shortlist"]) > 0
    with pytest.raises(ValueError, match="loss_vocab: shortlists the DFlash loss"):
        TrainConfig(mode="corrector", loss_vocab=20)
    with pytest.raises(ValueError, match="loss_vocab: shortlists the DFlash loss"):
        TrainConfig(mode="joint", method="dspark", loss_vocab=20)


def test_shortlisted_joint_loss_keeps_the_whole_heads_candidates(target, corpus):
    """Joint mode with loss_vocab: the DFlash term is the shortlisted loss (drafter mode's), while the corrector
    re-selects among the whole head's top-K as without a shortlist: the same L_corr, tau and corrector gradient,
    and the drafter's gradient is the shortlisted loss's plus L_corr's."""
    embed, head = frozen(target)
    vocab = frequent_tokens(corpus, 20)
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    outs, grads = {}, {}
    for mode, short in (("joint", True), ("joint", False), ("drafter", True), ("drafter", False)):
        torch.manual_seed(0)
        drafter, corrector = DFlashDrafter(drafter_cfg(target)), Corrector(64, 32, 16, 32)
        torch.nn.init.normal_(corrector.mlp[2].weight)  # a live corrector: L_corr reaches the drafter
        obj = Objective(drafter, corrector if mode == "joint" else None,
                        small(mode=mode, loss_vocab=20 if short else None), vocab if short else None)
        out = outs[mode, short] = obj(batch, embed, head)
        out["loss"].backward()
        grads[mode, short] = ([p.grad for p in drafter.parameters()],
                              [p.grad for p in corrector.parameters()] if mode == "joint" else None)
    short, whole = outs["joint", True], outs["joint", False]
    assert "tau_shortlist" not in short
    for k in ("corr", "tau_dflash", "tau_dcoco"):
        torch.testing.assert_close(short[k], whole[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(short["dflash"], outs["drafter", True]["dflash"], rtol=0, atol=0)
    for a, b in zip(grads["joint", True][1], grads["joint", False][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for g, ds, jw, dw in zip(grads["joint", True][0], grads["drafter", True][0], grads["joint", False][0],
                             grads["drafter", False][0]):
        torch.testing.assert_close(g, ds + (jw - dw), rtol=1e-4, atol=1e-6)


def test_fresh_corrector_keeps_the_drafter_argmax(target, corpus):
    embed, head = frozen(target)
    torch.manual_seed(0)
    obj = Objective(DFlashDrafter(drafter_cfg(target)), Corrector(64, 32, 16, 32), small())
    with torch.no_grad():
        out = obj(Schedule(corpus, 0, 2, 8, 0, 1).batch(0), embed, head)
    assert float(out["tau_dcoco"]) == float(out["tau_dflash"])


def test_resume_reproduces_the_uninterrupted_run(target, corpus, tmp_path):
    embed, head = frozen(target)
    full = train(small(out=str(tmp_path / "a"), steps=6), corpus, embed, head, drafter_cfg(target), progress=False)
    part = train(small(out=str(tmp_path / "b"), steps=6, stop_at=3), corpus, embed, head, drafter_cfg(target),
                 progress=False)
    assert part.step == 3
    rest = train(small(out=str(tmp_path / "b"), steps=6, resume=True), corpus, embed, head, drafter_cfg(target),
                 progress=False)
    assert rest.step == 6 and [r["step"] for r in rest.history] == [4, 5, 6]
    for a, b in ((full.drafter, rest.drafter), (full.corrector, rest.corrector)):
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), k
    assert [r["loss"] for r in full.history[3:]] == [r["loss"] for r in rest.history]
    drafter, corrector = checkpoint.load(tmp_path / "b")  # the serving checkpoint: bfloat16, like z-lab's
    assert json.loads((tmp_path / "b" / "config.json").read_text())["dtype"] == "bfloat16"
    assert torch.equal(drafter.fc.weight, full.drafter.fc.weight.bfloat16())
    assert torch.equal(corrector.pair_proj.weight, full.corrector.pair_proj.weight.bfloat16())
    state = torch.load(tmp_path / "b" / "train_state.pt", weights_only=False)  # the training state: float32
    assert state["drafter"]["fc.weight"].dtype == torch.float32
    with pytest.raises(ValueError, match="seed"):
        train(small(out=str(tmp_path / "b"), steps=6, resume=True, seed=1), corpus, embed, head,
              drafter_cfg(target), progress=False)


def test_a_failed_background_save_stops_the_run(target, corpus, tmp_path, monkeypatch):
    def broken(*args, **kw):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save", broken)
    embed, head = frozen(target)
    with pytest.raises(RuntimeError, match="saving the checkpoint failed: OSError: disk full"):
        train(small(out=str(tmp_path / "f"), steps=2, save_every=1), corpus, embed, head, drafter_cfg(target),
              progress=False)


def test_gradient_accumulation_and_chunked_head(target, corpus, tmp_path):
    """grad_accum micro-batches per step (the step's record is their mean), and a run whose LM head is computed
    in 3-row chunks ends where the one-chunk run does."""
    embed, head = frozen(target)
    acc = train(small(out=str(tmp_path / "a"), steps=2, grad_accum=2, seqs_per_step=1), corpus, embed, head,
                drafter_cfg(target), progress=False)
    torch.manual_seed(0)
    obj = Objective(DFlashDrafter(drafter_cfg(target)), Corrector(64, 32, 16, 32), small(grad_accum=2))
    sched = Schedule(corpus, 0, 1, 8, 0, 1)
    with torch.no_grad():
        micro = [float(obj(sched.batch(k), embed, head)["loss"]) for k in (0, 1)]
    assert acc.history[0]["loss"] == pytest.approx(sum(micro) / 2, rel=1e-5)
    assert [r["step"] for r in acc.history] == [1, 2]
    with pytest.raises(ValueError, match="grad_accum"):
        train(small(out=str(tmp_path / "a"), steps=2, grad_accum=1, seqs_per_step=1, resume=True), corpus, embed,
              head, drafter_cfg(target), progress=False)
    one, chunked = (train(small(out=str(tmp_path / f"c{n}"), steps=3, logit_chunk=n), corpus, embed, head,
                          drafter_cfg(target), progress=False) for n in (None, 3))
    for x, y in zip(one.drafter.state_dict().values(), chunked.drafter.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    assert [r["loss"] for r in one.history] == pytest.approx([r["loss"] for r in chunked.history], rel=1e-5)


def test_gradient_checkpointing_same_gradients_fewer_saved_activations(target, corpus):
    """grad_checkpoint recomputes the drafter's layers in backward (GQA here: 4 query heads on 2 kv heads)."""
    embed, head = frozen(target)
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    grads, saved = {}, {}
    for remat in (False, True):
        torch.manual_seed(0)
        drafter = DFlashDrafter(drafter_cfg(target))
        drafter.grad_checkpoint = remat
        size = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: size.append(t.nbytes) or t, lambda t: t):  # noqa: B023 (called in this iteration)
            loss = Objective(drafter, None, small(mode="drafter"))(batch, embed, head)["loss"]
        loss.backward()
        grads[remat], saved[remat] = [p.grad for p in drafter.parameters()], sum(size)
    assert saved[True] < 0.8 * saved[False]
    assert all(torch.equal(a, b) for a, b in zip(grads[False], grads[True]))
    with pytest.raises(ValueError, match="grad_checkpoint"):
        small(grad_checkpoint="yes")


def test_corr_grad_weights_l_corr_in_the_drafter_gradient(target, corpus):
    """joint with corr_grad w: the drafter's gradient is the DFlash loss's plus w times L_corr's; the corrector's
    gradient does not depend on w. w = 0 gives the drafter-only gradient."""
    embed, head = frozen(target)
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    grads = {}
    for mode, w in (("drafter", 1.0), ("joint", 0.0), ("joint", 0.5), ("joint", 1.0)):
        torch.manual_seed(0)
        drafter, corrector = DFlashDrafter(drafter_cfg(target)), Corrector(64, 32, 16, 32)
        torch.nn.init.normal_(corrector.mlp[2].weight)  # a live corrector: L_corr reaches the drafter
        obj = Objective(drafter, corrector if mode == "joint" else None, small(mode=mode, corr_grad=w))
        obj(batch, embed, head)["loss"].backward()
        grads[mode, w] = ([p.grad for p in drafter.parameters()],
                          [p.grad for p in corrector.parameters()] if mode == "joint" else None)
    d0, d5, d1 = (grads["joint", w][0] for w in (0.0, 0.5, 1.0))
    assert all(torch.equal(a, b) for a, b in zip(d0, grads["drafter", 1.0][0]))
    assert all(torch.allclose(m, (a + b) / 2, rtol=1e-4, atol=1e-7) for m, a, b in zip(d5, d0, d1))
    assert not all(torch.equal(a, b) for a, b in zip(d0, d1))
    assert all(torch.equal(a, b) for a, b in zip(grads["joint", 0.0][1], grads["joint", 1.0][1]))
    with pytest.raises(ValueError, match="corr_grad"):
        small(corr_grad=1.5)


def test_held_out_sequences_are_never_trained_on_and_evaluated(target, corpus, tmp_path):
    sched = Schedule(corpus, 0, 2, 8, 0, 1, held_out=3)
    assert len(sched.held_out) == 3 and not set(sched.held_out) & set(sched.usable)
    assert sched.held_out == Schedule(corpus, 0, 1, 8, 1, 2, held_out=3).held_out  # any rank, any world size
    embed, head = frozen(target)
    res = train(small(out=str(tmp_path / "e"), steps=4, eval_sequences=3, eval_every=2), corpus, embed, head,
                drafter_cfg(target), progress=False)
    ev = [json.loads(x) for x in (tmp_path / "e" / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in ev] == [2, 4] and all(e["eval_blocks"] > 0 and e["eval_tau_dflash"] >= 1 for e in ev)
    assert "eval_tau_dcoco" in ev[0] and res.step == 4
    with pytest.raises(ValueError, match="eval_sequences"):
        Schedule(corpus, 0, 2, 8, 0, 1, held_out=len(corpus))


def test_export_drafter_only_and_dtype(target, tmp_path):
    torch.manual_seed(0)
    src = tmp_path / "src"
    drafter = DFlashDrafter(drafter_cfg(target))
    checkpoint.save(src, drafter, Corrector(64, 32, 16, 32))
    assert cli.main(["export", str(src), str(tmp_path / "plain"), "--drafter-only", "--dtype", "bfloat16"]) == 0
    d, c = checkpoint.load(tmp_path / "plain")
    assert c is None and d.fc.weight.dtype == torch.bfloat16 and torch.equal(d.fc.weight, drafter.fc.weight.bfloat16())
    cfg = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and "dcoco_config" not in cfg
    assert set(load_file(tmp_path / "plain" / "model.safetensors")) == set(drafter.state_dict())
    assert cli.main(["export", str(src), str(tmp_path / "same")]) == 0
    assert checkpoint.load(tmp_path / "same")[1] is not None
    with pytest.raises(SystemExit, match="source checkpoint"):
        cli.main(["export", str(src), str(src)])


def test_chat_template_thinking_off_and_dropped_prompts(target, capsys):
    tok, _ = target
    tok = __import__("copy").deepcopy(tok)
    tok.chat_template = ("{% for m in messages %}{{ m.content }}{% endfor %}"
                         "{% if enable_thinking is defined and not enable_thinking %} off{% endif %}")
    ids = corpus_mod.encode_prompts(tok, ["a b", "a b c d e f g h"], max_tokens=3)
    assert ids == [tok("a b off", add_special_tokens=False)["input_ids"]]  # thinking off by default
    assert "dropped 1 of 2 prompts longer than 3 tokens" in capsys.readouterr().out
    assert corpus_mod.encode_prompts(tok, ["a b"], thinking=True) == [tok("a b", add_special_tokens=False)["input_ids"]]


def test_serving_checkpoint_round_trip_and_broken_ones(target, tmp_path):
    torch.manual_seed(0)
    drafter, corrector = DFlashDrafter(drafter_cfg(target)), Corrector(64, 32, 16, 32)
    with torch.no_grad():
        corrector.mlp[2].weight.normal_()
    checkpoint.save(tmp_path / "dcoco", drafter, corrector)
    cfg = json.loads((tmp_path / "dcoco" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDCOCODraftModel"]
    assert cfg["dcoco_config"] == {"num_candidates": 32, "width": 16, "mlp_hidden": 32, "selection": "greedy"}
    assert "corrector.cand_proj.weight" in load_file(tmp_path / "dcoco" / "model.safetensors")
    d2, c2 = checkpoint.load(tmp_path / "dcoco")
    for a, b in ((drafter, d2), (corrector, c2)):
        assert a.state_dict().keys() == b.state_dict().keys()
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    checkpoint.save(tmp_path / "plain", drafter)
    d3, c3 = checkpoint.load(tmp_path / "plain")
    assert c3 is None and torch.equal(d3.fc.weight, drafter.fc.weight)
    assert DFlashDrafter.from_pretrained(tmp_path / "plain").config.to_dict() == drafter.config.to_dict()

    def broken(name, edit_cfg=None, edit_tensors=None, src="dcoco"):
        d = tmp_path / name
        d.mkdir()
        c = json.loads((tmp_path / src / "config.json").read_text())
        t = load_file(tmp_path / src / "model.safetensors")
        edit_cfg and edit_cfg(c)
        edit_tensors and edit_tensors(t)
        (d / "config.json").write_text(json.dumps(c))
        save_file(t, d / "model.safetensors")
        return d

    cases = [
        (broken("no_corr", edit_tensors=lambda t: t.pop("corrector.mlp.2.bias")), "missing.*corrector.mlp.2.bias"),
        (broken("extra", edit_tensors=lambda t: t.update({"corrector.x": torch.zeros(1)})), "unexpected.*corrector.x"),
        (broken("shape", edit_tensors=lambda t: t.update({"corrector.pair_proj.weight": torch.zeros(16, 64)})),
         "corrector.pair_proj.weight has shape"),
        (broken("no_cfg", edit_cfg=lambda c: c.pop("dcoco_config")), "dcoco_config"),
        (broken("bad_sel", edit_cfg=lambda c: c["dcoco_config"].update(selection="best")), "selection"),
        (broken("bad_width", edit_cfg=lambda c: c["dcoco_config"].update(width=0)), "width"),
        (broken("plain_arch", edit_cfg=lambda c: c.update(architectures=["DFlashDraftModel"])), "dcoco_config"),
        (broken("plain_with_corr", edit_cfg=lambda c: (c.update(architectures=["DFlashDraftModel"]),
                                                         c.pop("dcoco_config"))), "unexpected.*corrector"),
        (broken("drafter_missing", edit_tensors=lambda t: t.pop("fc.weight")), "missing.*fc.weight"),
        (broken("other_arch", edit_cfg=lambda c: c.update(architectures=["LlamaForCausalLM"])), "architectures"),
    ]
    for path, msg in cases:
        with pytest.raises(ValueError, match=msg):
            checkpoint.load(path)
    with pytest.raises(ValueError, match="hidden_size"):
        checkpoint.save(tmp_path / "x", drafter, Corrector(32, 8, 16, 32))
    with pytest.raises(TypeError, match="drafter"):
        checkpoint.save(tmp_path / "x", corrector)


def test_zlab_published_layout_as_init(target_dir, target, corpus, tmp_path):
    """A drafter in z-lab's published files (their config keys, bf16 tensors under their names, written by hand)
    starts a corrector run with --init; vLLM serves the same layout (test_vllm.py's plain DFlash drafter)."""
    torch.manual_seed(3)
    drafter = DFlashDrafter(drafter_cfg(target))
    tiny.save_zlab_drafter(tmp_path / "zlab", drafter)
    loaded, corrector = checkpoint.load(tmp_path / "zlab")
    assert corrector is None and loaded.config == drafter.config
    for k, v in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v.to(torch.bfloat16)), k
    args = tiny.train_args(target_dir, corpus.path.parent, tmp_path / "out", "--mode", "corrector", "--init",
                           str(tmp_path / "zlab"), "--steps", "2")
    assert cli.main(args) == 0
    trained, corrector = checkpoint.load(tmp_path / "out")
    assert corrector is not None and torch.equal(trained.fc.weight, loaded.fc.weight)  # frozen in corrector mode


def test_bad_arguments(target, corpus):
    embed, head = frozen(target)
    with pytest.raises(ValueError, match="mode"):
        TrainConfig(mode="both")
    with pytest.raises(ValueError, match="anchors"):
        TrainConfig(anchors=0)
    with pytest.raises(ValueError, match="drafter"):
        train(small(mode="corrector"), corpus, embed, head, drafter_cfg(target), progress=False)
    with pytest.raises(ValueError, match="embed"):
        train(small(), corpus, embed[:, :32], head, drafter_cfg(target), progress=False)
    with pytest.raises(ValueError, match="corpus"):
        train(small(seqs_per_step=11), corpus, embed, head, drafter_cfg(target), progress=False)


def test_cli_drafter_then_corrector(target_dir, corpus, tmp_path):
    cache = corpus.path.parent
    assert cli.main(tiny.train_args(target_dir, cache, tmp_path / "d", "--mode", "drafter", "--steps", "2")) == 0
    drafter, corrector = checkpoint.load(tmp_path / "d")
    assert corrector is None and drafter.config.mask_token_id == 88  # the first spare row: 88 tokens, vocab 100
    assert cli.main(tiny.train_args(target_dir, cache, tmp_path / "c", "--mode", "corrector", "--steps", "2",
                             "--init", str(tmp_path / "d"))) == 0
    d2, c2 = checkpoint.load(tmp_path / "c")
    assert c2 is not None and torch.equal(d2.fc.weight, drafter.fc.weight)  # the drafter stayed frozen
    log = [json.loads(x) for x in (tmp_path / "c" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and "tau_dcoco" in log[0]


def test_recipe_file_stages_overrides_and_rerun(target_dir, corpus, tmp_path, capsys):
    """A TOML recipe: its keys are the defaults, flags override them, stages run in order from the one before,
    a rerun skips finished stages, and unknown keys are named."""
    recipe = tmp_path / "r.toml"  # tiny.train_args as a recipe
    recipe.write_text(f"""
target = "{target_dir}"
prompts = "{target_dir / 'prompts.jsonl'}"
cache_dir = "{corpus.path.parent}"
max_new_tokens = 24
gen_batch = 4
feat_batch = 4
layers = 1
target_layers = {list(TAPS)}
block_size = 8
anchors = 8
candidates = 32
width = 16
mlp_hidden = 32
save_dtype = "float32"
lr = 1.0
[[stages]]
mode = "drafter"
steps = 2
out = "{tmp_path / 's1'}"
[[stages]]
mode = "corrector"
steps = 3
out = "{tmp_path / 's2'}"
""")
    argv = ["train", "--config", str(recipe), "--lr", "1e-3", "--no-progress"]
    assert cli.main(argv) == 0
    d1, c1 = checkpoint.load(tmp_path / "s1")
    d2, c2 = checkpoint.load(tmp_path / "s2")
    assert c1 is None and c2 is not None and torch.equal(d1.fc.weight, d2.fc.weight)  # stage 2 froze stage 1's
    assert torch.load(tmp_path / "s2" / "train_state.pt", weights_only=False)["config"]["lr"] == 1e-3  # flag won
    capsys.readouterr()
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.count("done, skipped") == 2
    records = {stage: (tmp_path / stage / "done.json").read_text() for stage in ("s1", "s2")}
    for stage in ("s1", "s2"):  # kept without the optimizer or the stage record: the weights, progress.json, logs
        (tmp_path / stage / "train_state.pt").unlink()
        (tmp_path / stage / "done.json").unlink()
    capsys.readouterr()
    assert cli.main(argv) == 0  # both saved at their stage's last step
    assert capsys.readouterr().out.count("done, skipped") == 2
    assert records == {stage: (tmp_path / stage / "done.json").read_text() for stage in ("s1", "s2")}  # recorded
    for stage in ("s1", "s2"):  # the weights and logs alone: done when the log reached the stage's steps
        (tmp_path / stage / "progress.json").unlink()
        (tmp_path / stage / "done.json").unlink()
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.count("done, skipped") == 2
    (tmp_path / "s2" / "done.json").unlink()
    log = tmp_path / "s2" / "log.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))  # cut short, kept without its state
    with pytest.raises(SystemExit, match="s2 holds another run"):
        cli.main(argv)
    recipe.write_text(recipe.read_text() + "colour = 3\n")
    with pytest.raises(SystemExit, match="unknown key.*colour"):
        cli.main(argv)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["fused", "native"])
def test_torchrun_two_cpu_ranks_end_equal(target_dir, corpus, tmp_path, backend):
    """DDP with gloo, joint training, on each backend (DCOCO_BACKEND reaches every rank)."""
    (tmp_path / "w.py").write_text(WRAPPER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "DCOCO_BACKEND": backend}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(tmp_path / "w.py"),
           str(tmp_path), *tiny.train_args(target_dir, corpus.path.parent, tmp_path / "out", "--mode", "joint",
                                           "--seqs-per-step", "1", "--steps", "4", "--stop-at", "3")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    sums = [(tmp_path / f"rank{i}.txt").read_text() for i in (0, 1)]
    assert sums[0] == sums[1] and sums[0].endswith(" " + backend)
    state = torch.load(tmp_path / "out" / "train_state.pt", weights_only=False)
    assert state["world"] == 2 and state["step"] == 3
    assert len((tmp_path / "out" / "log.jsonl").read_text().splitlines()) == 3  # rank 0 only
    # resumed on one rank: the same global batch (1 sequence x 2 ranks = 2 x 1) sees the same sequences
    one_rank = tiny.train_args(target_dir, corpus.path.parent, tmp_path / "out", "--mode", "joint", "--steps", "4",
                               "--resume")
    with pytest.raises(SystemExit, match="dcoco train: resume: .*global batch"):
        cli.main([*one_rank, "--seqs-per-step", "1"])
    assert cli.main([*one_rank, "--seqs-per-step", "2"]) == 0
    assert torch.load(tmp_path / "out" / "train_state.pt", weights_only=False)["step"] == 4


def test_schedule_depends_on_the_global_batch_only(corpus):
    whole = Schedule(corpus, 0, 2, 8, 0, 1)
    for step in (0, 1, whole.steps_per_epoch + 1):
        halves = [Schedule(corpus, 0, 1, 8, rank, 2).batch(step) for rank in (0, 1)]
        b = whole.batch(step)
        for i, half in enumerate(halves):  # rank r gets sequence r of the global batch, with the same anchors
            assert torch.equal(half["ids"][0, :b["ids"].shape[1]], b["ids"][i, :half["ids"].shape[1]])
            assert torch.equal(half["anchors"][0], b["anchors"][i, :half["anchors"].shape[1]])


def test_frozen_cache_keeps_what_evaluation_feeds(target, corpus):
    """The frozen correctors' cached hidden states are the drafter's float32 outputs, as the engine feeds them."""
    from dcoco.train import frozen as frozen_mod

    embed, head = frozen(target)
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_cfg(target)).eval()
    cache = frozen_mod.build(drafter, corpus, embed, head, num_candidates=8, anchors=4, progress=False)
    assert cache["hidden"].dtype == torch.float32
    s = corpus[0]
    a = sample_anchors(s["response"], 4, frozen_mod._gen(0, 0))
    with torch.no_grad():
        h = drafter(s["ids"][None].long(), s["hidden"][None], a[None], embed)[0, :, 1:]
    assert torch.equal(cache["hidden"][:len(a)], h)



def anchor_corrector(seed: int = 0) -> Corrector:
    torch.manual_seed(seed)
    c = Corrector(64, 32, 16, 32, anchor_transition=True)
    with torch.no_grad():
        c.mlp[2].weight.normal_()  # active: it re-ranks slot 1
    return c


def test_anchor_transition_trains_through_the_anchor_state(target, corpus):
    """The joint objective with the anchor transition: L_corr gains the slot-1 term (literal check against the
    loss built by hand from the drafter's block), learns a repeated batch, and its gradient reaches the drafter
    through the anchor position's hidden state."""
    from dcoco.loss import correction_loss

    embed, head = frozen(target)
    torch.manual_seed(0)
    drafter, corrector = DFlashDrafter(drafter_cfg(target)), anchor_corrector()
    cfg = small(anchor_transition=True)
    obj = Objective(drafter, corrector, cfg)
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    out = obj(batch, embed, head)
    (N, A), S = batch["anchors"].shape, batch["ids"].shape[1]
    block = drafter(batch["ids"], batch["hidden"], batch["anchors"], embed).reshape(N * A, 8, -1)
    vals, ids = DFlashDrafter.compute_logits(block[:, 1:], head).float().topk(32, -1)
    pos = batch["anchors"][..., None] + torch.arange(1, 8)
    at = pos.clamp(max=S - 1).view(N, -1)
    target_ids = batch["labels"].gather(1, at).view(N * A, 7)
    valid = ((pos < S) & batch["response"].gather(1, at).view(N, A, -1)).view(N * A, -1) & \
        batch["anchor_ok"].reshape(-1)[:, None]
    first, grid = corrector.walk_inputs(corrector.score(block, ids, vals, embed, batch["ids"].gather(
        1, batch["anchors"]).reshape(-1)), vals)
    want = correction_loss(grid, ids, target_ids, valid, cfg.rho, first)
    torch.testing.assert_close(out["corr"], want)
    assert not torch.allclose(want, correction_loss(grid, ids, target_ids, valid, cfg.rho))  # the term counts
    h = drafter(batch["ids"], batch["hidden"], batch["anchors"], embed)
    g = torch.autograd.grad(corrector.score(h.reshape(N * A, 8, -1), ids, vals.detach(), embed,
                                            batch["ids"].gather(1, batch["anchors"]).reshape(-1)).sum(), h)[0]
    assert g[:, :, 0].abs().sum() > 0  # the anchor's state is an input of the scores
    _learns_a_repeated_batch(Objective(DFlashDrafter(drafter_cfg(target)), anchor_corrector(1), cfg), corpus, embed,
                             head)


def test_anchor_transition_at_init_keeps_the_drafter_argmax_and_must_match_the_config(target, corpus):
    embed, head = frozen(target)
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_cfg(target))
    obj = Objective(drafter, Corrector(64, 32, 16, 32, anchor_transition=True), small(anchor_transition=True))
    with torch.no_grad():
        out = obj(Schedule(corpus, 0, 2, 8, 0, 1).batch(0), embed, head)
    assert float(out["tau_dcoco"]) == float(out["tau_dflash"])
    with pytest.raises(ValueError, match="anchor_transition"):
        train(small(steps=1, mode="corrector"), corpus, embed, head, drafter, anchor_corrector(), progress=False)


def test_anchor_checkpoint_round_trip_and_frozen_training(target, corpus, tmp_path):
    from dcoco.train import frozen as frozen_mod

    embed, head = frozen(target)
    torch.manual_seed(0)
    drafter, corrector = DFlashDrafter(drafter_cfg(target)), anchor_corrector()
    checkpoint.save(tmp_path / "anchor", drafter, corrector)
    dc = json.loads((tmp_path / "anchor" / "config.json").read_text())["dcoco_config"]
    assert dc["anchor_transition"] is True
    _, c2 = checkpoint.load(tmp_path / "anchor")
    assert c2.anchor_transition and all(torch.equal(c2.state_dict()[k], v) for k, v in corrector.state_dict().items())
    cfg_path = tmp_path / "anchor" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dcoco_config"]["anchor_transition"] = "yes"
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="dcoco_config.anchor_transition"):
        checkpoint.load(tmp_path / "anchor")
    # the frozen cache keeps the anchor's state; a cache written without it is built again
    path = tmp_path / "drafts.safetensors"
    cache = frozen_mod.build(drafter.eval(), corpus, embed, head, num_candidates=32, anchors=4, path=path,
                             progress=False)
    s = corpus[0]
    a = sample_anchors(s["response"], 4, frozen_mod._gen(0, 0))
    with torch.no_grad():
        h0 = drafter(s["ids"][None].long(), s["hidden"][None], a[None], embed)[0, :, 0]
    assert torch.equal(cache["anchor_hidden"][:len(a)], h0)
    save_file({k: v for k, v in cache.items() if k != "anchor_hidden"}, str(path))
    assert set(frozen_mod.build(drafter, corpus, embed, head, num_candidates=32, anchors=4, path=path,
                                progress=False)) == set(frozen_mod.KEYS)
    info = frozen_mod.train(corrector, cache, embed, head, 3, batch=8, progress=False)
    assert info["steps"] == 3 and info["final_loss"] > 0
