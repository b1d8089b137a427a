"""`dcoco data prompts` against the stub server: the pre-query prompt each request sends, seeded draws, shards,
resume and retry; the kept set's filters (degenerate text, exact and near duplicates, 13-grams of evaluated rows
with the suites' boilerplate lines left out) and its append-only rows."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx", reason="dcoco data prompts needs httpx")
pytest.importorskip("datasketch", reason="near deduplication needs datasketch")
pytest.importorskip("transformers", reason="the pre-query prompt needs the target's chat template")

from helpers.stub_server import Stub
from transformers import AutoTokenizer

from dcoco import cli
from dcoco.train import prompts


def _prompts(stub, target_dir, out, *extra):
    return cli.main(["data", "prompts", "--endpoint", stub.url, "--model", "stub", "--target", str(target_dir),
                     "--out", str(out), "--no-shipped", "--no-progress", *extra])


def _raw(out):
    return sorted((r for f in out.glob("raw-*.jsonl") for r in map(json.loads, f.read_text().splitlines())),
                  key=lambda r: r["i"])


def test_pre_query_is_the_template_up_to_the_user_text(target_dir):
    tok = AutoTokenizer.from_pretrained(target_dir)
    head = prompts.pre_query(tok, "be brief")
    full = tok.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "cat dog"}],
                                   tokenize=True, return_dict=False)
    assert head and full[:len(head)] == head and tok.decode(full[len(head):]).strip().startswith("cat dog")


def test_seeded_sharded_resumable(target_dir, tmp_path, capsys):
    stub = Stub(spec=False)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _prompts(stub, target_dir, a, "--count", "30") == 0
    for shard in (0, 1):  # the same 30 requests split over two shards
        assert _prompts(stub, target_dir, b, "--count", "30", "--num-shards", "2", "--shard", str(shard)) == 0
    assert _raw(a) == _raw(b) and [r["i"] for r in _raw(a)] == list(range(30))
    tok = AutoTokenizer.from_pretrained(target_dir)
    bodies = {e["body"]["seed"]: e["body"] for e in stub.log}
    for r in _raw(a):
        assert {k: r[k] for k in ("domain", "opening", "suffix", "seed")} == {
            k: v for k, v in prompts.draw(prompts.PromptConfig("", "", "", 30), r["i"]).items() if k != "i"}
        head = prompts.pre_query(tok, prompts.DOMAINS[r["domain"]].system)
        body = bodies[r["seed"]]
        assert body["prompt"][:len(head)] == head  # the domain's system prompt, then its opening
        assert body["temperature"] == 1.0 and body["stop_token_ids"] == [tok.eos_token_id]
        assert r["text"].startswith(r["opening"])
    n = len(stub.log)
    assert _prompts(stub, target_dir, a, "--count", "30") == 0 and len(stub.log) == n  # nothing asked again
    assert "0 queries written, 30 already there" in capsys.readouterr().out
    assert _prompts(stub, target_dir, a, "--count", "40") == 0 and len(stub.log) == n + 10  # ten more


def test_failed_requests_are_retried(target_dir, tmp_path, capsys):
    stub = Stub(spec=False)
    cfg = prompts.PromptConfig("", "", "", 12)
    stub.fail_seeds = {prompts.draw(cfg, 3)["seed"], prompts.draw(cfg, 7)["seed"]}
    out = tmp_path / "out"
    assert _prompts(stub, target_dir, out, "--count", "12") == 1
    assert "2 failed (rerun to retry)" in capsys.readouterr().out and len(_raw(out)) == 10
    stub.fail_seeds = set()
    assert _prompts(stub, target_dir, out, "--count", "12") == 0 and [r["i"] for r in _raw(out)] == list(range(12))


def test_bad_arguments_are_named(target_dir, tmp_path):
    stub = Stub(spec=False)
    for args, name in ((["--count", "0"], "--count"), (["--count", "3", "--mix", "poetry=1"], "--mix"),
                       (["--count", "3", "--shard", "2"], "--shard"), (["--count", "3", "--top-p", "0"], "--top-p")):
        with pytest.raises(SystemExit, match=name):
            _prompts(stub, target_dir, tmp_path / "x", *args)


EVALUATED = ["Tom has 13 red apples and gives 4 of them to his sister Anna who then eats two of them slowly. "
             "How many are left?\nPlease reason step by step, and put your final answer within \\boxed{}."]
SUITE = ["Ann buys 3 hats.\nPlease reason step by step, and put your final answer within \\boxed{}.",
         "Bob sells 7 cars.\nPlease reason step by step, and put your final answer within \\boxed{}."]


def test_contamination_counts_content_not_boilerplate():
    c = prompts.Contamination(EVALUATED, SUITE)
    assert "please reason step by step and put your final answer within boxed" in c.lines
    copied = "Here: 13 red apples and gives 4 of them to his sister Anna who then eats two of them. Why?"
    assert c.hits(copied)
    same_ending = ("Sue counts the people. How many are left?\n"
                   "Please reason step by step, and put your final answer within \\boxed{}.")
    assert not c.hits(same_ending)  # 13 words across the question's end and the instruction line: boilerplate
    short = prompts.Contamination(["Write a function to sort a list."])
    assert short.hits("write a FUNCTION to sort a list") and not short.hits("Write a function to sort a set.")


def test_build_filters_and_appends(tmp_path):
    c = prompts.Contamination(EVALUATED, SUITE)
    cand = [{"turns": ["What is the capital city of France, and why?"], "source": "s"},
            {"turns": ["what is the CAPITAL city of france and why"], "source": "s"},  # exact, folded
            {"turns": ["Write a poem about the sea at night, with rhymes and a calm mood in every line please"],
             "source": "s"},
            {"turns": ["Write a poem about the sea at night, with rhymes and a calm mood in every line, thanks"],
             "source": "s"},  # near
            {"turns": ["Copy: 13 red apples and gives 4 of them to his sister Anna who then eats two of them."],
             "source": "s"},  # contaminated
            {"turns": ["ab"], "source": "g", "generated": True},
            {"turns": ["spam " * 30], "source": "g", "generated": True},
            {"turns": ["How do <|im_start|> tokens work in a chat?"], "source": "g", "generated": True},
            {"turns": ["Explain how a binary search finds an item in a sorted list."], "source": "g",
             "generated": True},
            {"turns": ["ab"], "source": "file"}]  # files are not checked for degenerate text
    s = prompts.build(cand, tmp_path, c, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert [r["turns"][0][:12] for r in rows] == ["What is the ", "Write a poem", "Explain how ", "ab"]
    assert s["dropped"] == {"duplicate": 1, "near duplicate": 1, "an evaluated row or a 13-gram of one": 1,
                            "too short": 1, "repetitive": 1, "template tokens": 1}
    assert json.loads((tmp_path / "prompts.json").read_text())["prompts"] == 4
    more = [{"turns": ["Name three primes above one hundred and show they are prime."], "source": "t"}]
    s = prompts.build(more + cand, tmp_path, c, progress=False)
    rows2 = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert rows2[:4] == rows and rows2[4]["source"] == "t" and s["added"] == 1
    assert s["kept_before"] == 6  # the four kept rows, the folded duplicate and the generated "ab"
