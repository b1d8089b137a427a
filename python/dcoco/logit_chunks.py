"""How many rows of a (rows, V) logits product to take at a time: the LM head's passes (the drafter's loss and
top-K, the target's labels) never hold more than CHUNK_BYTES of float32 logits."""

from __future__ import annotations

CHUNK_BYTES = 256 * 2 ** 20  # float32 logits per chunk when the caller does not say


def chunk_rows(vocab_size: int, rows: int | None = None) -> int:
    """Rows per chunk: `rows` when given, else as many as CHUNK_BYTES of float32 logits hold (at least 1)."""
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows: expected an integer >= 1, got {rows!r}")
        return rows
    return max(1, CHUNK_BYTES // (4 * vocab_size))
