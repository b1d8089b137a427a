"""The paper's baselines trained by `dcoco train` (--method domino|dspark): each head's own objective on the drafter's
logits over the whole vocabulary, on a frozen drafter (corrector mode) or with it (joint mode: the method's
published recipe), their checkpoints, resume and CLI. On the tiny random Llama target (vocab 100, hidden 64)."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from dcoco import cli
from dcoco.corrector import Corrector
from dcoco.modeling import checkpoint
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.modeling.domino import DominoHead, curriculum
from dcoco.modeling.dspark import DSparkHead
from dcoco.testing import tiny
from dcoco.train import recipe
from dcoco.train.training import Objective, Schedule, TrainConfig, train

D, V = 64, 100
HEADS = {"domino": lambda: DominoHead(D, D, V, 24, 16), "dspark": lambda: DSparkHead(D, V, 12)}


def weights(target):
    model = target[1]
    return model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()


def drafter(target, seed: int = 0) -> DFlashDrafter:
    tok, model = target
    torch.manual_seed(seed)
    return DFlashDrafter(recipe.drafter_config(model, tok, layers=1, target_layer_ids=list(tiny.TAPS), block_size=8))


def trained_head(method: str, seed: int = 1):
    """A head whose correction moves the argmax (a fresh one starts at zero)."""
    torch.manual_seed(seed)
    head = HEADS[method]()
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(std=0.3)
    return head


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"anchors": 8, "seqs_per_step": 2, "save_every": 1000, "log_every": 1000, **kw})


@pytest.mark.parametrize("method", ["domino", "dspark"])
@pytest.mark.parametrize("mode", ["corrector", "joint"])
def test_the_objective_is_the_heads_own_loss_on_the_drafters_logits(method, mode, target, corpus):
    """Against the head's loss on block outputs computed here, slot by slot from the batch: loss, teacher-forced tau
    of the backbone and of the head, the DFlash loss logged; the drafter gets a gradient in joint mode only."""
    embed, lm_head = weights(target)
    d, head = drafter(target), trained_head(method)
    obj = Objective(d, head, cfg(mode=mode, method=method, gamma=3.0))
    obj.done = 0.25
    batch = Schedule(corpus, 0, 2, 8, 0, 1).batch(0)
    out = obj(batch, embed, lm_head)
    out["loss"].backward()
    assert (d.fc.weight.grad is not None) == (mode == "joint")
    assert all(p.grad is not None for p in head.parameters())

    ids, anchors, labels = batch["ids"], batch["anchors"], batch["labels"]
    S, B = ids.shape[1], 7
    hs, Us, prevs, targets, valids, real = [], [], [], [], [], []
    with torch.no_grad():
        block = d(ids, batch["hidden"], anchors, embed)
    for n in range(anchors.shape[0]):
        for a in range(anchors.shape[1]):
            p = int(anchors[n, a])
            pos = [p + j for j in range(1, B + 1)]
            ok = [q < S and bool(batch["response"][n, q]) and bool(batch["anchor_ok"][n, a]) for q in pos]
            tgt = [int(labels[n, q]) if good else 0 for q, good in zip(pos, ok)]
            hs.append(block[n, a, 1:])
            Us.append(block[n, a, 1:].double() @ lm_head.double().T)
            prevs.append(int(ids[n, p]))
            targets.append(tgt)
            valids.append(ok)
            real.append(bool(batch["anchor_ok"][n, a]))
    h, U = torch.stack(hs), torch.stack(Us).float()
    anchor_ids, tgt = torch.tensor(prevs), torch.tensor(targets)
    valid = torch.tensor(valids)
    with torch.no_grad():
        if method == "domino":
            want, picks = head.loss(h, U, anchor_ids, tgt, valid, embed, curriculum(0.25, 1), 3.0)
        else:
            want, picks = head.loss(h, U, anchor_ids, tgt, valid, gamma=3.0)
    assert math.isclose(float(out["loss"].detach()), float(want), rel_tol=1e-4)

    def tau(sel) -> float:
        total = 0
        for r in range(len(real)):
            if real[r]:
                run = 0
                while run < B and valid[r, run] and int(sel[r, run]) == int(tgt[r, run]):
                    run += 1
                total += run + 1
        return float(total)

    assert float(out["tau_dflash"]) == tau(U.argmax(-1))
    assert float(out["tau_head"]) == tau(picks)
    ce = [math.exp(-k / 3.0) * float(-U[r, k].double().log_softmax(-1)[tgt[r, k]])
          for r in range(len(real)) for k in range(B) if valid[r, k]]
    w = [math.exp(-k / 3.0) for r in range(len(real)) for k in range(B) if valid[r, k]]
    assert math.isclose(float(out["dflash"]), sum(ce) / sum(w), rel_tol=1e-4)


@pytest.mark.parametrize("method", ["domino", "dspark"])
def test_a_heads_run_resumes_exactly_and_saves_in_its_layout(method, target, corpus, tmp_path):
    """Joint mode: the uninterrupted run and one stopped and resumed end equal; the serving checkpoint loads as
    (drafter, head) (DSpark: vLLM's Qwen3 DSpark layout); Domino's curriculum starts at lam = 1, where its loss
    is the backbone's DFlash loss."""
    embed, lm_head = weights(target)
    full = train(cfg(mode="joint", method=method, steps=4, out=str(tmp_path / "a")), corpus, embed, lm_head,
                 drafter(target), progress=False)
    assert isinstance(full.corrector, DSparkHead if method == "dspark" else DominoHead)
    assert all("tau_head" in r and "tau_dcoco" not in r for r in full.history)
    if method == "domino":
        assert math.isclose(full.history[0]["loss"], full.history[0]["dflash"], rel_tol=1e-5)
        assert full.corrector.out.weight.abs().max() > 0  # a fresh head's correction starts at zero
    train(cfg(mode="joint", method=method, steps=4, stop_at=2, out=str(tmp_path / "b")), corpus, embed, lm_head,
          drafter(target), progress=False)
    rest = train(cfg(mode="joint", method=method, steps=4, resume=True, out=str(tmp_path / "b")), corpus, embed,
                 lm_head, drafter(target), progress=False)
    assert [r["step"] for r in rest.history] == [3, 4]
    assert [r["loss"] for r in rest.history] == [r["loss"] for r in full.history[2:]]
    for a, b in ((full.drafter, rest.drafter), (full.corrector, rest.corrector)):
        for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), k
    arch = json.loads((tmp_path / "b" / "config.json").read_text())["architectures"]
    assert arch == [checkpoint.DSPARK_ARCHITECTURE if method == "dspark" else checkpoint.DOMINO_ARCHITECTURE]
    d, head = checkpoint.load(tmp_path / "b")
    assert type(head) is type(full.corrector)
    for (k, x), y in zip(full.corrector.state_dict().items(), head.state_dict().values()):
        assert torch.equal(x.bfloat16(), y), k
    assert torch.equal(d.fc.weight, full.drafter.fc.weight.bfloat16())
    with pytest.raises(ValueError, match="method"):
        train(cfg(mode="joint", steps=4, resume=True, out=str(tmp_path / "b")), corpus, embed, lm_head,
              drafter(target), progress=False)


def test_the_domino_layout_round_trips_and_names_what_is_broken(target, tmp_path):
    d, head = drafter(target), trained_head("domino")
    checkpoint.save(tmp_path / "ok", d, head, dtype=torch.float32)
    d2, h2 = checkpoint.load(tmp_path / "ok")
    assert isinstance(h2, DominoHead) and (h2.gru_size, h2.mid_size) == (24, 16)
    for a, b in ((d, d2), (head, h2)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    cfg_path = tmp_path / "ok" / "config.json"
    c = json.loads(cfg_path.read_text())
    c["domino_config"]["gru_size"] = 0
    cfg_path.write_text(json.dumps(c))
    with pytest.raises(ValueError, match=r"domino_config.gru_size: expected an integer >= 1"):
        checkpoint.load(tmp_path / "ok")
    c["domino_config"]["gru_size"] = 32
    cfg_path.write_text(json.dumps(c))
    with pytest.raises(ValueError, match="Domino head tensors do not match domino_config"):
        checkpoint.load(tmp_path / "ok")
    with pytest.raises(ValueError, match="head: vocab_size 50 differs from the drafter's 100"):
        checkpoint.save(tmp_path / "x", d, DominoHead(D, D, 50, 8, 8))
    with pytest.raises(ValueError, match="embed_size 32 differs"):
        checkpoint.save(tmp_path / "x", d, DominoHead(D, 32, V, 8, 8))


def test_bad_settings_are_named(target, corpus, tmp_path):
    embed, lm_head = weights(target)
    with pytest.raises(ValueError, match="method: 'domino' trains a head beside the drafter"):
        TrainConfig(mode="drafter", method="domino")
    with pytest.raises(ValueError, match="anchor_transition: DCOCO's corrector only"):
        TrainConfig(mode="joint", method="dspark", anchor_transition=True)
    with pytest.raises(ValueError, match="method: expected one of"):
        TrainConfig(method="medusa")
    with pytest.raises(ValueError, match="method 'domino' trains a DominoHead, got a Corrector"):
        train(cfg(mode="joint", method="domino", steps=1, out=str(tmp_path / "c")), corpus, embed, lm_head,
              drafter(target), Corrector(D, 16, 16, 32), progress=False)
    with pytest.raises(ValueError, match="a DSparkHead for hidden_size 64 and vocab_size 50"):
        train(cfg(mode="joint", method="dspark", steps=1, out=str(tmp_path / "c")), corpus, embed, lm_head,
              drafter(target), DSparkHead(D, 50, 8), progress=False)


def test_cli_trains_a_dspark_head_on_a_frozen_drafter_then_jointly(target_dir, corpus, tmp_path):
    """--method on the command line: a head on the frozen drafter (corrector mode, the drafter unchanged), then
    the published recipe from that checkpoint (--init: drafter and head)."""
    cache = corpus.path.parent

    def run(out: str, *extra: str) -> int:
        return cli.main(tiny.train_args(target_dir, cache, tmp_path / out, "--steps", "2", *extra))

    assert run("d", "--mode", "drafter") == 0
    assert run("frozen", "--mode", "corrector", "--method", "dspark", "--init", str(tmp_path / "d")) == 0
    d0, _ = checkpoint.load(tmp_path / "d")
    d1, h1 = checkpoint.load(tmp_path / "frozen")
    assert isinstance(h1, DSparkHead) and torch.equal(d0.fc.weight, d1.fc.weight)
    assert run("joint", "--mode", "joint", "--method", "dspark", "--init", str(tmp_path / "frozen")) == 0
    d2, h2 = checkpoint.load(tmp_path / "joint")
    assert not torch.equal(d1.fc.weight, d2.fc.weight) and not torch.equal(h1.markov_w2.weight, h2.markov_w2.weight)
    log = [json.loads(x) for x in (tmp_path / "joint" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and "tau_head" in log[0]
