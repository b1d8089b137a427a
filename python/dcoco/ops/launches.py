"""Counting what a GPU would launch, on any device: a TorchDispatchMode that records every aten (and dcoco) op
below autograd, with the bytes its tensors hold. Run on the meta device it costs nothing at any size and, as on
CUDA, takes no host-side branch (the CPU's eager id check is not there). Counts are deterministic, so tests
assert them; bench/models/launch_model.py turns them into a latency model.

An op "launches" unless it only makes a view or allocates (no kernel on a GPU): views are the ops whose
schema says the result aliases an input without writing it, plus the allocators below."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# no kernel: allocation or metadata only
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "detach",
              "alias", "set_", "resize_", "_unsafe_view", "view", "_reshape_alias",
              "_record_function_enter_new", "_record_function_exit"}  # profiler regions: host-side marks
# reads only the rows it gathers: count the output (and the index) rather than the whole source
_GATHERS = {"embedding", "index_select", "gather", "index"}
# write only the positions they are given: count the index (and one value per index) rather than the whole target
_SCATTERS = {"scatter_", "scatter", "index_put_", "index_put", "scatter_add_"}
_FILLS = {"fill_", "zero_"}  # write the whole target, read nothing


def _is_view(func) -> bool:
    rets = func._schema.returns
    return bool(rets) and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


@dataclass
class Launches:
    """ops: launching ops in order, by name (e.g. "mm"); bytes: each op's tensor bytes (inputs read + outputs
    written, a gather's source counted as the rows it reads); syncs: ops that read a value to the host."""
    ops: list[str] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    syncs: int = 0

    @property
    def count(self) -> int:
        return len(self.ops)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes)

    def by_op(self) -> dict[str, int]:
        return dict(Counter(self.ops).most_common())


class CountLaunches(TorchDispatchMode):
    """with CountLaunches() as c: ...; then c.result (Launches)."""

    def __init__(self):
        super().__init__()
        self.result = Launches()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if name in ("_local_scalar_dense", "item", "is_nonzero"):
            self.result.syncs += 1
        elif name not in _NO_KERNEL and not _is_view(func):
            ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            written, index = sum(map(_nbytes, outs)), sum(_nbytes(t) for t in ins if not t.is_floating_point())
            if name in _GATHERS:
                read = written + index  # the rows it reads, and the index
            elif name in _SCATTERS:
                read, written = index, 2 * index
            elif name in _FILLS:
                read = 0
            else:
                read = sum(map(_nbytes, ins))
            self.result.ops.append(name)
            self.result.bytes.append(read + written)
        return out


def count(fn, *args, **kwargs) -> tuple[object, Launches]:
    """(fn(*args, **kwargs), its Launches)."""
    with CountLaunches() as c:
        out = fn(*args, **kwargs)
    return out, c.result
