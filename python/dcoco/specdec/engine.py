"""An offline speculative-decoding engine: a Hugging Face causal-LM target, a DFlash drafter and an optional
DCOCO corrector, with greedy and sampling verification (docs/spec.md, "Verification") and the metrics the paper
reports: tau, per-position acceptance, tokens/s and per-slot top-k coverage (Fig. 1).

One round: draft a block (anchor = last committed token, context = target features of every committed position
before it) -> top-K per drafted slot -> select (argmax = plain DFlash, or the corrector) -> verify anchor + drafts
in ONE target pass over the KV cache -> commit accepted + 1 tokens, crop the cache back to the committed length
and keep the verified positions' features for the next round. Prompts of a batch are decoded one after another
(batch size 1 per target pass). The drafter has no KV cache of its own: it re-reads the whole context each round.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from ..ops import fused
from . import inputs
from ..corrector import Corrector
from ..modeling.dflash import DFlashDrafter
from ..ops.select import sample, select
from ..modeling.domino import DominoHead
from ..modeling.dspark import DSparkHead
from ..modeling.selector import CandidateSelector

if TYPE_CHECKING:
    from transformers import PreTrainedModel

KS = (1, 2, 4, 8, 16)  # coverage is reported for the drafter's top-k at these k
# the baselines that draft slot by slot, greedily, each slot's pick known before the next is scored: DFlash2's
# selector over the top-K candidates, Domino's and DSpark's heads over the whole vocabulary
SEQUENTIAL = (CandidateSelector, DominoHead, DSparkHead)


@dataclasses.dataclass
class Result:
    """One prompt's decode. tokens: the generated ids (eos included when hit). committed[r] / accepted[r]: tokens
    committed / drafts accepted in round r (committed = accepted + 1 unless an eos cut it).
    cover_hits (B,len(KS)): rounds where slot i's verified token was in the drafter's top-KS[j]; cover_seen (B,):
    rounds where slot i was verified with its whole prefix accepted. The first token comes from the prefill,
    not a round; target-only decodes have no rounds.
    With a greedy reference (Engine.generate), per round while the decode still follows it: oracle_walk /
    oracle_prefix, the tokens an oracle choosing among the top-K candidates would commit (any candidate at
    every slot / slot 1 fixed at rank 0, the prefix-first corrector's ceiling); trans_hits / trans_seen, the
    adjacent slot pairs with both reference tokens in the top-K, and those where the corrector's
    argmax_b S_p(a*, b) given the reference rank a* is the reference rank b* (teacher-forced)."""
    tokens: list[int]
    committed: list[int]
    accepted: list[int]
    cover_hits: torch.Tensor
    cover_seen: torch.Tensor
    seconds: float
    oracle_walk: list[int] = dataclasses.field(default_factory=list)
    oracle_prefix: list[int] = dataclasses.field(default_factory=list)
    trans_hits: int = 0
    trans_seen: int = 0
    tf_hits: torch.Tensor | None = None  # simulate.py: teacher-forced coverage at every anchor (B,len(KS))
    tf_seen: torch.Tensor | None = None  # (B,) anchors whose slot i has a reference token

    @property
    def rounds(self) -> int:
        return len(self.committed)


def probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """The target's sampling distribution (...,V) float32: softmax(logits / temperature) restricted to the top_k
    tokens (0 = all), then to the smallest prefix (by probability) whose mass reaches top_p, renormalised."""
    x = logits.float() / temperature
    if 0 < top_k < x.shape[-1]:
        x = x.masked_fill(x < x.topk(top_k, -1).values[..., -1:], -math.inf)
    if top_p < 1:
        p, order = x.softmax(-1).sort(-1, descending=True)
        drop = p.cumsum(-1) - p >= top_p  # mass before a token already reaches top_p; the first always stays
        x = x.masked_fill(drop.scatter(-1, order, drop), -math.inf)
    return x.softmax(-1)


def _sample(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(p.cpu(), 1, generator=generator))


def _forward(target: PreTrainedModel, ids: list[int], cache, hidden: bool = False):
    """One target pass over ids (batch 1) appended to cache. Recent transformers 5 releases (5.24 here) name the
    argument cache; earlier ones past_key_values (deprecated since, with a warning)."""
    kw = "cache" if "cache" in inspect.signature(target.forward).parameters else "past_key_values"
    return target(input_ids=torch.tensor([ids], device=target.device), use_cache=True, output_hidden_states=hidden,
                  **{kw: cache})


def _eos_set(target: PreTrainedModel, eos_token_id) -> set[int]:
    eos = target.config.eos_token_id if eos_token_id == "auto" else eos_token_id
    return set() if eos is None else {eos} if isinstance(eos, int) else set(eos)


def _next_token(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                generator: torch.Generator | None) -> int:
    """One token from last-position logits (V,): argmax at temperature 0, else a sample."""
    if temperature == 0:
        return int(logits.argmax())
    return _sample(probs(logits, temperature, top_p, top_k), generator)


@torch.no_grad()
def target_only(target: PreTrainedModel, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                top_p: float = 1.0, top_k: int = 0, generator: torch.Generator | None = None,
                eos_token_id="auto") -> Result:
    """Baseline: plain autoregressive decoding with the target's KV cache (one target pass per token).
    eos_token_id: int, list, None (never stop) or "auto" (the target config's)."""
    from transformers import DynamicCache

    inputs.check_sampling(max_new_tokens, temperature, top_p, top_k)
    inputs.check_prompt(prompt_ids, target.config.vocab_size)
    eos = _eos_set(target, eos_token_id)
    t0 = time.perf_counter()
    cache = DynamicCache()
    ids, tokens = list(prompt_ids), []
    while True:
        logits = _forward(target, ids, cache).logits[0, -1]
        tokens.append(_next_token(logits, temperature, top_p, top_k, generator))
        if tokens[-1] in eos or len(tokens) == max_new_tokens:
            break
        ids = tokens[-1:]
    empty = torch.zeros(0, len(KS), dtype=torch.long)
    return Result(tokens, [], [], empty, empty[:, 0], time.perf_counter() - t0)


class Engine:
    """Speculative decoding with target (a transformers causal LM, run with its KV cache), drafter and an
    optional corrector. rule: the corrector's path rule (greedy = the fused op, global / geometric = score grid
    + dcoco.select with weight lam); num_candidates: K, the top-K per slot the corrector chooses from.
    eos_token_id: int, list, None (never stop) or "auto" (the target config's).
    draft_sample_method (what sampled decoding, temperature > 0, drafts): "greedy" drafts as at temperature 0
    and verifies a point-mass proposal (q = 1 at the draft: what vLLM verifies for greedy drafts, and on V2
    for the plugin's probabilistic ones); "probabilistic" samples the walk (dcoco.ops.select.sample, what the plugin
    serves on V1), each slot's token from softmax(S / T) over its K candidates given the previous pick
    (slot 1: softmax(l_1 / T); without a corrector every slot's own softmax(l / T)), and verifies that sparse
    proposal (accept with min(1, p/q), else sample max(p - q, 0) renormalised). Corrector rule "greedy" only."""

    def __init__(self, target: PreTrainedModel, drafter: DFlashDrafter,
                 corrector: Corrector | CandidateSelector | DominoHead | DSparkHead | None = None,
                 rule: str = "greedy", lam: float = 0.75, num_candidates: int = 16, eos_token_id="auto",
                 draft_sample_method: str = "greedy"):
        if not isinstance(drafter, DFlashDrafter):
            raise TypeError(f"drafter: expected a DFlashDrafter, got {type(drafter).__name__}")
        if corrector is not None and not isinstance(corrector, (Corrector, *SEQUENTIAL)):
            raise TypeError(f"corrector: expected a dcoco.Corrector, a CandidateSelector, a DominoHead, a DSparkHead "
                            f"or None, got {type(corrector).__name__}")
        self.embed = cast(torch.Tensor, target.get_input_embeddings().weight).detach()
        self.head = target.get_output_embeddings().weight.detach()
        V = self.head.shape[0]
        if drafter.config.vocab_size != V or self.embed.shape[0] != V:
            raise ValueError(f"drafter: vocab_size {drafter.config.vocab_size} differs from the target's {V}")
        if drafter.config.hidden_size != self.embed.shape[1]:
            raise ValueError(f"drafter: hidden_size {drafter.config.hidden_size} differs from the target's "
                             f"{self.embed.shape[1]}")
        if corrector is not None and corrector.hidden_size != drafter.config.hidden_size:
            raise ValueError(f"corrector: hidden_size {corrector.hidden_size} differs from the drafter's "
                             f"{drafter.config.hidden_size}")
        if isinstance(corrector, DominoHead) and corrector.embed_size != self.embed.shape[1]:
            raise ValueError(f"corrector: a DominoHead's embed_size {corrector.embed_size} differs from the target "
                             f"embedding's {self.embed.shape[1]}")
        self.check_selection(rule, lam, num_candidates)
        self.target, self.drafter, self.corrector = target, drafter, corrector
        self.rule, self.lam = rule, float(lam)
        self.K = min(num_candidates, V)
        self.top = min(max(self.K, max(KS)), V)  # candidates kept per slot: K for selection, up to 16 for coverage
        self.eos = _eos_set(target, eos_token_id)
        if isinstance(corrector, SEQUENTIAL) and (rule != "greedy" or corrector.vocab_size != V):
            raise ValueError(f"corrector: a {type(corrector).__name__} drafts greedily over a vocabulary of {V}; got "
                             f"rule {rule!r}, vocab_size {corrector.vocab_size}")
        draft_head = drafter.draft_head
        if draft_head is not None and isinstance(corrector, (DominoHead, DSparkHead)):
            raise ValueError(f"drafter: a {type(corrector).__name__} reads the drafter's logits over the whole "
                             f"vocabulary; this drafter drafts over a list of {len(draft_head)} tokens")
        if draft_head is not None and len(draft_head) < self.top:
            raise ValueError(f"drafter: its draft vocabulary has {len(draft_head)} tokens, fewer than the "
                             f"{self.top} candidates kept per slot")
        if draft_sample_method not in ("greedy", "probabilistic"):
            raise ValueError(f"draft_sample_method: expected 'greedy' or 'probabilistic', got {draft_sample_method!r}")
        if draft_sample_method == "probabilistic" and (rule != "greedy" or isinstance(corrector, SEQUENTIAL)):
            raise ValueError("draft_sample_method: 'probabilistic' samples the corrector's greedy walk (rule "
                             f"'greedy', a dcoco.Corrector or none), got rule {rule!r} with "
                             f"{type(corrector).__name__}")
        self.draft_sample_method = draft_sample_method
        if isinstance(corrector, Corrector) and rule == "greedy":
            corrector.prepare_inference(self.embed)

    def _draft(self, anchor: int, ctx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """For the block after anchor, ctx (1,C,n*d): drafted tokens (B,), the candidates' ids and logits
        (B,top) sorted by logit, and the drafter's hidden states (1,B+1,d) (the anchor's first) in the embedding's
        dtype."""
        anchor_ids = torch.tensor([anchor], device=ctx.device)
        h = self.drafter.draft(anchor_ids, ctx, self.embed)  # (1,B+1,d)
        drafted, ids, vals, hc = self.draft(h, anchor_ids)
        return drafted[0], ids[0], vals[0], hc

    def draft(self, h: torch.Tensor, anchor_ids: torch.Tensor,
               top: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, ...]:
        """Blocks' drafter hidden states h (R,B+1,d) (position 0 the anchor's) and anchor tokens (R,) -> the drafted
        tokens (R,B) (argmax, the corrector's pick by rule, or a SEQUENTIAL baseline's drafts), the candidates' ids
        and logits (R,B,top) sorted by logit, and h (R,B+1,d) in the embedding's dtype. One path for decoding (R=1)
        and simulation (every anchor at once). top: (ids, logits) of the slots' top self.top candidates when
        already computed (the simulation shares them between engines with one drafter)."""
        if top is None:
            top = self.candidates(h[:, 1:])
        ids, vals = top[0][..., :self.K], top[1][..., :self.K]
        hc = h.to(self.embed.dtype)
        c = self.corrector
        if c is None:
            drafted = ids[..., 0]
        elif isinstance(c, CandidateSelector):
            drafted = c(hc[:, 1:], ids, vals, anchor_ids)[1]
        elif isinstance(c, DominoHead):
            drafted = c(hc[:, 1:], DFlashDrafter.compute_logits(hc[:, 1:], self.head), anchor_ids, self.embed)
        elif isinstance(c, DSparkHead):
            drafted = c(hc[:, 1:], DFlashDrafter.compute_logits(hc[:, 1:], self.head), anchor_ids)[0]
        elif self.rule == "greedy":
            h, kw = self._hidden(hc, ids.shape[1], anchor_ids)
            drafted = c(h, ids, vals, self.embed, **kw)[1]
        else:
            first, grid = self._walk_inputs(hc, ids, vals, anchor_ids)
            drafted = ids.gather(2, select(grid, first, self.rule, self.lam)[..., None])[..., 0]
        return drafted, top[0], top[1], hc

    def candidates(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top self.top candidates of the drafted slots' hidden states h (..., d): target ids and float32 logits,
        sorted by logit; over the drafter's shortlisted head when it has one (draft_vocab.DraftHead)."""
        if self.drafter.draft_head is not None:
            return self.drafter.draft_head.top(h, self.top)
        t = DFlashDrafter.compute_logits(h, self.head).float().topk(self.top, -1)
        return t.indices, t.values

    def _hidden(self, hc: torch.Tensor, n: int, anchor_ids: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """What the corrector reads of the whole block hc (R,B+1,d) for its first n slots: (hidden, its keyword
        arguments), the anchor's position and ids included when it is anchor-aware."""
        assert isinstance(self.corrector, Corrector)  # the callers' paths run with a dcoco.Corrector only
        if self.corrector.anchor_transition:
            return hc[:, :n + 1], {"anchor_ids": anchor_ids}
        return hc[:, 1:n + 1], {}

    def _walk_inputs(self, hc: torch.Tensor, ids: torch.Tensor, vals: torch.Tensor,
                     anchor_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The corrector's (first (R,K), grid (R,n-1,K,K)) over the first n = ids.shape[1] slots
        (Corrector.walk_inputs); hc (R,B+1,d): the whole block, the anchor's position first."""
        h, kw = self._hidden(hc, ids.shape[1], anchor_ids)
        assert isinstance(self.corrector, Corrector)  # checked in _hidden
        return self.corrector.walk_inputs(self.corrector.score(h, ids, vals, self.embed, **kw), vals)

    def sample_walk(self, ids: torch.Tensor, vals: torch.Tensor, hc: torch.Tensor, n: int, temperature: float,
                    generator: torch.Generator | None, anchor: int) -> tuple[list[int], torch.Tensor]:
        """The probabilistic draft of one block: n tokens drawn slot by slot and their proposals q (n, V) float32
        on the CPU, sparse over each slot's K candidates. ids / vals (B, top), hc (1, B+1, d) from _draft; anchor:
        the block's first input (the anchor transition's t_0)."""
        K, V = self.K, self.head.shape[0]
        if n == 0:
            return [], torch.zeros(0, V)
        ids, vals = ids[:n, :K], vals[:n, :K].float()
        c = self.corrector
        if isinstance(c, Corrector) and (n > 1 or c.anchor_transition):
            first, grid = self._walk_inputs(hc, ids[None], vals[None], torch.tensor([anchor], device=hc.device))
            first, grid = first.float(), grid.float()
        else:  # no corrector: each slot drawn from its own logits, whatever its predecessor
            first, grid = vals[None, 0], vals[1:, None].expand(n - 1, K, K)[None]
        ids = ids.cpu()  # drawn on the CPU, where the generator is
        ranks, w = sample(grid.cpu(), first.cpu(), temperature, generator)
        return ids.gather(1, ranks[0][:, None])[:, 0].tolist(), torch.zeros(n, V).scatter_(1, ids, w[0])

    def oracle(self, ref: list[int], left: int, ids: torch.Tensor, vals: torch.Tensor,
                hc: torch.Tensor, anchor: int) -> tuple[int, int, int, int]:
        """(oracle-walk committed, prefix-first committed, transition hits, transitions seen) for one round.
        ref: the verifier's greedy tokens at the verified slots (at most n); left: reference tokens still to
        come (ref and one more; the reference ends at eos or its length cap, so a commit never passes it);
        ids / vals (B,top), hc (1,B+1,d) from _draft, anchor its first input. Transitions are slot to slot (p >= 1),
        with or without the anchor transition."""
        m = len(ref)
        cand = ids[:m, :self.K]
        match = cand == torch.tensor(ref, dtype=cand.dtype, device=cand.device)[:, None]  # (m,K)
        walk = int(match.any(1).cumprod(0).sum())
        first = walk if m and bool(match[0, 0]) else 0
        hits = seen = 0
        if isinstance(self.corrector, Corrector) and m > 1:
            rank = torch.where(match.any(1), match.int().argmax(1), -1)  # -1: not in the top-K
            both = ((rank[:-1] >= 0) & (rank[1:] >= 0)).nonzero()[:, 0]
            if len(both):
                K = self.K
                s = self._walk_inputs(hc, ids[None, :m, :K], vals[None, :m, :K],
                                      torch.tensor([anchor], device=hc.device))[1][0]
                best = s[both, rank[both]].argmax(-1)  # first max: ties go to the lower rank, as in selection
                hits, seen = int((best == rank[both + 1]).sum()), len(both)
        return min(walk + 1, left), min(first + 1, left), hits, seen

    def _verify(self, drafts: list[int], logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                generator: torch.Generator | None, proposal: torch.Tensor | None = None) -> list[int]:
        """The committed tokens: the accepted prefix of drafts (n,) plus the verifier's own next token. logits
        (n+1,V): the target's at anchor, y_1..y_n. Temperature 0: the longest prefix equal to the argmax. Else
        speculative sampling against the drafts' proposal (n, V) (None: a point mass at each draft, the rule of
        docs/spec.md, "Verification"): accept y_j with probability min(1, p_j(y_j) / q_j(y_j)); on rejection
        sample max(p_j - q_j, 0) renormalised; when all are accepted, the bonus token from p_n."""
        if temperature == 0:
            best = logits.argmax(-1).tolist()
            a = next((j for j, y in enumerate(drafts) if y != best[j]), len(drafts))
            return drafts[:a] + [best[a]]
        p = probs(logits, temperature, top_p, top_k).cpu()
        u = torch.rand(len(drafts), generator=generator)
        for j, y in enumerate(drafts):
            qy = 1.0 if proposal is None else float(proposal[j, y])
            if u[j] * qy < p[j, y]:
                continue
            if proposal is None:
                rest = p[j].clone()
                rest[y] = 0
            else:
                rest = (p[j] - proposal[j]).clamp_(min=0)
            return drafts[:j] + [_sample(rest / rest.sum(), generator)]
        return drafts + [_sample(p[-1], generator)]

    @staticmethod
    def check_selection(rule: str, lam: float, num_candidates: int) -> None:
        """ValueError naming a bad rule, lam or num_candidates (before any model is loaded, where that is slow)."""
        if rule not in fused.RULES:
            raise ValueError(f"rule: expected one of {sorted(fused.RULES)}, got {rule!r}")
        if isinstance(lam, bool) or not (isinstance(lam, (int, float)) and math.isfinite(lam)):
            raise ValueError(f"lam: expected a finite number, got {lam!r}")
        if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or not (
                1 <= num_candidates <= fused.MAX_CANDIDATES):
            raise ValueError(f"num_candidates: expected an integer in [1, {fused.MAX_CANDIDATES}], "
                             f"got {num_candidates!r}")

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, generator: torch.Generator | None = None,
                 reference: Sequence[int] | None = None) -> Result:
        """Decode one prompt; never commits more than max_new_tokens, stops after eos. Deterministic given the
        generator's seed (sampling draws only from it, on the CPU).

        reference (greedy only): the target's greedy continuation of the prompt (target_only(...).tokens, with
        at least this max_new_tokens). A round's verifier tokens beyond the accepted prefix are not in its
        logits (they were computed after a wrong draft), but while the decode equals the reference they are
        the reference's next tokens, so the oracle metrics are read from it. Rounds after a divergence (float
        rounding on near-ties) get no oracle values."""
        from transformers import DynamicCache

        inputs.check_sampling(max_new_tokens, temperature, top_p, top_k)
        inputs.check_prompt(prompt_ids, self.head.shape[0])
        if reference is not None:
            if temperature != 0:
                raise ValueError("reference: oracle metrics need greedy decoding (temperature 0)")
            inputs.check_prompt(reference, self.head.shape[0])
            reference = list(reference)
        walks: list[int] = []
        firsts: list[int] = []
        thits = tseen = 0
        B = self.drafter.config.block_size - 1
        hits, seen = torch.zeros(B, len(KS), dtype=torch.long), torch.zeros(B, dtype=torch.long)
        committed: list[int] = []
        accepted: list[int] = []
        t0 = time.perf_counter()
        cache = DynamicCache()
        out = _forward(self.target, prompt_ids, cache, hidden=True)
        ctx = self.drafter.target_features(out.hidden_states)  # (1,P,n*d): every position before the anchor
        tokens = [_next_token(out.logits[0, -1], temperature, top_p, top_k, generator)]
        while tokens[-1] not in self.eos and len(tokens) < max_new_tokens:
            n = min(B, max_new_tokens - len(tokens) - 1)  # accepted + 1 <= n + 1 <= what is left
            drafted, cands, vals, hc = self._draft(tokens[-1], ctx)
            drafts, proposal = drafted[:n].tolist(), None
            if temperature > 0 and self.draft_sample_method == "probabilistic":
                drafts, proposal = self.sample_walk(cands, vals, hc, n, temperature, generator, tokens[-1])
            L = len(tokens)
            if reference is not None and reference[:L] == tokens and len(reference) > L:
                t1 = time.perf_counter()
                w, f, h, c = self.oracle(reference[L:L + n], len(reference) - L, cands, vals, hc, tokens[-1])
                t0 += time.perf_counter() - t1  # measurement, not decoding: kept out of the timing
                walks.append(w)
                firsts.append(f)
                thits, tseen = thits + h, tseen + c
            out = _forward(self.target, tokens[-1:] + drafts, cache, hidden=True)
            new = self._verify(drafts, out.logits[0], temperature, top_p, top_k, generator, proposal)
            a = len(new) - 1
            # slots 1..min(a+1, n) had their whole prefix accepted; the verifier's token there is new[i]
            for i in range(min(a + 1, n)):
                seen[i] += 1
                hit = (cands[i] == new[i]).nonzero()
                if len(hit):
                    hits[i] += torch.tensor([int(hit[0, 0]) < k for k in KS])
            cache.crop(ctx.shape[1] + a + 1 - cache.get_seq_length())  # keep anchor + accepted drafts
            ctx = torch.cat([ctx, self.drafter.target_features(out.hidden_states)[:, :a + 1]], 1)
            stop = next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))
            tokens += new[:stop]
            committed.append(stop)
            accepted.append(a)
        return Result(tokens, committed, accepted, hits, seen, time.perf_counter() - t0, walks, firsts, thits, tseen)

    def generate_batch(self, prompts: Sequence[list[int]], max_new_tokens: int, **kw) -> list[Result]:
        """generate over each prompt in turn (one shared generator keeps the batch deterministic)."""
        return [self.generate(p, max_new_tokens, **kw) for p in prompts]


def summarize(results: Sequence[Result]) -> dict:
    """Totals over decodes: tokens, rounds, seconds, tokens_per_s, tau (committed per round, None without
    rounds), accept_counts[i] / accept_rate[i] (rounds accepting draft slot i+1), coverage {k: per-slot rate of
    the verified token being in the drafter's top-k, None where a slot was never reached}; with references:
    oracle_rounds, tau_oracle_walk / tau_oracle_prefix_first (oracle commits per round over the rounds that
    have them) and transition_hit_rate (None without data); from simulations (simulate.py): coverage_tf /
    coverage_tf_seen, teacher-forced coverage at every anchor and its sample count per slot."""
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    rounds = sum(r.rounds for r in results)
    spec = [r for r in results if r.rounds]
    out: dict[str, Any]
    out = {"tokens": tokens, "rounds": rounds, "seconds": seconds,
           "tokens_per_s": tokens / seconds if seconds > 0 else None,
           "tau": sum(sum(r.committed) for r in results) / rounds if rounds else None}
    if spec:
        B = spec[0].cover_seen.shape[0]
        acc = torch.tensor([a for r in spec for a in r.accepted])
        counts = [int((acc > i).sum()) for i in range(B)]
        # spec is non-empty: the sums are tensors, not sum()'s start 0
        hits = cast(torch.Tensor, sum(r.cover_hits for r in spec))
        seen = cast(torch.Tensor, sum(r.cover_seen for r in spec))
        out["accept_counts"] = counts
        out["accept_rate"] = [c / rounds for c in counts]
        out["coverage_seen"] = seen.tolist()
        out["coverage"] = {k: [int(h) / int(s) if s else None for h, s in zip(hits[:, j], seen)]
                           for j, k in enumerate(KS)}
        n = sum(len(r.oracle_walk) for r in spec)
        thits, tseen = sum(r.trans_hits for r in spec), sum(r.trans_seen for r in spec)
        out["oracle_rounds"] = n
        out["tau_oracle_walk"] = sum(sum(r.oracle_walk) for r in spec) / n if n else None
        out["tau_oracle_prefix_first"] = sum(sum(r.oracle_prefix) for r in spec) / n if n else None
        out["transition_hit_rate"] = thits / tseen if tseen else None
        if all(r.tf_seen is not None for r in spec):
            # simulate.py sets tf_hits with tf_seen; spec is non-empty: the sums are tensors
            tf_hits = cast(torch.Tensor, sum(cast(torch.Tensor, r.tf_hits) for r in spec))
            tf_seen = cast(torch.Tensor, sum(cast(torch.Tensor, r.tf_seen) for r in spec))
            out["coverage_tf_seen"] = tf_seen.tolist()
            out["coverage_tf"] = {k: [int(h) / int(s) if s else None for h, s in zip(tf_hits[:, j], tf_seen)]
                                  for j, k in enumerate(KS)}
    return out
