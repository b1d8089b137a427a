"""The target's own answers for online training, generated once and shared by the torchrun ranks (each generates its
share). The features themselves: target/features.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from ..target.corpus import generate, token_ids


def shared_responses(model, prompt_ids: Sequence[Sequence[int]], folder: Path, settings, progress: bool = True
                     ) -> list[tuple[list[int], list[int]]]:
    """[(prompt, response)] generated greedily by the target, each rank its share (prompts rank::world), kept in
    folder/part-R.json so that a rerun skips generation; every rank returns all of them, in prompt order."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    folder.mkdir(parents=True, exist_ok=True)
    mine = folder / f"part-{rank}.json"
    if not mine.is_file():
        eos = token_ids(model.generation_config.eos_token_id)
        share = list(prompt_ids)[rank::world]
        pairs = generate(model, share, settings, eos, progress) if share else []
        tmp = mine.with_suffix(".tmp")
        tmp.write_text(json.dumps(pairs))
        tmp.replace(mine)
    if dist.is_initialized():
        dist.barrier()
    parts = [json.loads((folder / f"part-{r}.json").read_text()) for r in range(world)]
    return [tuple(parts[i % world][i // world]) for i in range(len(prompt_ids))]
