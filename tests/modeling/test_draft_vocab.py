"""The shortlisted draft head (dcoco.modeling.draft_vocab): its top-K against the whole head's logits restricted to
the list, written literally; the checkpoint layout (vLLM's draft_vocab_size, d2t and lm_head.weight) and its round
trip; every malformed list or checkpoint named; `dcoco export --draft-vocab` on a tiny target and corpus; and the
offline engine decoding losslessly with it."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file, save_file

from dcoco import cli
from dcoco.modeling import checkpoint
from dcoco.modeling.dflash import DFlashConfig, DFlashDrafter
from dcoco.modeling.draft_vocab import DraftHead

V, D = 100, 64


def drafter_config(vocab: int = V) -> DFlashConfig:
    return DFlashConfig(hidden_size=D, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=vocab, mask_token_id=0, target_layer_ids=[0, 2],
                        num_target_layers=4, block_size=6)


def shortlist(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]


@pytest.mark.parametrize("dtype, n, k", [(torch.float32, 40, 16), (torch.bfloat16, 17, 16), (torch.float64, 90, 8)])
def test_top_is_the_whole_heads_top_over_the_list(dtype, n, k):
    g = torch.Generator().manual_seed(n)
    head, hidden = torch.randn(V, D, generator=g, dtype=dtype), torch.randn(3, 5, D, generator=g, dtype=dtype)
    ids = shortlist(n, n)
    dh = DraftHead.from_target(head, ids)
    got_ids, got = dh.top(hidden, k)
    # literal: every row's logits over the whole head, everything off the list set to -inf, then the top-k
    full = (hidden.float() @ head.float().T) if dtype == torch.bfloat16 else (hidden @ head.T).float()
    off = torch.ones(V, dtype=torch.bool)
    off[ids] = False
    want = full.masked_fill(off, float("-inf")).topk(k, -1)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got, want.values, atol=tol, rtol=tol)
    assert bool(torch.isin(got_ids, ids).all()) and got_ids.shape == (3, 5, k)
    if dtype != torch.bfloat16:  # ties aside, the same tokens
        assert torch.equal(got_ids, want.indices)


def test_a_checkpoint_keeps_its_list_in_vllms_layout(tmp_path):
    torch.manual_seed(0)
    drafter = DFlashDrafter(drafter_config())
    head = torch.randn(V, D)
    ids = shortlist(30, 1)
    drafter.draft_head = DraftHead.from_target(head, ids)
    checkpoint.save(tmp_path, drafter, None, dtype=torch.bfloat16)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draft_vocab_size"] == 30 and config["has_own_lm_head"] is True
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["d2t"].dtype == torch.int64
    assert torch.equal(tensors["d2t"] + torch.arange(30), ids.sort().values)  # target id = draft id + d2t
    assert torch.equal(tensors["lm_head.weight"], head[ids.sort().values].bfloat16())
    loaded, _ = checkpoint.load(tmp_path, dtype=torch.float32)
    assert loaded.draft_head is not None and torch.equal(loaded.draft_head.ids, ids.sort().values)
    assert torch.equal(loaded.draft_head.weight, head[ids.sort().values].bfloat16().float())
    assert all(torch.equal(loaded.state_dict()[k], v.float()) for k, v in tensors.items()
               if k not in ("d2t", "lm_head.weight"))


@pytest.mark.parametrize("ids, match", [
    (torch.tensor([3, 7, 100]), r"out of the target's vocabulary \[0, 100\): \[100\]"),
    (torch.tensor([-1, 4]), r"out of the target's vocabulary \[0, 100\): \[-1\]"),
    (torch.tensor([5, 9, 5, 2, 9]), r"listed more than once: \[5, 9\]"),
    (torch.tensor([], dtype=torch.long), "empty"),
    (torch.tensor([1.0, 2.0]), "integer tensor"),
])
def test_bad_lists_are_named(ids, match):
    with pytest.raises(ValueError, match=f"ids: .*{match}"):
        DraftHead.from_target(torch.randn(V, D), ids)


def _edit(path, config=None, drop=(), tensors=None):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(config or {})
    (path / "config.json").write_text(json.dumps(cfg))
    t = {k: v for k, v in load_file(str(path / "model.safetensors")).items() if k not in drop}
    save_file({**t, **(tensors or {})}, str(path / "model.safetensors"))


@pytest.mark.parametrize("edit, match", [
    ({"drop": ("d2t",)}, "declares draft_vocab_size 30 but the checkpoint has no d2t"),
    ({"drop": ("lm_head.weight",)}, "declares draft_vocab_size 30 but the checkpoint has no lm_head.weight"),
    ({"tensors": {"d2t": torch.zeros(29, dtype=torch.long)}}, r"d2t has shape \(29,\), expected \(30,\)"),
    ({"tensors": {"d2t": torch.full((30,), 95)}}, r"d2t: token ids out of the target's vocabulary"),
    ({"tensors": {"d2t": torch.zeros(30, dtype=torch.long).index_fill_(0, torch.tensor([1]), -1)}},
     r"d2t: token ids listed more than once: \[0\]"),
    ({"tensors": {"lm_head.weight": torch.zeros(31, D)}}, r"30 token ids but a head of shape \(31, 64\)"),
    ({"config": {"draft_vocab_size": 0}}, r"draft_vocab_size: expected an integer in \[1, 100\), got 0"),
    ({"config": {"draft_vocab_size": None}}, r"holds \['d2t', 'lm_head.weight'\] but config.json has no "
                                             "draft_vocab_size"),
])
def test_broken_checkpoints_are_named(tmp_path, edit, match):
    drafter = DFlashDrafter(drafter_config())
    drafter.draft_head = DraftHead.from_target(torch.randn(V, D), shortlist(30, 2))
    checkpoint.save(tmp_path, drafter, None)
    _edit(tmp_path, **edit)
    with pytest.raises(ValueError, match=f"{tmp_path}.*{match}"):
        checkpoint.load(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny target, a corpus of generated answers (dcoco data generate's shard layout) and a drafter for both."""
    pytest.importorskip("transformers", reason="the target needs transformers (pip install '.[demo]')")
    from dcoco.testing import tiny as tiny_target

    root = tmp_path_factory.mktemp("shortlist")
    target = tiny_target.save_target(root / "target")
    g = torch.Generator().manual_seed(3)
    weights = torch.rand(V, generator=g) ** 4  # a skewed token distribution, as answers have
    samples = [{"prompt_ids": torch.randint(4, V, (5,), generator=g).tolist(),
                "response_ids": torch.multinomial(weights, 12, replacement=True, generator=g).tolist()}
               for _ in range(30)]
    (root / "data").mkdir()
    (root / "data" / "shard-00000.jsonl").write_text(
        "".join(json.dumps({"source": "s", "row": i, "samples": [s]}) + "\n" for i, s in enumerate(samples)))
    checkpoint.save(root / "drafter", DFlashDrafter(drafter_config()), None)
    return root, target, samples


def test_export_takes_the_corpus_most_frequent_answer_tokens(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    root, target, samples = tiny
    assert cli.main(["export", str(root / "drafter"), str(tmp_path / "out"), "--draft-vocab", "20",
                     "--data", str(root / "data"), "--target", str(target)]) == 0
    counts = Counter(t for s in samples for t in s["response_ids"])
    ranked = sorted(counts, key=lambda t: -counts[t])
    assert counts[ranked[19]] > counts[ranked[20]], "the test corpus needs a clear top 20"
    drafter, _ = checkpoint.load(tmp_path / "out")
    assert drafter.draft_head is not None and drafter.draft_head.ids.tolist() == sorted(ranked[:20])
    head = AutoModelForCausalLM.from_pretrained(target).get_output_embeddings().weight.detach()
    torch.testing.assert_close(drafter.draft_head.weight, head[sorted(ranked[:20])])


@pytest.mark.parametrize("args, match", [
    (["--draft-vocab", "20"], "--data: --draft-vocab counts the response tokens"),
    (["--draft-vocab", "0", "--data", "DATA"], "--draft-vocab: expected an integer >= 1, got 0"),
    (["--draft-vocab", "99", "--data", "DATA"], "--draft-vocab: .* has only \\d+ distinct response tokens"),
])
def test_export_names_bad_shortlist_arguments(tiny, tmp_path, args, match):
    root, target, _ = tiny
    args = [str(root / "data") if a == "DATA" else a for a in args]
    with pytest.raises(SystemExit, match=f"dcoco export: {match}"):
        cli.main(["export", str(root / "drafter"), str(tmp_path / "out"), "--target", str(target), *args])
    assert not (tmp_path / "out").exists()
