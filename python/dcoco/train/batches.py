"""What every (rank, micro-batch) trains on: anchors, padded batches and the seeded schedule over the corpus."""

from __future__ import annotations

import torch

from ..target.corpus import Corpus
from ..target.features import TokenCorpus


def anchor_positions(response: torch.Tensor) -> torch.Tensor:
    """Positions p with p and p+1 inside the response: the anchor is a committed response token and slot 1
    is supervised."""
    return (response[:-1] & response[1:]).nonzero()[:, 0]


def sample_anchors(response: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    """Up to count distinct anchor positions, sorted."""
    cand = anchor_positions(response)
    return cand[torch.randperm(len(cand), generator=gen)[:count]].sort().values


def collate(seqs: list[dict[str, torch.Tensor]], anchors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pads sequences (ids, response and, from a feature cache, hidden and labels) to the longest and anchor
    lists to the most; anchor_ok marks the real anchors."""
    N, S, A = len(seqs), max(len(s["ids"]) for s in seqs), max(len(a) for a in anchors)
    b = {k: v.new_zeros(N, S, *v.shape[1:]) for k, v in seqs[0].items()}
    b["anchors"] = torch.zeros(N, A, dtype=torch.long)
    b["anchor_ok"] = torch.zeros(N, A, dtype=torch.bool)
    for i, (s, a) in enumerate(zip(seqs, anchors)):
        for k, v in s.items():
            b[k][i, :len(v)] = v
        b["anchors"][i, :len(a)] = a
        b["anchor_ok"][i, :len(a)] = True
    return b


def _gen(*key: int) -> torch.Generator:
    # tuples of ints hash the same in every process (no hash randomisation for ints)
    return torch.Generator().manual_seed(hash(key) & (2 ** 63 - 1))


class Schedule:
    """Which sequences and anchors every (rank, micro-batch) sees: micro-batch k of an epoch is the k-th slice of
    seqs_per_step x world sequences of that epoch's permutation, dealt to the ranks round-robin; anchors depend on
    (seed, epoch, sequence). A function of the seed and the global batch only, so a resumed run sees exactly what
    an uninterrupted one would, on any world size with the same global batch."""

    def __init__(self, corpus: Corpus | TokenCorpus, seed: int, seqs_per_step: int, anchors: int, rank: int, world: int,
                 held_out: int = 0):
        self.corpus, self.seed, self.n, self.anchors, self.rank, self.world = \
            corpus, seed, seqs_per_step, anchors, rank, world
        usable = [i for i in range(len(corpus)) if len(anchor_positions(corpus[i]["response"]))]
        if held_out >= len(usable):
            raise ValueError(f"eval_sequences: {held_out} held out of {len(usable)} usable sequences leaves none to "
                             f"train on")
        pick = set(torch.randperm(len(usable), generator=_gen(seed, -2))[:held_out].tolist())
        self.held_out = [u for j, u in enumerate(usable) if j in pick]  # a function of the seed only
        self.usable = [u for j, u in enumerate(usable) if j not in pick]
        self.steps_per_epoch = len(self.usable) // (seqs_per_step * world)
        if self.steps_per_epoch < 1:
            raise ValueError(f"corpus: {len(self.usable)} usable sequences are too few for {world} rank(s) x "
                             f"{seqs_per_step} sequences per step")

    def batch(self, step: int) -> dict[str, torch.Tensor]:
        epoch, k = divmod(step, self.steps_per_epoch)
        order = torch.randperm(len(self.usable), generator=_gen(self.seed, epoch, -1))
        g = self.n * self.world
        mine = order[k * g:(k + 1) * g][self.rank:: self.world].tolist()
        seqs = [self.corpus[self.usable[j]] for j in mine]
        anchors = [sample_anchors(s["response"], self.anchors, _gen(self.seed, epoch, self.usable[j]))
                   for s, j in zip(seqs, mine)]
        return collate(seqs, anchors)

    def eval_batches(self):
        """This rank's share of the held-out sequences, seqs_per_step at a time, with fixed anchors; then None
        until every rank has yielded as often (a sharded target needs every rank in each forward)."""
        mine = self.held_out[self.rank:: self.world]
        for k in range(0, len(mine), self.n):
            seqs = [self.corpus[j] for j in mine[k:k + self.n]]
            yield collate(seqs, [sample_anchors(s["response"], self.anchors, _gen(self.seed, -3, j))
                                 for s, j in zip(seqs, mine[k:k + self.n])])
        most = -(-len(self.held_out[:: self.world]) // self.n)  # rank 0 has the largest share
        yield from [None] * (most - -(-len(mine) // self.n))


def frequent_tokens(corpus: Corpus | TokenCorpus, n: int) -> torch.Tensor:
    """The n most frequent response tokens of the corpus (fewer if it has fewer), sorted: on the target's own
    greedy corpus, the labels' vocabulary."""
    counts = torch.bincount(corpus.ids[corpus.response])
    return counts.topk(min(n, int((counts > 0).sum()))).indices.sort().values
