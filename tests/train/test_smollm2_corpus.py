"""The SmolLM2 training corpus as committed: its prompts share no 13-gram of content with any evaluated row (rows
below 32 of every suite), and its shards match their manifest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dcoco.suites import default_suites
from dcoco.target import smollm2
from dcoco.train import prompts, shards

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "smollm2-prompts" / "prompts.jsonl"
CORPUS = smollm2.corpus_dir()


def test_training_prompts_are_disjoint_from_the_evaluated_rows():
    pytest.importorskip("datasketch", reason="dcoco.train.prompts needs the [train] extra")
    rows = [json.loads(x) for x in PROMPTS.read_text(encoding="utf-8").splitlines()]
    evaluated, others = prompts.evaluated_rows(default_suites(), prompts.EVAL_ROWS_RESERVED)
    c = prompts.Contamination(evaluated, others)
    assert len(c.grams) > 10_000  # the evaluated rows' content is there to compare with
    folded = {prompts.fold(t) for t in evaluated}
    for k, row in enumerate(rows):
        text = " ".join(row["turns"])
        assert not c.hits(text) and prompts.fold(text) not in folded, f"prompt row {k} ({row['source']})"


def test_shards_match_the_manifest():
    m = shards.read_manifest(CORPUS)
    assert {"prompts", "response_tokens", "sources", "settings"} <= set(m)
    samples = shards.load(CORPUS)  # every shard's sha256 checked
    assert len(samples) == m["samples"] and sum(len(r) for _, r in samples) == m["response_tokens"]
    assert m["prompts"] == len(PROMPTS.read_text(encoding="utf-8").splitlines())
    assert sum(s["conversations"] for s in m["sources"].values()) == m["conversations"]
