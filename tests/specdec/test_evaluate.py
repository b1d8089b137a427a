"""`dcoco eval`: the core over token ids (results fields, plots, oracle >= tau, greedy losslessness), the suite
loader's errors, and the whole CLI on a tiny saved Llama target with a word-level tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers", reason="the engine needs transformers (pip install '.[demo]')")
pytest.importorskip("matplotlib", reason="dcoco eval plots with matplotlib")

from helpers.tiny_models import dflash_cfg, llama

from dcoco.modeling import checkpoint
from dcoco.cli import main
from dcoco.corrector import Corrector
from dcoco.modeling.dflash import DFlashDrafter
from dcoco.specdec.evaluate import evaluate, table, write
from dcoco.suites import load_suites
from dcoco.specdec.engine import KS, Engine

SUITES = {"a": [[3, 17, 5, 9], [40, 2, 2, 11]], "b": [[7, 7, 1, 33, 60]]}


@pytest.fixture(scope="module")
def target():
    return llama(64, 0)


@pytest.fixture(scope="module")
def drafter():
    torch.manual_seed(0)
    return DFlashDrafter(dflash_cfg(64)).eval()


@pytest.mark.parametrize("with_corrector, anchor", [(False, False), (True, False), (True, True)])
def test_core_results_and_plots(target, drafter, tmp_path, with_corrector, anchor):
    corr = Corrector(64, num_candidates=8, width=16, mlp_hidden=32,
                     anchor_transition=anchor).eval() if with_corrector else None
    eng = Engine(target, drafter, corr, num_candidates=8, eos_token_id=None)
    res = evaluate(target, eng, SUITES, max_new_tokens=12, progress=False)
    assert res["lossless"] is True and res["mismatches"] == []
    for r in [*res["suites"].values(), res["overall"]]:
        assert r["tau"] >= 1 and r["tau_oracle_walk"] >= r["tau_oracle_prefix_first"] >= r["tau"]
        assert r["tps_spec"] > 0 and r["tps_target_only"] > 0 and r["speedup"] > 0
        assert set(r["coverage"]) == set(KS) and len(r["coverage"][1]) == dflash_cfg(64).block_size - 1
        assert with_corrector or r["transition_hit_rate"] is None  # with one: None when no pair was in the top-K
        assert r["spec"]["tokens"] == r["target_only"]["tokens"]
        assert r["tau_ci"] is None if r["prompts"] < 2 else r["tau_ci"][0] <= r["tau"] <= r["tau_ci"][1]
    assert res["overall"]["spec"]["tokens"] == 12 * 3 and res["overall"]["prompts"] == 3
    assert "overall" in table(res)
    paths = write(res, tmp_path / "out")
    saved = json.loads(paths[0].read_text())
    assert set(saved["suites"]) == {"a", "b"} and saved["lossless"] is True
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths[1:])


def test_sampling_has_no_lossless_check(target, drafter):
    eng = Engine(target, drafter, eos_token_id=None)
    res = evaluate(target, eng, {"a": SUITES["a"]}, max_new_tokens=8, temperature=0.8, progress=False)
    assert res["lossless"] is None and res["overall"]["tau_oracle_prefix_first"] is None


def test_suite_loader(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"turns": ["one", "two"]}\n\n{"turns": ["three"]}\n{"turns": ["four"]}\n')
    assert load_suites([tmp_path], rows=2) == {"x": ["one", "three"]}
    assert load_suites([tmp_path / "x.jsonl"], rows=8) == {"x": ["one", "three", "four"]}
    with pytest.raises(ValueError, match="suites: .* does not exist.*--suites"):
        load_suites([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no \\*.jsonl"):
        load_suites([tmp_path / "empty"])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 1"):
        load_suites([tmp_path / "bad.jsonl"])
    with pytest.raises(ValueError, match="rows"):
        load_suites([tmp_path], rows=0)


def test_chats_rows_as_bench_draws_them_every_turn_in_context(target, drafter, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from dcoco.specdec import evaluate as ev
    from dcoco.suites import ALL, load, subset

    _tiny_target_dir(tmp_path / "target", target)
    tok = AutoTokenizer.from_pretrained(tmp_path / "target")
    rows = [{"turns": [f"w{i + 3} w40", f"w{i + 9} w41"]} if i % 2 else {"turns": [f"w{i + 3} w42"]} for i in range(6)]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    chats = ev.load_chats([tmp_path / "s.jsonl"], rows=4)
    picked = subset("s", load([tmp_path / "s.jsonl"])["s"], 4)  # what `dcoco bench` sends
    assert chats == {"s": [rows[i]["turns"] for i in picked]} and any(len(t) == 2 for t in chats["s"])
    assert len(ev.load_chats([tmp_path / "s.jsonl"], rows=ALL)["s"]) == 6
    with pytest.raises(ValueError, match="rows"):
        ev.load_chats([tmp_path], rows=0)
    with pytest.raises(ValueError, match="suites: .*does not exist"):
        ev.load_chats([tmp_path / "nope"])
    rounds, decode_all = [], ev.decode_all

    def spy(target, engines, prompts, *args, **kw):
        out = decode_all(target, engines, prompts, *args, **kw)
        rounds.append((prompts["s"], [r.tokens for r in out[0]["target-only"]["s"]]))
        return out

    monkeypatch.setattr(ev, "decode_all", spy)
    eng = Engine(target, drafter, None, num_candidates=8, eos_token_id=None)
    res = ev.evaluate_chats(target, eng, tok, chats, max_new_tokens=6, progress=False)
    turns = sum(map(len, chats["s"]))
    assert res["lossless"] is True and res["overall"]["target_only"]["tokens"] == 6 * turns
    assert [len(p) for p, _ in rounds] == [len(chats["s"]), sum(len(t) == 2 for t in chats["s"])]
    (first, answers), (second, _) = rounds
    two = [j for j, t in enumerate(chats["s"]) if len(t) == 2]
    for k, j in enumerate(two):  # turn 2's prompt holds turn 1's target-only answer
        said = [t for t in answers[j] if t not in tok.all_special_ids]
        assert any(second[k][i:i + len(said)] == said for i in range(len(second[k]))) and len(second[k]) > len(first[j])


def _tiny_target_dir(path, target) -> None:
    """The tiny Llama plus a word-level tokenizer (one id per word of a 64-word vocabulary) with a chat
    template, saved where transformers' Auto classes load them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<eos>"] + [f"w{i}" for i in range(62)]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}w1 {{ m['content'] }} w2 {% endfor %}w3"
    tok.save_pretrained(path)
    target.save_pretrained(path)


@pytest.mark.parametrize("anchor", [False, True])
def test_cli_end_to_end(target, drafter, tmp_path, capsys, anchor):
    _tiny_target_dir(tmp_path / "target", target)
    torch.manual_seed(1)
    corrector = Corrector(64, num_candidates=8, width=16, mlp_hidden=32, anchor_transition=anchor)
    torch.nn.init.normal_(corrector.mlp[2].weight, std=4.0)  # active: it re-picks candidates, slot 1 with the anchor
    checkpoint.save(tmp_path / "dcoco", drafter, corrector)
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "s.jsonl").write_text("\n".join(json.dumps({"turns": [f"w{i} w{i + 5} w9"]}) for i in range(4)))
    out = tmp_path / "out"
    rc = main(["eval", "--drafter", str(tmp_path / "dcoco"), "--target", str(tmp_path / "target"), "--suites",
               str(suites), "--rows", "3", "--max-new-tokens", "10", "--out", str(out), "--no-progress"])
    assert rc == 0 and "overall" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["corrector"] and res["config"]["num_candidates"] == 8 and res["lossless"]
    assert res["config"]["anchor_transition"] is anchor
    assert res["suites"]["s"]["target_only"]["tokens"] <= 30 and (out / "tau.png").is_file()
    with pytest.raises(SystemExit, match="suites: .*does not exist"):
        main(["eval", "--drafter", str(tmp_path / "dcoco"), "--suites", str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="--hub is not supported"):
        main(["eval", "--drafter", str(tmp_path / "dcoco"), "--hub"])


def test_the_coverage_plot_reads_a_saved_json_as_it_reads_a_run(tmp_path, monkeypatch):
    """A result written as JSON keeps its coverage keys as strings: the plot draws the same lines from it."""
    from dcoco import plots
    from dcoco.specdec import evaluate as ev

    figs = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figs.append(fig))
    coverage = {k: [0.2 + 0.1 * i / k for i in range(3)] for k in KS}
    for cov in (coverage, json.loads(json.dumps(coverage))):
        ev.coverage_plot(cov, [50, 40, 30], tmp_path / "coverage.png", "t")
    labels = [[t.get_text() for t in f.axes[0].get_legend().get_texts()] for f in figs]
    assert labels[0] == labels[1] == [f"top-{k}" for k in KS]
