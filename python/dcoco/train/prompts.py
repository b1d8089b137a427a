"""`dcoco data prompts`: user prompts at scale with no data set, written by the target itself (Magpie): the chat
template up to the start of a user turn is sent as a raw completion, so the model writes the user's query, which
is then answered through the template as usual (`dcoco data generate`). A system prompt and an opening phrase
steer each request towards one domain (math word problems, code tasks, open chat); the draws are seeded per
request, so a run is reproducible and shards split it.

The kept set, `prompts.jsonl` ({"turns", "source"} rows, the input `dcoco data generate` reads), merges the
generated queries with other prompt files (the prompts dcoco ships and the suites' training rows), after:
- filtering degenerate text (cut off, too short or long, repetitive, mostly symbols, template tokens);
- exact deduplication (case, spacing and punctuation folded) and near deduplication (MinHash LSH over word
  5-grams, Jaccard >= NEAR_DUPLICATE);
- decontamination: no prompt shares a word 13-gram with an evaluated row (rows below EVAL_ROWS_RESERVED of every
  suite). A 13-gram that occurs in several evaluated rows is the suite's instruction boilerplate ("Please reason
  step by step, ..."), not its content, and does not count.
A rebuild keeps the rows already in prompts.jsonl, in place, and appends the new ones: row numbers are what
generated answers are keyed by."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import cast

from tqdm import tqdm

from ..files import write_text_atomic
from ..jsonl import append_record, read_lines, read_records, write_records

EVAL_ROWS_RESERVED = 32   # the evaluated rows of every suite: those below this index (the demo's, `dcoco eval`'s)
NGRAM = 13                # decontamination: word n-grams shared with an evaluated row
BOILERPLATE_ROWS = 3      # an n-gram in at least this many evaluated rows is a suite's instructions, not content
NEAR_DUPLICATE = 0.7      # MinHash Jaccard threshold over word 5-grams
SHINGLE, PERMUTATIONS = 5, 128
MIN_CHARS, MAX_CHARS = 16, 2000


@dataclasses.dataclass(frozen=True)
class Domain:
    """How one domain's requests are steered: a system prompt for the query-writing turn and opening phrases
    (one drawn per request; "" lets the model start freely); suffixes: appended to a kept query (one drawn per
    prompt, "" for none), as the evaluated suites add theirs."""
    system: str | None
    openings: tuple[str, ...]
    suffixes: tuple[str, ...] = ("",)


BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
DOMAINS = {
    "math": Domain("You are a patient math tutor. Students send you math word problems, arithmetic, algebra, "
                   "geometry, probability and competition problems to solve.",
                   ("", "", "A", "If", "How many", "What is", "Solve", "Find", "Calculate", "John", "Sarah", "A store",
                    "The sum", "Let", "In a"),
                   ("", BOXED, BOXED)),
    "code": Domain("You are an expert Python programmer. Users ask you to write functions, fix bugs, explain code and "
                   "solve programming problems.",
                   ("", "", "Write a Python function", "Write a function", "Write a program", "Implement",
                    "Given a list", "Given a string", "How do I", "Create a class", "def", "Fix")),
    "chat": Domain(None, ("", "", "", "What", "How", "Why", "Can you", "Explain", "Write", "Give me", "Describe",
                          "I", "Tell me", "Compare")),
}
MIX = {"math": 0.35, "code": 0.35, "chat": 0.30}


@dataclasses.dataclass(frozen=True)
class PromptConfig:
    """`dcoco data prompts`: where to ask, how many queries and how each is drawn."""
    endpoint: str
    model: str
    out: str | Path
    count: int                    # queries requested in all (this shard does every num_shards-th)
    seed: int = 0
    shard: int = 0
    num_shards: int = 1
    mix: dict[str, float] = dataclasses.field(default_factory=lambda: dict(MIX))
    max_tokens: int = 160         # a query longer than this is dropped (cut off)
    temperature: float = 1.0
    top_p: float = 0.95
    concurrency: int = 64
    timeout: float = 600.0


def pre_query(tokenizer, system: str | None) -> list[int]:
    """Token ids of the chat template up to where a user turn's text begins (with `system`, or the template's
    own default system prompt when None): the template is rendered around a marker and cut there."""
    marker = "\x00QUERY\x00"
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": marker}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    if marker not in text:
        raise ValueError("tokenizer: its chat template does not show the user's text verbatim")
    return list(tokenizer(text[:text.index(marker)], add_special_tokens=False)["input_ids"])


def draw(cfg: PromptConfig, i: int) -> dict:
    """Request i's domain, opening and suffix and its sampling seed: a function of (cfg.seed, i) alone."""
    rng = random.Random(cfg.seed * 1_000_003 + i)
    names = sorted(cfg.mix)
    domain = rng.choices(names, weights=[cfg.mix[n] for n in names])[0]
    d = DOMAINS[domain]
    return {"i": i, "domain": domain, "opening": rng.choice(d.openings), "suffix": rng.choice(d.suffixes),
            "seed": rng.randrange(2 ** 31)}


def raw_path(out: Path, shard: int, num_shards: int) -> Path:
    return out / f"raw-{shard:05d}-of-{num_shards:05d}.jsonl"


def generate(tokenizer, cfg: PromptConfig, progress: bool = True) -> dict:
    """Requests this shard's queries not yet in its raw file (resumable: a rerun asks only for the missing ones).
    Returns {written, failed, skipped, path}."""
    for name, v in (("--count", cfg.count), ("--num-shards", cfg.num_shards), ("--concurrency", cfg.concurrency),
                    ("--max-tokens", cfg.max_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    if not 0 <= cfg.shard < cfg.num_shards:
        raise ValueError(f"--shard: expected 0..{cfg.num_shards - 1}, got {cfg.shard}")
    unknown = sorted(set(cfg.mix) - set(DOMAINS))
    if unknown or not cfg.mix or any(not (w >= 0) for w in cfg.mix.values()) or sum(cfg.mix.values()) <= 0:
        raise ValueError(f"--mix: expected weights >= 0 (not all 0) for domains among {sorted(DOMAINS)}, got "
                         f"{cfg.mix}")
    if not (cfg.temperature >= 0 and 0 < cfg.top_p <= 1):
        raise ValueError(f"--temperature / --top-p: expected >= 0 and in (0, 1], got {cfg.temperature}, {cfg.top_p}")
    base = cfg.endpoint.rstrip("/").removesuffix("/v1")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"--endpoint: expected an http(s):// URL, got {cfg.endpoint!r}")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    path = raw_path(out, cfg.shard, cfg.num_shards)
    done = {r["i"] for r in read_records(path)}
    todo = [draw(cfg, i) for i in range(cfg.shard, cfg.count, cfg.num_shards) if i not in done]
    heads = {name: pre_query(tokenizer, d.system) for name, d in DOMAINS.items()}
    eos = tokenizer.eos_token_id
    counts = asyncio.run(_request(base, cfg, todo, heads, tokenizer, eos, path, progress))
    return {**counts, "skipped": len(done), "path": str(path)}


async def _request(base: str, cfg: PromptConfig, todo: list[dict], heads: dict, tokenizer, eos, path: Path,
                   progress: bool) -> dict:
    import httpx

    bar = tqdm(total=len(todo), desc="prompts", disable=not progress)
    say = bar.write if progress else (lambda m: print(m, file=sys.stderr))
    sem, counts = asyncio.Semaphore(cfg.concurrency), {"written": 0, "failed": 0}

    async def one(client, d: dict):
        opening = d["opening"]
        ids = heads[d["domain"]] + (tokenizer(opening, add_special_tokens=False)["input_ids"] if opening else [])
        body = {"model": cfg.model, "prompt": ids, "max_tokens": cfg.max_tokens, "temperature": cfg.temperature,
                "top_p": cfg.top_p, "seed": d["seed"], **({"stop_token_ids": [eos]} if eos is not None else {})}
        async with sem:
            try:
                r = await client.post(f"{base}/v1/completions", json=body)
                r.raise_for_status()
                choice = r.json()["choices"][0]
                text, finish = choice["text"], choice.get("finish_reason")
                if not isinstance(text, str):
                    raise TypeError(f"'text' is {type(text).__name__}")
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
                counts["failed"] += 1
                if counts["failed"] <= 3:
                    say(f"request {d['i']} failed ({type(e).__name__}: {str(e)[:200]}); rerun to retry it")
                bar.update(1)
                return
        append_record(path, {**d, "text": opening + text, "finish": finish})  # the query as the model wrote it
        counts["written"] += 1
        bar.update(1)

    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    async with httpx.AsyncClient(timeout=cfg.timeout, limits=limits) as client:
        await asyncio.gather(*(one(client, d) for d in todo))
    bar.close()
    return counts


# -- filtering, deduplication, decontamination


WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def ngrams(ws: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(ws[k:k + n]) for k in range(len(ws) - n + 1)}


def degenerate(text: str) -> str | None:
    """Why a query is not kept as a prompt (None: it is)."""
    t = text.strip()
    if len(t) < MIN_CHARS:
        return "too short"
    if len(t) > MAX_CHARS:
        return "too long"
    if "<|" in t or "|>" in t:
        return "template tokens"
    letters = sum(c.isalpha() for c in t)
    if letters < 0.5 * len(t.replace(" ", "")):
        return "mostly symbols"
    if sum(ord(c) < 128 for c in t) < 0.95 * len(t):
        return "not English text"
    if re.search(r"(.)\1{9,}", t) or re.search(r"(.{2,30}?)\1{4,}", t):
        return "repetitive"
    ws = words(t)
    if len(ws) < 4:
        return "too short"
    if len(ws) >= 20 and len(ngrams(ws, 3)) < 0.6 * (len(ws) - 2):
        return "repetitive"
    return None


def fold(text: str) -> str:
    """The exact-duplicate key: case, spacing and punctuation folded."""
    return " ".join(words(text))


class Contamination:
    """The word 13-grams of the evaluated rows' content, and the rows themselves (folded). A suite's instructions
    are not content: a line found in BOILERPLATE_ROWS rows or more of the suites ("Please reason step by step, ...",
    a code-format line) is taken out of every text first, and a 13-gram still found in that many evaluated rows
    does not count either."""

    def __init__(self, evaluated: Iterable[str], suite_rows: Iterable[str] = ()):
        lines: Counter = Counter()
        evaluated = list(evaluated)
        for text in [*evaluated, *suite_rows]:
            lines.update({fold(x) for x in text.split("\n")} - {""})
        self.lines = {x for x, n in lines.items() if n >= BOILERPLATE_ROWS}
        seen: Counter = Counter()
        for text in evaluated:
            seen.update(self.grams_of(text))
        self.grams = {g for g, n in seen.items() if n < BOILERPLATE_ROWS}
        self.boilerplate = len(seen) - len(self.grams)
        self.exact = {fold(text) for text in evaluated}  # rows shorter than 13 words have no 13-gram

    def grams_of(self, text: str) -> set[tuple[str, ...]]:
        """The 13-grams of text's content lines (each line's words, the lines joined)."""
        kept = [x for x in map(fold, text.split("\n")) if x and x not in self.lines]
        return ngrams(" ".join(kept).split(), NGRAM)

    def hits(self, text: str) -> bool:
        return fold(text) in self.exact or not self.grams.isdisjoint(self.grams_of(text))


def evaluated_rows(suites_dir, reserved: int) -> tuple[list[str], list[str]]:
    """(every turn of the rows below `reserved` of every suite in suites_dir, every turn of the other rows)."""
    below: list[str] = []
    above: list[str] = []
    for f in sorted(Path(suites_dir).glob("*.jsonl")):
        for n, row in read_lines(f.read_text(encoding="utf-8")):
            turns = cast(dict, row).get("turns", [])  # a suite row is a JSON object
            (below if n <= reserved else above).extend(t for t in turns if isinstance(t, str))
    return below, above


def _minhash(ws: Sequence[str]):
    from datasketch import MinHash

    m = MinHash(num_perm=PERMUTATIONS, seed=1)
    grams = ngrams(ws, SHINGLE) or {tuple(ws)}
    m.update_batch([" ".join(g).encode() for g in grams])
    return m


def build(candidates: Iterable[dict], out: str | Path, contamination: Contamination,
          progress: bool = True) -> dict:
    """Writes out/prompts.jsonl: the rows already there, then every candidate ({"turns", "source"}; "generated":
    true for the model's own queries, which alone are checked for degenerate text) that passes the filters, is no
    duplicate of a kept row and shares no 13-gram with an evaluated row; out/prompts.json: the counts (kept per
    source, dropped per reason). Returns that summary."""
    from datasketch import MinHashLSH

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "prompts.jsonl"
    kept = read_records(path)
    lsh = MinHashLSH(threshold=NEAR_DUPLICATE, num_perm=PERMUTATIONS)
    earlier = {fold(" ".join(row["turns"])) for row in kept}
    for k, row in enumerate(kept):
        lsh.insert(str(k), _minhash(fold(" ".join(row["turns"])).split()))
    exact = set(earlier)
    before, again = len(kept), 0
    dropped: Counter = Counter()
    for row in tqdm(list(candidates), desc="prompt filters", disable=not progress):
        turns = [t.strip() for t in row["turns"]]
        text = " ".join(turns)
        key = fold(text)
        if key in earlier:  # kept by an earlier build
            again += 1
            continue
        why = next((w for w in map(degenerate, turns) if w), None) if row.get("generated") else None
        if why is None and key in exact:
            why = "duplicate"
        if why is None and contamination.hits(text):
            why = "an evaluated row or a 13-gram of one"
        m = None
        if why is None:
            m = _minhash(key.split())
            if lsh.query(m):
                why = "near duplicate"
        if why is not None:
            dropped[why] += 1
            continue
        exact.add(key)
        lsh.insert(str(len(kept)), m)
        kept.append({"turns": turns, "source": row["source"]})
    write_records(path, kept)
    summary = {"prompts": len(kept), "added": len(kept) - before, "kept_before": again,
               "sources": dict(sorted(Counter(r["source"] for r in kept).items())),
               "dropped": dict(sorted(dropped.items())), "boilerplate_lines": len(contamination.lines),
               "boilerplate_ngrams": contamination.boilerplate,
               "near_duplicate": NEAR_DUPLICATE, "ngram": NGRAM}
    write_text_atomic(out / "prompts.json", json.dumps(summary, indent=2) + "\n")
    return summary


def generated_candidates(out: str | Path) -> list[dict]:
    """The finished queries of every raw shard in out, in request order, each with its domain's suffix, as
    {"turns", "source": "magpie-<domain>"} (a cut-off query is dropped: it was not finished)."""
    recs = sorted((r for f in sorted(Path(out).glob("raw-*.jsonl")) for r in read_records(f)), key=lambda r: r["i"])
    return [{"turns": [r["text"].strip() + r["suffix"]], "source": f"magpie-{r['domain']}", "generated": True}
            for r in recs if r.get("finish") == "stop" and r["text"].strip()]


def file_candidates(paths: Sequence[str | Path], skip_rows: int = 0) -> list[dict]:
    """The rows of chat JSONL files (any shape `dcoco data generate` reads) from row skip_rows on, as
    {"turns", "source": <file stem>}."""
    from .datagen import inputs

    return [{"turns": turns, "source": source} for source, row, system, turns in inputs(paths)
            if row >= skip_rows and turns and system is None]


def build_default(out: str | Path, inputs: Sequence[str | Path] = (), shipped: bool = True,
                  progress: bool = True) -> dict:
    """build() over, in this order: the prompts dcoco ships and every suite's rows from EVAL_ROWS_RESERVED on
    (shipped), the files `inputs` (every row), then the queries generated into out."""
    from importlib import resources

    from ..suites import default_suites

    suites = default_suites()
    cands: list[dict] = []
    if shipped:
        cands += [{**c, "source": "shipped"}
                  for c in file_candidates([Path(str(resources.files("dcoco") / "data" / "prompts.jsonl"))])]
        cands += file_candidates(sorted(suites.glob("*.jsonl")), skip_rows=EVAL_ROWS_RESERVED)
    cands += file_candidates(inputs) + generated_candidates(out)
    return build(cands, out, Contamination(*evaluated_rows(suites, EVAL_ROWS_RESERVED)), progress)
