"""Append-only JSONL records: what a kill leaves behind is every finished record and at most one cut line, which
reading drops (`dcoco bench` and `dcoco data generate` resume from them)."""

from __future__ import annotations

import json
from pathlib import Path


def append_record(path: Path, rec: dict) -> None:
    """Appends rec to the JSONL file at path (one line, so a kill can cut only the last record)."""
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def read_records(path: Path) -> list[dict]:
    """The records of a JSONL file written by append_record ([] when there is none)."""
    if not path.is_file():
        return []
    # a line cut by a kill mid-write is dropped: its request is simply redone
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out
