"""`dcoco data pack`: generated answers packed into uint16 shards of the rows no shard holds yet, with a manifest; the
shards read back exactly, a corrupt shard is named, and generation resumes from what the shards hold."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("httpx", reason="dcoco data generate needs httpx")
pytest.importorskip("transformers", reason="prompt ids need the target's tokenizer")

from helpers.stub_server import Stub

from dcoco import cli
from dcoco.train import datagen, shards

PROMPTS = [{"turns": ["the cat"], "source": "a"}, {"turns": ["red sun", "why"], "source": "b"},
           {"turns": ["blue moon"], "source": "a"}, {"turns": ["one two three"], "source": "b"},
           {"turns": ["big dog run"], "source": "a"}]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def _gen(stub, target_dir, prompts_file, out, *extra):
    return cli.main(["data", "generate", "--endpoint", stub.url, "--model", "stub", "--target", str(target_dir),
                     "--input", str(prompts_file), "--out", str(out), "--no-progress", *extra])


def _pack(gen, prompts_file, corpus, *extra):
    return cli.main(["data", "pack", "--generated", str(gen), "--prompts", str(prompts_file), "--out", str(corpus),
                     "--shard-rows", "2", *extra])


def test_pack_whole_shards_then_flush(target_dir, prompts_file, tmp_path):
    stub, gen, corpus = Stub(spec=False), tmp_path / "gen", tmp_path / "corpus"
    assert _gen(stub, target_dir, prompts_file, gen, "--limit", "3") == 0  # rows 0-2 answered: one full shard
    assert _pack(gen, prompts_file, corpus, "--settings", '{"engine": "stub"}') == 0
    m = json.loads((corpus / "manifest.json").read_text())
    assert [s["rows"] for s in m["shards"]] == [[[0, 2]]] and m["prompts"] == 5 and m["settings"] == {"engine": "stub"}
    first = (corpus / "shard-00000.npz").read_bytes()
    assert _pack(gen, prompts_file, corpus, "--flush") == 0  # a run stopping now: row 2 alone
    assert [s["rows"] for s in json.loads((corpus / "manifest.json").read_text())["shards"]] == [[[0, 2]], [[2, 3]]]
    assert _gen(stub, target_dir, prompts_file, gen) == 0
    assert _pack(gen, prompts_file, corpus) == 0
    assert _pack(gen, prompts_file, corpus, "--flush") == 0  # nothing left to flush
    m = json.loads((corpus / "manifest.json").read_text())
    assert [s["rows"] for s in m["shards"]] == [[[0, 2]], [[2, 3]], [[3, 5]]]
    assert (corpus / "shard-00000.npz").read_bytes() == first  # a written shard never changes
    assert m["settings"] == {"engine": "stub"}  # kept from the first pack
    samples = datagen.load(gen)
    assert shards.load(corpus) == samples == datagen.load(corpus)  # `dcoco train --data` reads either folder
    assert m["conversations"] == 5 and m["samples"] == len(samples) == 6
    assert m["response_tokens"] == sum(len(r) for _, r in samples)
    assert m["prompt_tokens"] == sum(len(p) for p, _ in samples)
    assert m["sources"]["a"]["conversations"] == 3 and m["sources"]["b"]["samples"] == 3
    with np.load(corpus / "shard-00000.npz") as z:
        assert z["ids"].dtype == np.uint16 and z["rows"].tolist() == [0, 1, 1] and z["turns"].tolist() == [0, 0, 1]
    assert [p for p, _ in samples] == [p for p, _ in datagen.load(gen)]


def test_a_failed_row_is_packed_when_a_rerun_answers_it(target_dir, prompts_file, tmp_path):
    stub, gen, corpus = Stub(spec=False), tmp_path / "gen", tmp_path / "corpus"
    stub.fail = {"red sun": "500"}  # row 1
    assert _gen(stub, target_dir, prompts_file, gen) == 1
    assert _pack(gen, prompts_file, corpus) == 0
    m = json.loads((corpus / "manifest.json").read_text())
    assert [s["rows"] for s in m["shards"]] == [[[0, 1], [2, 3]], [[3, 5]]] and m["conversations"] == 4
    stub.fail = {}
    assert _gen(stub, target_dir, prompts_file, gen) == 0
    assert _pack(gen, prompts_file, corpus, "--flush") == 0
    m = json.loads((corpus / "manifest.json").read_text())
    assert m["shards"][-1]["rows"] == [[1, 2]] and shards.packed_rows(corpus) == set(range(5))
    assert sorted(shards.load(corpus)) == sorted(datagen.load(gen))


def test_resume_from_the_shards_and_corruption(target_dir, prompts_file, tmp_path):
    stub, corpus = Stub(spec=False), tmp_path / "corpus"
    assert _gen(stub, target_dir, prompts_file, tmp_path / "gen") == 0
    assert _pack(tmp_path / "gen", prompts_file, corpus) == 0
    n = len(stub.log)
    # another machine: no generated files, only the packed shards
    assert _gen(stub, target_dir, prompts_file, tmp_path / "gen2", "--skip-packed", str(corpus)) == 0
    asked = {e["body"]["messages"][-1]["content"] for e in stub.log[n:]}
    assert asked == {"big dog run"}  # rows 0-3 are packed, row 4 does not fill a shard
    path = corpus / "shard-00001.npz"
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    with pytest.raises(ValueError, match="shard-00001.npz does not match its sha256"):
        shards.load(corpus)


def test_ids_outside_uint16_are_refused(prompts_file, tmp_path):
    gen = tmp_path / "gen"
    gen.mkdir()
    recs = [{"source": "prompts", "row": r, "samples": [{"prompt_ids": [1, 2], "response_ids": [3, 70000 if r else 4],
                                                         "finish": "stop"}]} for r in range(2)]
    (gen / "shard-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(SystemExit, match="row 1 turn 1 holds token ids that are not in 0..65535"):
        _pack(gen, prompts_file, tmp_path / "corpus")


def test_samples_train_cannot_use_are_named_with_their_shard_and_line(target_dir, prompts_file, tmp_path):
    """`dcoco train --data` reads through datagen.load: a bad sample is one line naming the shard file, its line
    (or prompt row and turn) and what is wrong, not a traceback from inside training."""
    stub, gen, corpus = Stub(spec=False), tmp_path / "gen", tmp_path / "corpus"
    assert _gen(stub, target_dir, prompts_file, gen) == 0
    vocab = max(max(p + r) for p, r in datagen.load(gen)) + 1
    assert len(datagen.load(gen, vocab)) == 6
    shard = gen / "shard-00000-of-00001.jsonl"
    lines = shard.read_text().splitlines()
    rec = json.loads(lines[1])
    for edit, why in [(lambda s: s.update(response_ids=s["response_ids"] + [vocab]), rf"is not a token id in \[0, "
                                                                                       rf"{vocab}\)"),
                      (lambda s: s.update(prompt_ids=[]), "prompt_ids is empty"),
                      (lambda s: s.update(response_ids=None), "response_ids is NoneType"),
                      (lambda s: s.update(prompt_ids=[1, "2"]), r"prompt_ids \[1\] = '2' is not a token id")]:
        bad = json.loads(json.dumps(rec))
        edit(bad["samples"][-1])
        shard.write_text("\n".join([lines[0], json.dumps(bad), *lines[2:]]) + "\n")
        with pytest.raises(ValueError, match=rf"data: {shard} line 2: sample {len(rec['samples']) - 1}: .*{why}"):
            datagen.load(gen, vocab)
    shard.write_text("\n".join(lines) + "\n" + lines[0][:20])  # a cut last line: left out, as generate redoes it
    assert len(datagen.load(gen, vocab)) == 6
    shard.write_text("\n".join(lines) + "\n")
    assert _pack(gen, prompts_file, corpus, "--flush") == 0
    assert len(datagen.load(corpus, vocab)) == 6
    with pytest.raises(ValueError, match=r"corpus: .*shard-00000.npz: row \d+ turn \d+ holds a token id >= "):
        datagen.load(corpus, vocab - 1)
