"""JSONL files. Append-only records: what a kill leaves behind is every finished record and at most one cut line,
which reading drops (`dcoco bench` and `dcoco data generate` resume from them). Files written whole (write_records)
or by hand and other tools (read_lines: every line must parse)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from .files import write_text_atomic


class BadLine(ValueError):
    """A line of a JSONL file that is not JSON; line: its number, from 1. The message is the decoder's."""

    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


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


def write_records(path: Path, recs: Iterable) -> None:
    """The JSONL file at path holding recs, one per line, written whole (files.write_text_atomic)."""
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in recs))


def read_lines(text: str, appended: bool = False) -> Iterator[tuple[int, object]]:
    """(line number from 1, value) of every non-blank line of JSONL text; BadLine names a line that is not JSON.
    Lines end at "\\n" only: JSON written without ensure_ascii may hold U+2028 and the like inside its strings.
    appended (a file written by append_record): a last line with no newline after it that is not JSON was cut by
    a kill mid-write, and is left out."""
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except json.JSONDecodeError as e:
                if appended and n == len(lines):
                    return
                raise BadLine(str(e), n) from None
