"""The training corpus: the target's own greedy continuations of chat prompts, then one teacher-forced target
pass per sequence for the drafter's context features and the verifier's argmax labels. Built once, cached
on disk under a key of (target weights, prompt token ids, settings)."""

from __future__ import annotations

import dataclasses
import hashlib
import fcntl
import json
import os
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..jsonl import read_lines

if TYPE_CHECKING:
    from transformers import PreTrainedModel

FORMAT = 2  # bump when the stored layout or its meaning changes: old caches then miss
FP16_MAX = 65504.0


def load_prompts(path: str | Path | None = None) -> list[str]:
    """Prompts from a JSONL file of {"prompt": ...} lines; default: the set shipped with dcoco."""
    src = resources.files("dcoco") / "data" / "prompts.jsonl" if path is None else Path(path)
    prompts = []
    for n, row in read_lines(src.read_text(encoding="utf-8")):
        p = cast(dict, row).get("prompt")  # a JSON object per line (anything else fails here, as it did)
        if not isinstance(p, str) or not p:
            raise ValueError(f"path: line {n} of {src} has no non-empty string 'prompt'")
        prompts.append(p)
    if not prompts:
        raise ValueError(f"path: no prompts in {src}")
    return prompts


def chat_ids(tokenizer, prompt: str | list[dict], thinking: bool = False) -> list[int]:
    """One user turn (or a list of chat messages) plus the generation prompt, as token ids (templates without
    enable_thinking ignore it)."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False, enable_thinking=thinking))


def encode_prompts(tokenizer, prompts: Sequence[str], max_tokens: int = 300, thinking: bool = False,
                   progress: bool = True) -> list[list[int]]:
    """Chat-templated token ids (one user turn plus the generation prompt, thinking off unless asked); prompts
    longer than max_tokens are dropped, with one message saying how many and which, so that a few long ones
    cannot dominate memory and time."""
    out, dropped = [], []
    for i, p in enumerate(prompts):
        ids = chat_ids(tokenizer, p, thinking)
        if len(ids) <= max_tokens:
            out.append(ids)
        else:
            dropped.append(i)
    if not out:
        raise ValueError(f"max_tokens: every prompt is longer than {max_tokens} tokens")
    if dropped and progress:
        print(f"dcoco: dropped {len(dropped)} of {len(prompts)} prompts longer than {max_tokens} tokens "
              f"(--max-prompt-tokens); prompt numbers (from 0): {dropped[:20]}{' ...' if len(dropped) > 20 else ''}")
    return out


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    layer_ids: tuple[int, ...]
    max_new_tokens: int = 128
    gen_batch: int = 16    # part of the key: padding changes float rounding, so the argmax may change
    feat_batch: int = 8

    def __post_init__(self):
        object.__setattr__(self, "layer_ids", tuple(self.layer_ids))
        if not self.layer_ids or not all(isinstance(i, int) and i >= 0 for i in self.layer_ids):
            raise ValueError(f"layer_ids: expected a non-empty list of layer indices, got {self.layer_ids!r}")
        for f in ("max_new_tokens", "gen_batch", "feat_batch"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}: expected an integer >= 1, got {v!r}")


class Corpus:
    """Packed sequences: ids (T,), hidden (T,F) fp16 (the target features at layer_ids, concatenated),
    labels (T,) with labels[t] = the target's argmax after tokens < t (labels[0] = ids[0]), response (T,)
    bool (generated tokens, up to and including the first eos), offsets (N+1,). hidden is memory-mapped from
    hidden.npy (F * 2 bytes a token: 3,456 at SmolLM2's three taps), so a corpus larger than memory trains."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.meta = json.loads((self.path / "meta.json").read_text())
        t = load_file(str(self.path / "tokens.safetensors"))
        self.ids, self.labels, self.response = t["ids"], t["labels"], t["response"]
        # copy-on-write: pages are read on use and never written back
        self.hidden = torch.from_numpy(np.load(self.path / "hidden.npy", mmap_mode="c"))
        self.offsets = t["offsets"].tolist()

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"ids": self.ids[a:b], "hidden": self.hidden[a:b], "labels": self.labels[a:b],
                "response": self.response[a:b]}

    @property
    def feature_dim(self) -> int:
        return self.hidden.shape[1]


def fingerprint(model: PreTrainedModel) -> str:
    """Target identity: class, config and a strided sample of every parameter (cheap, yet any retrained
    or differently quantised weights change it)."""
    h = hashlib.sha256(type(model).__name__.encode())
    h.update(model.config.to_json_string(use_diff=False).encode())
    for name, p in model.named_parameters():
        flat = p.detach().reshape(-1)
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(flat[:: max(1, flat.numel() // 4096)].float().cpu().numpy().tobytes())
    return h.hexdigest()


def corpus_key(model: PreTrainedModel, prompt_ids: Sequence[Sequence[int]], settings: CorpusSettings,
               responses: Sequence[Sequence[int]] | None = None) -> str:
    h = hashlib.sha256(f"format={FORMAT}".encode())
    h.update(fingerprint(model).encode())
    h.update(json.dumps([list(p) for p in prompt_ids]).encode())
    h.update(json.dumps(dataclasses.asdict(settings)).encode())
    if responses is not None:
        h.update(json.dumps([list(r) for r in responses]).encode())
    return h.hexdigest()[:20]


def load_sequences(path: str | Path) -> list[tuple[list[int], list[int]]]:
    """[(prompt ids, response ids)] from a token-id corpus file (scripts/make_demo_corpus.py writes one: ids, the
    concatenated sequences; lengths and prompt_lengths per sequence)."""
    import numpy as np

    with np.load(path) as z:
        ids, lengths, prompts = z["ids"].astype(np.int64), z["lengths"], z["prompt_lengths"]
    ends = np.cumsum(lengths)
    return [(ids[e - n:e - n + p].tolist(), ids[e - n + p:e].tolist()) for e, n, p in zip(ends, lengths, prompts)]


def token_ids(value) -> list[int]:
    """A generation config's eos_token_id (None, one id or a list) as a list."""
    return [] if value is None else [value] if isinstance(value, int) else list(value)


def build_corpus(model: PreTrainedModel, prompt_ids: Sequence[Sequence[int]], cache_dir: str | Path,
                 settings: CorpusSettings, eos_ids: Sequence[int] | int | None = None, progress: bool = True,
                 responses: Sequence[Sequence[int]] | None = None) -> Corpus:
    """Load the cached corpus for (model, prompt_ids, settings[, responses]), building it first on a miss.

    model: any transformers causal LM (eval mode; its device is used). eos_ids default to the model's
    generation config. Generation is greedy, batched with left padding, up to settings.max_new_tokens,
    stopping at eos; the feature pass runs the full sequences right-padded. responses: the responses to use
    instead of generating them (e.g. load_sequences of a shipped corpus); labels are still the model's argmax."""
    if not prompt_ids or not all(len(p) > 0 for p in prompt_ids):
        raise ValueError("prompt_ids: expected a non-empty list of non-empty token id lists")
    if responses is not None and (len(responses) != len(prompt_ids) or not all(len(r) > 0 for r in responses)):
        raise ValueError(f"responses: expected {len(prompt_ids)} non-empty token id lists, one per prompt")
    n_layers = model.config.num_hidden_layers
    if max(settings.layer_ids) >= n_layers:
        raise ValueError(f"settings.layer_ids: {list(settings.layer_ids)} out of range for a {n_layers}-layer target")
    eos = token_ids(eos_ids if eos_ids is not None else model.generation_config.eos_token_id)
    if not eos:
        raise ValueError("eos_ids: the model's generation config names no eos token; pass eos_ids")
    path = Path(cache_dir) / corpus_key(model, prompt_ids, settings, responses)
    if (path / "meta.json").is_file():
        return Corpus(path)
    if responses is None:
        seqs = generate(model, prompt_ids, settings, eos, progress)
    else:
        seqs = [(list(p), list(r)) for p, r in zip(prompt_ids, responses)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f"{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others then find its result
        if not (path / "meta.json").is_file():
            partial = path.with_name(path.name + ".partial")  # an interrupted build resumes here
            _features(model, seqs, settings, partial, progress)
            meta = {"format": FORMAT, "settings": dataclasses.asdict(settings), "sequences": len(seqs),
                    "tokens": sum(len(p) + len(r) for p, r in seqs),
                    "response_tokens": sum(len(r) for _, r in seqs),
                    "target": getattr(model.config, "_name_or_path", "") or type(model).__name__}
            (partial / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            os.replace(partial, path)
    return Corpus(path)


@torch.no_grad()
def generate(model, prompt_ids, s: CorpusSettings, eos: list[int], progress: bool = True) -> list[tuple[list, list]]:
    """[(prompt, response)] in prompt order; the response ends at the first eos (kept) or the length cap."""
    from transformers import GenerationConfig

    dev = next(model.parameters()).device
    pad = eos[0]
    cfg = GenerationConfig(max_new_tokens=s.max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths share a batch
    out: list = [None] * len(prompt_ids)
    for start in tqdm(range(0, len(order), s.gen_batch), desc="generate", disable=not progress):
        idx = order[start:start + s.gen_batch]
        L = max(len(prompt_ids[i]) for i in idx)
        x = torch.tensor([[pad] * (L - len(prompt_ids[i])) + list(prompt_ids[i]) for i in idx], device=dev)
        mask = torch.tensor([[0] * (L - len(prompt_ids[i])) + [1] * len(prompt_ids[i]) for i in idx], device=dev)
        gen = model.generate(x, attention_mask=mask, generation_config=cfg)[:, L:].tolist()
        for i, g in zip(idx, gen):
            stop = next((j for j, t in enumerate(g) if t in eos), len(g) - 1)
            out[i] = (list(prompt_ids[i]), g[:stop + 1])
    return out


@torch.no_grad()
def _features(model, seqs, s: CorpusSettings, out: Path, progress: bool) -> None:
    """Writes out/tokens.safetensors and out/hidden.npy (memory-mapped, filled batch by batch: a rerun after a kill
    resumes at the first batch not recorded in out/progress.json)."""
    dev = next(model.parameters()).device
    full = [p + r for p, r in seqs]
    lengths = [len(f) for f in full]
    offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    width = len(s.layer_ids) * model.config.hidden_size
    out.mkdir(parents=True, exist_ok=True)
    state = json.loads((out / "progress.json").read_text()) if (out / "progress.json").is_file() else None
    shape = (offsets[-1], width)
    if state is None or state.get("shape") != list(shape):
        state = {"shape": list(shape), "batches": 0}
        hidden = np.lib.format.open_memmap(out / "hidden.npy", mode="w+", dtype=np.float16, shape=shape)
        labels = np.lib.format.open_memmap(out / "labels.npy", mode="w+", dtype=np.int64, shape=(shape[0],))
    else:
        hidden = np.load(out / "hidden.npy", mmap_mode="r+")
        labels = np.load(out / "labels.npy", mmap_mode="r+")
    order = sorted(range(len(full)), key=lambda i: len(full[i]))
    starts = range(0, len(order), s.feat_batch)
    bar = tqdm(total=offsets[-1], desc="features", unit="tok", unit_scale=True, disable=not progress,
               initial=sum(lengths[i] for i in order[:state["batches"] * s.feat_batch]))
    for b, start in enumerate(starts):
        if b < state["batches"]:
            continue
        idx = order[start:start + s.feat_batch]
        L = max(len(full[i]) for i in idx)
        x = torch.tensor([full[i] + [0] * (L - len(full[i])) for i in idx], device=dev)
        mask = torch.tensor([[1] * len(full[i]) + [0] * (L - len(full[i])) for i in idx], device=dev)
        o = model(input_ids=x, attention_mask=mask, output_hidden_states=True)
        # massive activations (~2.5e4 at position 0 in SmolLM2) still fit; clamp guards the rest against inf
        f = torch.cat([o.hidden_states[i + 1] for i in s.layer_ids], -1).clamp(-FP16_MAX, FP16_MAX).half().cpu()
        arg = o.logits.argmax(-1).cpu()
        for j, i in enumerate(idx):
            n, a = len(full[i]), offsets[i]
            hidden[a:a + n] = f[j, :n].numpy()
            labels[a:a + n] = torch.cat([x[j, :1].cpu(), arg[j, :n - 1]]).numpy()
        bar.update(sum(lengths[i] for i in idx))
        if b % 64 == 63 or b == len(starts) - 1:  # what is recorded as done is on disk
            hidden.flush()
            labels.flush()
            state["batches"] = b + 1
            (out / "progress.json").write_text(json.dumps(state))
    bar.close()
    response = [torch.arange(len(f)) >= len(p) for f, (p, _) in zip(full, seqs)]
    save_file({"ids": torch.tensor([t for f in full for t in f], dtype=torch.int64),
               "labels": torch.from_numpy(np.array(labels)), "response": torch.cat(response),
               "offsets": torch.tensor(offsets)}, str(out / "tokens.safetensors"))
    del hidden, labels
    (out / "labels.npy").unlink()
    (out / "progress.json").unlink()
