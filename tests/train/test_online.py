"""Online target features (target/features.py): the frozen target run per batch equals the feature cache, trains like
it, and shards over torchrun ranks (FSDP2 with gloo) without changing a bit. On the tiny random Llama target."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="training needs the demo extra (pip install '.[demo]')")

from dcoco import cli
from dcoco.cli import train_cmd
from dcoco.target import corpus as corpus_mod
from dcoco.train import recipe
from dcoco.testing import tiny
from dcoco.target.features import TargetFeatures, TokenCorpus
from dcoco.train.training import Schedule, TrainConfig, collate, train
from helpers.torchrun import WRAPPER

SETTINGS = corpus_mod.CorpusSettings(tiny.TAPS, max_new_tokens=24, gen_batch=4, feat_batch=4)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return tiny.save_target(tmp_path_factory.mktemp("target"), prompts=12)


@pytest.fixture(scope="module")
def target(target_dir):
    return recipe.load_target(str(target_dir))


@pytest.fixture(scope="module")
def prompt_ids(target, target_dir):
    return corpus_mod.encode_prompts(target[0], corpus_mod.load_prompts(target_dir / "prompts.jsonl"))


@pytest.fixture(scope="module")
def cache(target, prompt_ids, tmp_path_factory):
    return corpus_mod.build_corpus(target[1], prompt_ids, tmp_path_factory.mktemp("cache"), SETTINGS, progress=False)


def pairs_of(cache) -> list[tuple[list[int], list[int]]]:
    out = []
    for i in range(len(cache)):
        s = cache[i]
        n = int((~s["response"]).sum())
        out.append((s["ids"][:n].tolist(), s["ids"][n:].tolist()))
    return out


@pytest.fixture(scope="module")
def data_dir(cache, tmp_path_factory) -> Path:
    """The cache's sequences as a `dcoco data generate` folder (token ids only)."""
    d = tmp_path_factory.mktemp("data")
    recs = [{"source": "t.jsonl", "row": i, "samples": [{"prompt_ids": p, "response_ids": r, "finish": "stop"}]}
            for i, (p, r) in enumerate(pairs_of(cache))]
    (d / "shard-0-of-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def test_features_equal_the_cache(target, cache):
    feats = TargetFeatures(target[1], list(tiny.TAPS), torch.device("cpu"))
    tokens = TokenCorpus(pairs_of(cache))
    assert len(tokens) == len(cache) and feats.feature_dim == cache.feature_dim
    idx = list(range(len(cache)))[:5]
    b = collate([tokens[i] for i in idx], [torch.tensor([0])] * len(idx))
    out = feats(b["ids"])
    assert out["hidden"].shape == (*b["ids"].shape, cache.feature_dim) and out["labels"].shape == b["ids"].shape
    for j, i in enumerate(idx):
        ref, n = cache[i], len(cache[i]["ids"])
        assert torch.equal(tokens[i]["response"], ref["response"])
        assert torch.equal(out["labels"][j, :n], ref["labels"])  # right padding changes no real position
        torch.testing.assert_close(out["hidden"][j, :n].half(), ref["hidden"], rtol=1e-3, atol=1e-3)


def test_corpus_labels_are_the_argmax_on_a_greedy_corpus_and_stop_at_the_last_tap(target, cache):
    """The cache's responses are the target's greedy answers: labels="corpus" (ids) equals the argmax on every
    response position, with the same taps, and the layers after the last tap never run."""
    model = target[1]
    tokens = TokenCorpus(pairs_of(cache))
    idx = list(range(len(cache)))[:6]
    b = collate([tokens[i] for i in idx], [torch.tensor([0])] * len(idx))
    argmax = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"))
    full = argmax(b["ids"])
    short = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), labels="corpus")
    later = model.get_decoder().layers[max(tiny.TAPS) + 1:]
    ran = []
    hooks = [m.register_forward_hook(lambda *a: ran.append(1)) for m in later]
    out = short(b["ids"])
    for h in hooks:
        h.remove()
    assert later and not ran
    torch.testing.assert_close(out["hidden"], full["hidden"], rtol=0, atol=0)
    resp = b["response"]
    assert resp.sum() > 50 and torch.equal(out["labels"][resp], full["labels"][resp])
    again = argmax(b["ids"])  # two feature sources on one model: neither's hooks reach the other's forward
    assert torch.equal(again["labels"], full["labels"]) and torch.equal(again["hidden"], full["hidden"])
    with pytest.raises(ValueError, match="labels: expected one of"):
        TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), labels="next")


def test_teacher_is_the_targets_renormalised_top_n(target, cache):
    """teacher=n: at each position the target's next-token distribution over its top n, from the literal full
    forward; the argmax labels are its first token; with labels="corpus" the forward runs to the head."""
    model = target[1]
    tokens = TokenCorpus(pairs_of(cache))
    b = collate([tokens[i] for i in range(4)], [torch.tensor([0])] * 4)
    ids, n = b["ids"], 5
    out = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), teacher=n)(ids)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()  # the literal reference: every logit, then the top n
    top = logits[:, :-1].topk(n, -1)
    assert out["teacher_ids"].shape == out["teacher_p"].shape == (*ids.shape, n)
    assert torch.equal(out["teacher_ids"][:, 1:], top.indices)
    torch.testing.assert_close(out["teacher_p"][:, 1:], top.values.softmax(-1), rtol=1e-5, atol=1e-6)
    assert torch.equal(out["teacher_ids"][:, 0, 0], ids[:, 0]) and bool((out["teacher_p"][:, 0, 0] == 1).all())
    assert torch.equal(out["labels"][:, 1:], out["teacher_ids"][:, 1:, 0])
    plain = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"))(ids)
    assert torch.equal(out["labels"], plain["labels"]) and torch.equal(out["hidden"], plain["hidden"])
    assert "teacher_ids" not in plain
    corpus_labels = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), labels="corpus", teacher=n)(ids)
    assert torch.equal(corpus_labels["labels"], ids) and torch.equal(corpus_labels["teacher_ids"], out["teacher_ids"])
    for bad in (-1, 1.5, True, model.config.vocab_size + 1):
        with pytest.raises(ValueError, match="teacher: expected a number of tokens"):
            TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), teacher=bad)


def test_distillation_with_a_sure_teacher_is_the_argmax_loss(target, cache, tmp_path):
    """distill=1 (the target's top-1 with probability 1) trains exactly as CE on the argmax labels does; distill
    refuses a feature cache or a target without the teacher, and the modes that train no DFlash loss."""
    tok, model = target
    dcfg = recipe.drafter_config(model, tok, layers=1, target_layer_ids=list(tiny.TAPS), block_size=8)
    w = model.get_input_embeddings().weight.detach()
    tokens = TokenCorpus(pairs_of(cache))
    cfg = TrainConfig(mode="drafter", steps=3, anchors=8, lr=3e-3, warmup=0.0, save_every=1000, log_every=1000,
                      save_dtype="float32")
    runs = {}
    for distill in (None, 1):
        feats = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), teacher=distill or 0)
        runs[distill] = train(TrainConfig(**{**cfg.__dict__, "distill": distill, "out": str(tmp_path / str(distill))}),
                              tokens, w, w, dcfg, progress=False, target=feats).history
    for a, b in zip(runs[None], runs[1]):
        assert a["dflash"] == pytest.approx(b["dflash"], rel=1e-5)
    five = TrainConfig(**{**cfg.__dict__, "distill": 5, "out": str(tmp_path / "five")})
    teacher5 = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"), teacher=5)
    for extra in ({"loss_vocab": 64}, {"mode": "joint", "num_candidates": 8, "width": 16, "mlp_hidden": 32}):
        run = TrainConfig(**{**five.__dict__, **extra, "steps": 8, "out": str(tmp_path / f"extra{len(extra)}")})
        hist = train(run, tokens, w, w, dcfg, progress=False, target=teacher5).history
        assert hist[-1]["dflash"] < hist[0]["dflash"]
    with pytest.raises(ValueError, match="distill: 5 needs online features"):
        train(five, tokens, w, w, dcfg, progress=False, target=TargetFeatures(model, list(tiny.TAPS),
                                                                             torch.device("cpu")))
    with pytest.raises(ValueError, match="distill: 5 needs online features"):
        train(five, cache, w, w, dcfg, progress=False)
    with pytest.raises(ValueError, match="distill: changes the DFlash loss"):
        TrainConfig(mode="corrector", distill=4)
    with pytest.raises(ValueError, match="distill: changes the DFlash loss"):
        TrainConfig(mode="joint", method="domino", distill=4)


def test_online_training_learns_and_checks_its_inputs(target, cache):
    tok, model = target
    dcfg = recipe.drafter_config(model, tok, layers=1, target_layer_ids=list(tiny.TAPS), block_size=8)
    w = model.get_input_embeddings().weight.detach()
    feats = TargetFeatures(model, list(tiny.TAPS), torch.device("cpu"))
    tokens = TokenCorpus(pairs_of(cache))
    cfg = TrainConfig(mode="joint", steps=12, anchors=8, num_candidates=32, width=16, mlp_hidden=32, lr=3e-3,
                      warmup=0.0, save_every=1000, log_every=1000, out="/nonexistent", eval_sequences=3,
                      eval_every=1000)
    with pytest.raises(ValueError, match="target: a TokenCorpus needs the target"):
        train(cfg, tokens, w, w, dcfg, progress=False)
    with pytest.raises(ValueError, match="target: a TokenCorpus needs the target"):
        train(cfg, cache, w, w, dcfg, progress=False, target=feats)
    with pytest.raises(ValueError, match="layer_ids"):
        TargetFeatures(model, [3], torch.device("cpu"))  # the last layer's output is normed: not a tap
    with pytest.raises(ValueError, match="pairs"):
        TokenCorpus([([1], [])])
    res = train(TrainConfig(**{**cfg.__dict__, "out": str(Path(cache.path).parent / "online-run")}), tokens, w, w,
                dcfg, progress=False, target=feats)
    first, last = res.history[0], res.history[-1]
    assert last["dflash"] < first["dflash"] and last["corr"] < first["corr"]


def test_schedule_pads_evaluation_so_every_rank_runs_the_target_equally(cache):
    for world in (2, 3):
        counts = [len(list(Schedule(cache, 0, 2, 8, r, world, held_out=5).eval_batches())) for r in range(world)]
        assert len(set(counts)) == 1 and counts[0] >= 1
        nones = [sum(b is None for b in Schedule(cache, 0, 2, 8, r, world, held_out=5).eval_batches())
                 for r in range(world)]
        assert nones[0] == 0


def test_recipe_online_from_prompts_generates_what_the_cache_does(target_dir, cache, tmp_path):
    args = tiny.train_args(target_dir, tmp_path / "c", tmp_path / "out", "--mode", "drafter", "--steps", "2",
                           "--features", "online")
    cfg, kw = train_cmd.train_options(cli.parser().parse_args(args))
    res = recipe.run(cfg, **kw)
    assert res.step == 2
    parts = list((tmp_path / "c").glob("tokens-*/part-0.json"))
    assert len(parts) == 1  # one rank: the same batches as the cache, so the same answers
    assert [r for _, r in json.loads(parts[0].read_text())] == [r for _, r in pairs_of(cache)]
    with pytest.raises(ValueError, match="shard_target: needs data"):
        recipe.run(cfg, **{**kw, "shard_target": True})
    with pytest.raises(ValueError, match="shard_target: shards the online target"):
        recipe.run(cfg, **{**kw, "features": "cache", "shard_target": True})
    with pytest.raises(ValueError, match="features: expected one of"):
        recipe.run(cfg, **{**kw, "features": "disk"})
    with pytest.raises(ValueError, match="distill: the target's distribution comes from online features"):
        recipe.run(TrainConfig(**{**cfg.__dict__, "distill": 4}), **{**kw, "features": "cache"})


def test_data_samples_trains_on_nested_subsets(target_dir, data_dir, cache, tmp_path):
    """--data-samples N keeps the first N of one fixed permutation, in the data's order: every smaller subset lies in
    every larger one, whatever the run's seed; the run reads exactly those samples."""
    pairs = pairs_of(cache)
    small, large = recipe.subset_of(pairs, 3), recipe.subset_of(pairs, 7)
    assert len(small) == 3 and len(large) == 7 and all(p in large for p in small)
    assert [pairs.index(p) for p in large] == sorted(pairs.index(p) for p in large)
    assert recipe.subset_of(pairs, len(pairs)) == pairs
    args = tiny.train_args(target_dir, tmp_path / "c", tmp_path / "out", "--mode", "drafter", "--steps", "1",
                           "--data", str(data_dir), "--data-samples", "7", "--features", "online", "--seed", "3")
    cfg, kw = train_cmd.train_options(cli.parser().parse_args(args))
    seen = []
    real = recipe.TokenCorpus
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(recipe, "TokenCorpus", lambda got: seen.append(got) or real(got))
        assert recipe.run(cfg, **kw).step == 1
    assert seen == [large]
    with pytest.raises(ValueError, match=f"data_samples: 99 asked of {data_dir}, which has {len(pairs)} samples"):
        recipe.run(cfg, **{**kw, "data_samples": 99})
    with pytest.raises(ValueError, match="data_samples: expected an integer >= 1 with data"):
        recipe.run(cfg, **{**kw, "data_samples": 0})
    with pytest.raises(ValueError, match="without data"):
        recipe.run(cfg, **{**kw, "data": None})


@pytest.mark.slow
def test_torchrun_sharded_target_changes_nothing(target_dir, data_dir, tmp_path):
    """2 gloo ranks, joint mode, online features from a data folder, held-out evaluation with unequal shares: the
    FSDP2-sharded target gives bit for bit the run of the unsharded one."""
    (tmp_path / "w.py").write_text(WRAPPER)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    sums = {}
    for shard in (False, True):
        run = tmp_path / f"shard{shard}"
        run.mkdir()
        args = tiny.train_args(target_dir, tmp_path / "c", run / "out", "--mode", "joint", "--seqs-per-step", "1",
                               "--steps", "3", "--data", str(data_dir), "--features", "online", "--eval-sequences",
                               "3", "--eval-every", "2", *(["--shard-target"] if shard else []))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(tmp_path / "w.py"), str(run), *args]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr[-3000:]
        ranks = [(run / f"rank{i}.txt").read_text() for i in (0, 1)]
        weights = {(run / f"rank{i}.target").read_text() for i in (0, 1)}
        assert ranks[0] == ranks[1] and weights == {"DTensor" if shard else "Parameter"}
        sums[shard] = ranks[0].split()[0]
        evals = (run / "out" / "eval.jsonl").read_text().splitlines()
        assert [json.loads(e)["step"] for e in evals] == [2, 3]
    assert sums[False] == sums[True]
    assert hashlib.sha256(b"").hexdigest() not in sums.values()
