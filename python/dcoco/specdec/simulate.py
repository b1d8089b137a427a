"""Greedy speculative decoding simulated from one teacher-forced target pass.

Greedy verification accepts the longest draft prefix equal to the target's own greedy continuation, so once that
continuation is known (target_only), a round at any point of it is decided by the drafts alone: draft from the
target's features of everything before the anchor, accept against the continuation. One target pass over
prompt + continuation gives those features for every anchor; the drafter drafts every anchor's block in one
batched pass (the training forward, same mask and positions as Engine's one-block drafts); the rounds are then a
walk over the per-anchor acceptance. The Result is the one Engine.generate(reference=continuation) returns
(equal up to float rounding between batched and one-block passes), without a verify pass or a decode per method:
many more prompts for the same time. Tokens/s and losslessness still need real decoding (Engine).

Also returned: teacher-forced coverage (the paper's Fig. 1) at every anchor and every slot, not only the slots a
decode reached with its prefix accepted."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

import torch

from ..files import write_text_atomic
from .engine import KS, Engine, Result


@torch.no_grad()
def simulate(engine: Engine, prompt_ids: Sequence[int], reference: Sequence[int], max_new_tokens: int,
             chunk: int = 64, hidden_states: Sequence[torch.Tensor] | None = None,
             shared: dict | None = None) -> Result:
    """The Result of engine.generate(prompt_ids, max_new_tokens, reference=reference) (greedy), simulated.
    reference: the target's greedy continuation (target_only tokens with at least max_new_tokens, or ending at
    eos); chunk: anchors per drafter pass; hidden_states: target_pass's, to share one target pass between
    engines; shared: a dict for this prompt in which engines with the same drafter share its blocks and top-k.
    Result.seconds is the simulation's time. Adds tf_hits (B,len(KS)) / tf_seen (B,): anchors whose slot i has a
    reference token, and those where it is in the drafter's top-k."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
    ref = list(reference)[:max_new_tokens]
    if not ref:
        raise ValueError("reference: expected the target's greedy continuation (at least one token)")
    if any(t in engine.eos for t in ref[:-1]) or (len(ref) < max_new_tokens and ref[-1] not in engine.eos):
        raise ValueError(f"reference: expected target_only's tokens for this prompt, ending at eos or at least "
                         f"max_new_tokens ({max_new_tokens}) long, got {len(ref)} tokens")
    t0 = time.perf_counter()
    P, T, B = len(prompt_ids), len(ref), engine.drafter.config.block_size - 1
    if T == 1:  # no round: the prefill's token was all
        empty = torch.zeros(B, len(KS), dtype=torch.long)
        return Result(ref, [], [], empty, empty[:, 0], time.perf_counter() - t0, tf_hits=empty, tf_seen=empty[:, 0])
    seq = list(prompt_ids) + ref
    if hidden_states is None:
        hidden_states = target_pass(engine.target, seq[:P + T - 1]).hidden_states
    drafted, cands, vals, hc = _blocks(engine, seq, P, T, chunk, hidden_states, {} if shared is None else shared)
    tgt = torch.tensor(ref + [-1] * B)
    slots = torch.arange(1, B + 1)
    labels = tgt[(torch.arange(T - 1)[:, None] + slots).clamp(max=T + B - 1)]       # (T-1,B), -1 past the end
    rank = torch.where(cands == labels[..., None], torch.arange(cands.shape[-1]), cands.shape[-1]).min(-1).values
    has = labels >= 0
    tf_seen = has.sum(0)
    tf_hits = torch.stack([(has & (rank < k)).sum(0) for k in KS], 1)
    hits, seen = torch.zeros(B, len(KS), dtype=torch.long), torch.zeros(B, dtype=torch.long)
    committed, accepted, walks, firsts = [], [], [], []
    thits = tseen = 0
    L = 1  # tokens committed; the first came from the prefill
    while L < T:
        n = min(B, max_new_tokens - L - 1)
        r = L - 1
        m = min(n, T - L)  # slots with a reference token
        a = int((drafted[r, :m] == labels[r, :m]).long().cumprod(0).sum())
        t1 = time.perf_counter()
        w, f, h, c = engine.oracle(ref[L:L + n], T - L, cands[r], vals[r], hc[r:r + 1], seq[P + r])
        t0 += time.perf_counter() - t1  # as in Engine.generate: measurement is kept out of the timing
        walks.append(w)
        firsts.append(f)
        thits, tseen = thits + h, tseen + c
        k = min(a + 1, n)  # slots whose prefix was accepted, as Engine.generate counts coverage
        seen[:k] += has[r, :k]
        hits[:k] += torch.stack([rank[r, :k] < kk for kk in KS], 1).long() * has[r, :k, None]
        committed.append(min(a + 1, T - L))
        accepted.append(a)
        L += committed[-1]
    return Result(ref, committed, accepted, hits, seen, time.perf_counter() - t0, walks, firsts, thits, tseen,
                  tf_hits, tf_seen)


def target_pass(target, ids: Sequence[int]):
    """The target's output (logits, hidden_states) over ids: the pass simulate drafts from (prompt + the
    reference without its last token)."""
    return target(input_ids=torch.tensor([list(ids)], device=target.device), output_hidden_states=True)


def _blocks(engine: Engine, seq: list[int], P: int, T: int, chunk: int, hidden_states: Sequence[torch.Tensor],
            shared: dict) -> tuple[torch.Tensor, ...]:
    """engine.draft's outputs for the blocks at anchors P..P+T-2 (the committed tokens 1..T-1; row L-1 is the
    round after L committed tokens), on the CPU. The drafter's pass and top-k are kept in shared."""
    dev = engine.target.device
    ids = torch.tensor([seq[:P + T - 1]], device=dev)
    ctx = engine.drafter.target_features(hidden_states)  # (1,S,n*d)
    if ctx.shape[1] != P + T - 1:
        raise ValueError(f"hidden_states: expected {P + T - 1} positions (prompt + reference[:-1]), got {ctx.shape[1]}")
    parts = []
    for lo in range(P, P + T - 1, chunk):
        anchors = torch.arange(lo, min(lo + chunk, P + T - 1), device=dev)[None]
        key = (id(engine.drafter), id(engine.drafter.draft_head), engine.top, lo)
        if key not in shared:
            h = engine.drafter(ids, ctx, anchors, engine.embed)[0]  # (A,B+1,d), the anchor's position first
            shared[key] = h, engine.candidates(h[:, 1:])
        h, top = shared[key]
        parts.append([x.cpu() for x in engine.draft(h, ids[0, anchors[0]], top)])
    return tuple(torch.cat(p) for p in zip(*parts))


# ---- over suites: references (cached), every method on every prompt, tables with paired CIs ----

def references(target, suites: Mapping[str, Sequence[list[int]]], max_new_tokens: int, eos: Collection[int],
               cache: str | Path | None = None, progress: bool = True) -> dict[str, list[list[int]]]:
    """{suite: the target's greedy continuation of every prompt, up to max_new_tokens or eos}; cached in
    cache/refs-KEY.json (KEY: the target's fingerprint, the prompts, max_new_tokens and eos).

    Generated in padded batches (corpus.generate: far faster than one prompt at a time on a CPU), then
    checked by one teacher-forced pass per prompt, the pass the simulation drafts from: where a float near-tie
    under padding made the batch pick another token than that pass's argmax, the continuation is redone from
    there one prompt at a time (target_only)."""
    from tqdm.auto import tqdm

    from ..target.corpus import CorpusSettings, fingerprint, generate
    from .engine import target_only

    path = None
    if cache is not None:
        h = hashlib.sha256(fingerprint(target).encode())
        h.update(json.dumps([suites, max_new_tokens, sorted(eos), "batched+checked"], sort_keys=True).encode())
        path = Path(cache) / f"refs-{h.hexdigest()[:20]}.json"
        if path.is_file():
            return json.loads(path.read_text())
    flat = [p for prompts in suites.values() for p in prompts]
    if eos:
        gen = [r for _, r in generate(target, flat, CorpusSettings((0,), max_new_tokens=max_new_tokens), list(eos),
                                      progress)]
    else:  # generate pads with an eos id
        gen = [target_only(target, p, max_new_tokens, eos_token_id=None).tokens for p in flat]
    refs, redone = [], 0
    for p, r in zip(tqdm(flat, desc="check references", unit="prompt", disable=not progress), gen):
        with torch.no_grad():
            best = target(input_ids=torch.tensor([p + r[:-1]], device=target.device)).logits[0, len(p) - 1:]
        diff = next((j for j, t in enumerate(best.argmax(-1).tolist()) if t != r[j]), None)
        if diff is not None:
            r = r[:diff] + target_only(target, p + r[:diff], max_new_tokens - diff, eos_token_id=list(eos)).tokens
            redone += 1
        refs.append(r)
    if progress and redone:
        print(f"references: {redone} of {len(flat)} continued one prompt at a time after a batched near-tie")
    out, k = {}, 0
    for name, prompts in suites.items():
        out[name], k = refs[k:k + len(prompts)], k + len(prompts)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(out))
    return out


def simulate_all(engines: Mapping[str, Engine], suites: Mapping[str, Sequence[list[int]]],
                 refs: Mapping[str, Sequence[list[int]]], max_new_tokens: int,
                 progress: bool = True) -> dict[str, dict[str, list[Result]]]:
    """{method: {suite: [Result per prompt]}}: every engine simulated on every prompt against its reference (one
    target pass per prompt, shared; the engines must share their target)."""
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(map(len, suites.values())), desc="simulate", unit="prompt", disable=not progress)
    out: dict[str, dict[str, list[Result]]] = {m: {name: [] for name in suites} for m in engines}
    target = next(iter(engines.values())).target
    for name, prompts in suites.items():
        for p, ref in zip(prompts, refs[name]):
            ref = list(ref)[:max_new_tokens]
            with torch.no_grad():  # one target pass per prompt, shared by every method
                hs = target_pass(target, list(p) + ref[:-1]).hidden_states
            shared: dict = {}  # engines with one drafter draft once
            for m, eng in engines.items():
                out[m][name].append(simulate(eng, p, ref, max_new_tokens, hidden_states=hs, shared=shared))
            bar.update()
    bar.close()
    return out


def report(per: Mapping[str, Mapping[str, Sequence[Result]]], base: str) -> dict[str, dict]:
    """{method: {"overall": row, "suites": {suite: row}}}: a row is spec.summarize plus tau_ci, ratio (tau over
    base's) and ratio_ci from stats.tau_table (95%, paired bootstrap over prompts)."""
    from .engine import summarize
    from .stats import tau_table

    suites = list(next(iter(per.values())))
    groups: dict[str, dict[str, Sequence[Result]]] = {
        "overall": {m: [r for s in suites for r in per[m][s]] for m in per}}
    groups.update({s: {m: per[m][s] for m in per} for s in suites})
    tables = {g: tau_table(rs, base) for g, rs in groups.items()}
    out = {}
    for m in per:
        rows = {g: {**summarize(groups[g][m]), **{k: v for k, v in tables[g][m].items() if k != "tau"}}
                for g in groups}
        out[m] = {"overall": rows.pop("overall"), "suites": rows}
    return out
