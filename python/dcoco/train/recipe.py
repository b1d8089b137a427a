"""What `dcoco train` runs: load the target, build (or reuse) the corpus, make or load the drafter, train.
Defaults are the embedded SmolLM2-135M-Instruct target with a small drafter, sized for a CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ..modeling import checkpoint
from ..modeling.dflash import DFlashConfig, DFlashDrafter, build_target_layer_ids
from ..target import smollm2
from ..target.corpus import CorpusSettings, build_corpus, corpus_key, encode_prompts, load_prompts
from ..target.load import SMOLLM2, load_target
from . import datagen
from ..target.features import TargetFeatures, TokenCorpus
from .online import shared_responses
from .config import TrainConfig
from .distributed import init_distributed, resolve_device
from .training import TrainResult, train

SMOLLM2_TAPS = [1, 15, 27]  # target layers the drafter reads: an early, a middle and a late one of the 30
FEATURES = ("auto", "cache", "online")


def cache_dir() -> Path:
    return Path(os.environ.get("DCOCO_CACHE", Path.home() / ".cache" / "dcoco"))


def local_checkpoint(name: str) -> Path:
    """A checkpoint folder: name itself when it exists, else a hub id downloaded into the hub cache."""
    if Path(name).exists():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as e:  # noqa: BLE001 (offline, unknown repo, no huggingface_hub: one clear message)
        raise ValueError(f"init: {name} is not a folder here and could not be fetched from the hub "
                         f"({type(e).__name__}: {e})") from None


def drafter_config(model, tokenizer, layers: int = 2, target_layer_ids: list[int] | None = None,
                   block_size: int = 16, mask_token_id: int | None = None, smollm2_target: bool = False
                   ) -> DFlashConfig:
    """A drafter shaped like the target's layers (it shares the target's embedding and LM head), `layers`
    deep. Taps default to 3 evenly spaced target layers; the mask token to the tokenizer's, else the first
    unused embedding row."""
    c = model.config
    T = c.num_hidden_layers
    taps = target_layer_ids or (SMOLLM2_TAPS if smollm2_target else build_target_layer_ids(T, 3))
    if mask_token_id is None:
        mask_token_id = smollm2.MASK_TOKEN_ID if smollm2_target else tokenizer.mask_token_id
    if mask_token_id is None and len(tokenizer) < c.vocab_size:
        mask_token_id = len(tokenizer)
    if mask_token_id is None:
        raise ValueError("mask_token_id: the target has no mask token and no spare embedding row; pass one "
                         "(a rarely used special token, not pad/eos)")
    rope = getattr(c, "rope_parameters", None) or {}
    return DFlashConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_hidden_layers=layers,
                        num_attention_heads=c.num_attention_heads,
                        num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                        vocab_size=c.vocab_size, mask_token_id=mask_token_id, target_layer_ids=taps,
                        num_target_layers=T, block_size=block_size, head_dim=getattr(c, "head_dim", None),
                        rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6),
                        rope_theta=rope.get("rope_theta") or getattr(c, "rope_theta", None) or 1e6,
                        max_position_embeddings=c.max_position_embeddings)


def run(cfg: TrainConfig, target: str = SMOLLM2, prompts: str | None = None, data: str | None = None,
        data_samples: int | None = None, cache: str | None = None,
        init: str | None = None, layers: int = 2, target_layer_ids: list[int] | None = None, block_size: int = 16,
        mask_token_id: int | None = None, max_prompt_tokens: int = 300, max_new_tokens: int = 128,
        gen_batch: int = 16, feat_batch: int = 8, thinking: bool = False, features: str = "auto",
        shard_target: bool = False, labels: str = "argmax", progress: bool = True) -> TrainResult:
    """Everything `dcoco train` does. data: a `dcoco data generate` folder to train on instead of answers generated
    here from prompts; data_samples: only the first N of one fixed permutation of its samples (subset_of).
    init: a DFlash or DCOCO checkpoint, or a hub id, to start from (its config wins over
    layers/target_layer_ids/block_size/mask_token_id).
    features: "online" runs the frozen target on every batch (target/features.py), "cache" builds a feature cache first
    (under torchrun rank 0 builds it, the others wait), "auto" is online on CUDA, a cache on a CPU. shard_target:
    FSDP2 over the ranks for the online target (needs data: generation runs the whole target on each rank).
    labels: the online target's labels (TargetFeatures): "argmax", or "corpus" for data that holds the target's own
    greedy answers."""
    if features not in FEATURES:
        raise ValueError(f"features: expected one of {FEATURES}, got {features!r}")
    rank, world = init_distributed(cfg.dist_timeout)
    dev = resolve_device(cfg.device)
    online = features == "online" or (features == "auto" and dev.type == "cuda")
    if shard_target and not online:
        raise ValueError("shard_target: shards the online target; pass features='online' (--features online)")
    if labels != "argmax" and (not online or data is None):
        raise ValueError(f"labels: {labels!r} is for online features on --data from the target's own greedy answers "
                         f"(features='online' and data)")
    if cfg.distill is not None and not online:
        raise ValueError("distill: the target's distribution comes from online features (features='online', "
                         "--features online)")
    if data_samples is not None and (data is None or isinstance(data_samples, bool) or
                                     not isinstance(data_samples, int) or data_samples < 1):
        raise ValueError(f"data_samples: expected an integer >= 1 with data (--data), got {data_samples!r}"
                         + ("" if data is not None else " without data"))
    if shard_target and data is None:
        raise ValueError("shard_target: needs data (--data, from `dcoco data generate`): generating answers here "
                         "runs the whole target on each rank")
    tok, model = load_target(target, torch.bfloat16 if dev.type == "cuda" else None)  # frozen: bf16 on a GPU
    if not shard_target:
        model.to(dev)
    corrector = None
    drafter: DFlashDrafter | DFlashConfig  # a config: train() makes the drafter
    if init is not None:
        drafter, corrector = checkpoint.load(local_checkpoint(init))
        dcfg = drafter.config
    else:
        drafter = dcfg = drafter_config(model, tok, layers, target_layer_ids, block_size, mask_token_id,
                                        smollm2_target=target == SMOLLM2)
    settings = CorpusSettings(tuple(dcfg.target_layer_ids), max_new_tokens, gen_batch, feat_batch)
    responses = None
    if data is not None:  # answers generated by a serving engine (dcoco data generate)
        samples = datagen.load(data, model.get_input_embeddings().weight.shape[0])
        prompt_ids, responses = map(list, zip(*(samples if data_samples is None else
                                                subset_of(samples, data_samples, data))))
    else:
        prompt_ids = encode_prompts(tok, load_prompts(prompts), max_prompt_tokens, thinking, progress and rank == 0)
    root = Path(cache) if cache else cache_dir() / "corpus"
    if online:
        if responses is None:  # every rank generates its share, once
            key = corpus_key(model, prompt_ids, settings)
            responses = [r for _, r in shared_responses(model, prompt_ids, root / f"tokens-{key}-w{world}", settings,
                                                        progress and rank == 0)]
        token_corpus = TokenCorpus(list(zip(prompt_ids, responses)))
        embed, head = (m.weight.detach() for m in (model.get_input_embeddings(), model.get_output_embeddings()))
        if shard_target:  # copies, taken before sharding replaces the target's weights with shards
            embed, head = embed.clone(), head.clone()
        feats = TargetFeatures(model, dcfg.target_layer_ids, dev, shard_target, labels, cfg.distill or 0)
        return train(cfg, token_corpus, embed, head, drafter, corrector, progress=progress, target=feats)
    for turn in (0, 1):  # rank 0 builds while the others wait, then they read its cache
        if (rank == 0) == (turn == 0):
            corpus = build_corpus(model, prompt_ids, root, settings, progress=progress and rank == 0,
                                  responses=responses)
        if dist.is_initialized():
            dist.barrier()
    embed = model.get_input_embeddings().weight.detach()
    head = model.get_output_embeddings().weight.detach()  # the same tensor when the target ties them
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return train(cfg, corpus, embed, head, drafter, corrector, progress=progress)


def subset_of(samples: list, n: int, where: str = "data") -> list:
    """The first n of one fixed permutation of samples (seed 0, whatever the run's seed), in their order: a smaller
    subset lies inside every larger one, so corpus sizes can be compared on nested data."""
    if n > len(samples):
        raise ValueError(f"data_samples: {n} asked of {where}, which has {len(samples)} samples")
    keep = torch.randperm(len(samples), generator=torch.Generator().manual_seed(0))[:n].sort().values
    return [samples[i] for i in keep.tolist()]


def plan(cfg: TrainConfig, target: str = SMOLLM2, init: str | None = None, layers: int = 2,
         target_layer_ids: list[int] | None = None, block_size: int = 16, features: str = "auto",
         shard_target: bool = False, world: int = 1, seq_len: int = 428, gpu_memory: float | None = None):
    """`dcoco train --dry-run`: the per-rank memory plan (memplan.Plan) of a run, from configs alone (no weights).
    gpu_memory: GiB per device, which also makes it a CUDA plan on a machine without one (default: this device's)."""
    from . import memplan
    from ..modeling.checkpoint import ARCHITECTURE
    from ..modeling.dflash import ARCHITECTURE as DFLASH

    if features not in FEATURES:
        raise ValueError(f"features: expected one of {FEATURES}, got {features!r}")
    cuda = gpu_memory is not None or torch.cuda.is_available()
    device_bytes = int(gpu_memory * 2 ** 30) if gpu_memory is not None else (
        torch.cuda.get_device_properties(0).total_memory if cuda else None)
    if target == SMOLLM2:
        tcfg = smollm2.load()[1].config
    else:
        from transformers import AutoConfig
        tcfg = AutoConfig.from_pretrained(target)
    if init is not None:
        raw = json.loads((local_checkpoint(init) / "config.json").read_text())
        dcfg = DFlashConfig.from_dict(raw, architectures=(DFLASH, ARCHITECTURE))
    else:
        shape = SimpleNamespace(config=tcfg)  # drafter_config reads only the sizes; the mask id changes no memory
        dcfg = drafter_config(shape, None, layers, target_layer_ids, block_size, 0, smollm2_target=target == SMOLLM2)
    online = features == "online" or (features == "auto" and cuda)
    return memplan.estimate(tcfg, dcfg, cfg, world, seq_len, shard_target, online, cuda, device_bytes)
