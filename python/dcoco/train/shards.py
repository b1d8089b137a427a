"""A token-id corpus packed for shipping: `dcoco data generate`'s answers as compressed uint16 shards with a
manifest. Each shard holds answered prompt rows that no earlier shard holds, and never changes after it is
written: a corpus grows shard by shard (each can be committed as it lands), and a generation run on another
machine resumes from the rows the shards hold (`dcoco data generate --skip-packed`).

    <corpus>/manifest.json        {"format", "prompts", "conversations", "samples", "prompt_tokens",
                                   "response_tokens", "sources": {source: {conversations, samples,
                                   response_tokens}}, "settings",
                                   "shards": [{file, rows: [[start, end), ...], samples, ...}]}
    <corpus>/shard-<k>.npz        ids (uint16: each sample's prompt then response ids, samples concatenated),
                                  lengths, prompt_lengths (int32, per sample), rows (int32: the prompt row of
                                  each sample), turns (uint8: its turn in the conversation), cut (bool: the
                                  answer hit the length cap)"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np

from ..files import replacing, write_text_atomic
from ..jsonl import read_records

FORMAT = 1
MANIFEST = "manifest.json"
MAX_ID = np.iinfo(np.uint16).max


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.npz"


def read_manifest(corpus: str | Path) -> dict:
    path = Path(corpus) / MANIFEST
    if not path.is_file():
        raise ValueError(f"corpus: no {MANIFEST} in {corpus} (`dcoco data pack` writes one)")
    m = json.loads(path.read_text())
    if m.get("format") != FORMAT:
        raise ValueError(f"corpus: {path} has format {m.get('format')!r}; this dcoco reads format {FORMAT}")
    return m


def packed_rows(corpus: str | Path) -> set[int]:
    """The prompt rows the corpus's shards hold (answered, or dropped by generation for good)."""
    path = Path(corpus) / MANIFEST
    if not path.is_file():
        return set()
    return {r for s in read_manifest(corpus)["shards"] for lo, hi in s["rows"] for r in range(lo, hi)}


def _generated(folder: Path, source: str) -> dict[int, dict]:
    """{row: record} of the conversations `dcoco data generate` wrote into folder for the input named source."""
    recs = {}
    for f in sorted(folder.glob("shard-*.jsonl")):
        for r in read_records(f):
            if r.get("source") == source:
                recs[int(r["row"])] = r
    return recs


def pack(generated: str | Path, prompts: str | Path, out: str | Path, shard_rows: int = 500,
         flush: bool = False, settings: dict | None = None) -> dict:
    """Packs the prompt rows answered in generated and in no shard yet, in row order: a new shard for every
    shard_rows of them, and with flush the rest too (what a run that stops now leaves answered). A row generation
    dropped (no sample) counts as answered; a row whose request failed waits for a rerun. Shards already written
    are kept as they are; the manifest is rewritten. Returns it."""
    if isinstance(shard_rows, bool) or not isinstance(shard_rows, int) or shard_rows < 1:
        raise ValueError(f"--shard-rows: expected an integer >= 1, got {shard_rows!r}")
    prompts, out = Path(prompts), Path(out)
    rows = read_records(prompts)
    if not rows:
        raise ValueError(f"--prompts: no rows in {prompts}")
    recs = _generated(Path(generated), prompts.stem)
    out.mkdir(parents=True, exist_ok=True)
    old = read_manifest(out) if (out / MANIFEST).is_file() else {}
    shards = list(old.get("shards", []))
    done = {r for sh in shards for lo, hi in sh["rows"] for r in range(lo, hi)}
    todo = sorted(r for r in recs if r not in done and r < len(rows))
    while len(todo) >= shard_rows or (flush and todo):
        chunk, todo = todo[:shard_rows], todo[shard_rows:]
        shards.append(_write(out / shard_name(len(shards)), [(r, recs[r]) for r in chunk], rows))
    manifest = _manifest(len(rows), shards, {**old.get("settings", {}), **(settings or {})})
    write_text_atomic(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def _runs(rows: list[int]) -> list[list[int]]:
    """Sorted row numbers as [start, end) runs: [0, 1, 2, 5] -> [[0, 3], [5, 6]]."""
    out: list[list[int]] = []
    for r in rows:
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def _write(path: Path, recs: list[tuple[int, dict]], prompts: list[dict]) -> dict:
    ids, lengths, prompt_lengths, row_of, turns, cut = [], [], [], [], [], []
    sources: Counter = Counter()
    answered: Counter = Counter()
    tokens: Counter = Counter()
    for row, rec in recs:
        source = prompts[row].get("source", "prompts")
        sources[source] += 1
        for t, s in enumerate(rec["samples"]):
            p, r = s["prompt_ids"], s["response_ids"]
            if not r:
                continue
            bad = [x for x in p + r if not (isinstance(x, int) and 0 <= x <= MAX_ID)]
            if bad:
                raise ValueError(f"--generated: row {row} turn {t + 1} holds token ids that are not in 0..{MAX_ID} "
                                 f"(e.g. {bad[0]!r})")
            ids += p + r
            lengths.append(len(p) + len(r))
            prompt_lengths.append(len(p))
            row_of.append(row)
            turns.append(t)
            cut.append(s.get("finish") == "length")
            answered[source] += 1
            tokens[source] += len(r)
    with replacing(path) as tmp:
        with tmp.open("wb") as f:
            np.savez_compressed(f, ids=np.asarray(ids, np.uint16), lengths=np.asarray(lengths, np.int32),
                                prompt_lengths=np.asarray(prompt_lengths, np.int32), rows=np.asarray(row_of, np.int32),
                                turns=np.asarray(turns, np.uint8), cut=np.asarray(cut, bool))
    return {"file": path.name, "rows": _runs([r for r, _ in recs]), "samples": len(lengths),
            "prompt_tokens": int(sum(prompt_lengths)), "response_tokens": int(sum(lengths) - sum(prompt_lengths)),
            "cut": int(sum(cut)), "sources": {s: {"conversations": sources[s], "samples": answered[s],
                                                  "response_tokens": tokens[s]} for s in sorted(sources)},
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _manifest(prompts: int, shards: list[dict], settings: dict) -> dict:
    sources: dict[str, Counter] = {}
    for s in shards:
        for name, c in s["sources"].items():
            sources.setdefault(name, Counter()).update(c)
    return {"format": FORMAT, "prompts": prompts,
            "conversations": sum(hi - lo for s in shards for lo, hi in s["rows"]),
            "samples": sum(s["samples"] for s in shards),
            "prompt_tokens": sum(s["prompt_tokens"] for s in shards),
            "response_tokens": sum(s["response_tokens"] for s in shards),
            "cut": sum(s["cut"] for s in shards),
            "sources": {k: dict(sources[k]) for k in sorted(sources)}, "settings": settings, "shards": shards}


def load(corpus: str | Path, verify: bool = True, vocab_size: int | None = None) -> list[tuple[list[int], list[int]]]:
    """[(prompt ids, response ids)] of every sample of the corpus, in shard order (rows ascending in each).
    verify: check each shard's sha256 against the manifest (a corrupt or replaced shard is named). A shard whose
    arrays do not fit together, or a sample with an id >= vocab_size (when given), is a ValueError naming the
    shard, the prompt row and the turn."""
    corpus = Path(corpus)
    out = []
    for s in read_manifest(corpus)["shards"]:
        path = corpus / s["file"]
        if not path.is_file():
            raise ValueError(f"corpus: {path} is missing (the manifest lists it)")
        if verify and hashlib.sha256(path.read_bytes()).hexdigest() != s["sha256"]:
            raise ValueError(f"corpus: {path} does not match its sha256 in the manifest")
        with np.load(path) as z:
            ids, lengths, plen = z["ids"].astype(np.int64), z["lengths"], z["prompt_lengths"]
            rows, turns = z["rows"], z["turns"]
        if lengths.sum() != len(ids) or not (len(plen) == len(rows) == len(turns) == len(lengths)) \
                or ((plen < 1) | (plen >= lengths)).any():
            raise ValueError(f"corpus: {path}: its arrays do not fit together (ids, lengths, prompt_lengths, rows, "
                             f"turns); rebuild it with dcoco data pack")
        ends = np.cumsum(lengths)
        if vocab_size is not None and len(ids) and ids.max() >= vocab_size:
            j = int(np.searchsorted(ends, int(np.argmax(ids >= vocab_size)), side="right"))
            raise ValueError(f"corpus: {path}: row {int(rows[j])} turn {int(turns[j]) + 1} holds a token id >= "
                             f"{vocab_size}, the target's vocabulary")
        out += [(ids[e - n:e - n + p].tolist(), ids[e - n + p:e].tolist()) for e, n, p in zip(ends, lengths, plen)]
    return out
