"""Writes a kill never leaves half done: the content goes to a temporary sibling of the destination, which then
takes the destination's place in one rename (os.replace). Use replacing() for anything written in steps (a
safetensors file, a folder), write_text_atomic() for text in one go:

    with replacing(out / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))
    write_text_atomic(out / "run.json", json.dumps(res, indent=2))"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: str | os.PathLike, keep_existing: bool = False) -> Iterator[Path]:
    """Yields a path beside `path`, this process's own, for the caller to write a file or make a folder at; when
    the block ends without an exception, it replaces `path`. keep_existing: if `path` exists by then (a cache entry
    another process finished first, the same content), it is kept and the new copy dropped. On an exception the
    temporary is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        if keep_existing and path.exists():
            _remove(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Writes text (UTF-8) to path through replacing(): readers see the old file or the new one, never a part."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
