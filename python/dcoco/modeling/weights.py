"""Checkpoint files: reading config.json and safetensors weights (checked), and what a save may store."""

from __future__ import annotations

import json
from pathlib import Path

import torch

STORED = (torch.float32, torch.bfloat16, torch.float16, torch.float64)  # what a checkpoint's weights are stored as
ID_TENSORS = ("d2t",)  # int64 token ids, not weights: a shortlisted draft head's (draft_vocab.py)


def read_json(file: Path) -> dict:
    """A JSON object from file; ValueError naming the file when it is unreadable, not JSON, or not an object."""
    try:
        data = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(data).__name__}")
    return data


def read_config(path: str | Path) -> dict:
    """config.json of the checkpoint directory path (read_json's errors; ValueError when it is missing)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"path: no config.json in {path}")
    return read_json(path / "config.json")


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: model.safetensors, or the shards its index names; path
    itself when it is a .safetensors file."""
    path = Path(path)
    if path.is_file() and path.suffix == ".safetensors":
        return [path]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    if (path / "model.safetensors.index.json").is_file():
        index = read_json(path / "model.safetensors.index.json").get("weight_map")
        if not isinstance(index, dict):
            raise ValueError(f"{path / 'model.safetensors.index.json'}: expected a weight_map object")
        return [path / f for f in sorted(set(index.values()))]
    raise ValueError(f"path: no model.safetensors (or model.safetensors.index.json) in {path}")


def read_tensors(path: str | Path, keep=lambda name: True) -> dict[str, torch.Tensor]:
    """The tensors named `keep` in a checkpoint directory's safetensors files (or in one such file), checked: a
    file that safetensors cannot read (truncated, corrupt), a tensor stored in a dtype other than float32, bfloat16,
    float16 or float64 (integers, float8: no weight of either layout is stored so; ID_TENSORS are int64), or one
    holding NaN or inf is a ValueError naming the file and the tensor."""
    from safetensors import SafetensorError, safe_open

    out = {}
    for f in weight_files(path):
        try:
            with safe_open(str(f), "pt") as st:
                for k in st.keys():
                    if keep(k):
                        out[k] = st.get_tensor(k)
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{f}: not a readable safetensors file ({e})") from None
        for k, t in out.items():
            if t.dtype not in STORED and not (k in ID_TENSORS and t.dtype == torch.int64):
                raise ValueError(f"{f}: tensor {k} is stored as {str(t.dtype).removeprefix('torch.')}; expected "
                                 "float32, bfloat16, float16 or float64")
            bad = int((~t.isfinite()).sum())
            if bad:
                raise ValueError(f"{f}: tensor {k} holds {bad} non-finite value(s) (NaN or inf) of {t.numel()}")
    return out


def check_storable(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
    """ValueError naming the first floating tensor that is not finite, or whose values overflow dtype (float16's
    65504): a checkpoint never stores what it cannot read back as the weights. TypeError for a dtype a save does
    not write (STORED)."""
    if dtype not in STORED:
        raise TypeError(f"dtype: expected torch.float32, torch.bfloat16, torch.float16 or torch.float64, got {dtype!r}")
    for k, v in tensors.items():
        if not v.is_floating_point():
            continue
        if not bool(v.isfinite().all()):
            raise ValueError(f"tensor {k} holds non-finite values (NaN or inf); refusing to save it")
        limit = torch.finfo(dtype).max
        big = float(v.detach().abs().max()) if v.numel() else 0.0
        if big > limit:
            raise ValueError(f"tensor {k}: |values| up to {big:.4g} do not fit {str(dtype).removeprefix('torch.')} "
                             f"(at most {limit:.4g}); keep a wider dtype")


def check_state(tensors: dict[str, torch.Tensor], expected: dict[str, torch.Size], where: str, what: str,
                prefix: str = "", shown: int | None = None) -> None:
    """ValueError `{where}: {what}: ...` when the tensors a module loads differ from its state dict's (expected:
    name -> shape): the missing and unexpected names (at most `shown` of each), else every tensor of the wrong
    shape. Names are printed with prefix, as the checkpoint stores them."""
    missing, unexpected = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise ValueError(f"{where}: {what}: missing {_names(missing, prefix, shown)}, "
                         f"unexpected {_names(unexpected, prefix, shown)}")
    wrong = [f"tensor {prefix}{k} has shape {tuple(tensors[k].shape)}, expected {tuple(shape)}"
             for k, shape in expected.items() if tensors[k].shape != shape]
    if wrong:
        raise ValueError(f"{where}: {what}: {'; '.join(wrong)}")


def _names(keys: list[str], prefix: str, shown: int | None) -> str:
    return f"{[prefix + k for k in keys[:shown]]}{' ...' if shown is not None and len(keys) > shown else ''}"
