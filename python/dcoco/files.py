"""Writes a kill never leaves half done: the content goes to a temporary sibling of the destination, which then
takes the destination's place in one rename (os.replace). Use replacing() for anything written in steps (a
safetensors file, a folder), write_text_atomic() for text in one go, replacing_folder() for files that must change
together (a checkpoint's config and tensors):

    with replacing(out / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))
    write_text_atomic(out / "run.json", json.dumps(res, indent=2))"""

from __future__ import annotations

import contextlib
import errno
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


def _stale(folder: Path, prefix: str) -> list[Path]:
    """The entries prefix + pid in folder of pids no process on this host has now (a live writer's are never
    among them)."""
    if not folder.is_dir():
        return []
    return [e for e in folder.iterdir() if e.name.startswith(prefix) and e.name[len(prefix):].isdigit()
            and int(e.name[len(prefix):]) != os.getpid() and not _alive(int(e.name[len(prefix):]))]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def replacing_folder(path: str | os.PathLike, carry=lambda name: False) -> Iterator[Path]:
    """Yields a new, empty folder beside `path` to write into; when the block ends without an exception, its
    files are fsynced and it takes `path`'s place in one step (Linux's renameat2 RENAME_EXCHANGE; elsewhere two
    renames, between which `path` is briefly absent), so readers see the old folder or the new one, never a mix.
    The old folder's entries that carry(name) accepts and the new one lacks are carried over (files hard-linked
    before the swap, subfolders moved after it). On an exception the temporary is removed and `path` is left as
    it was. What writers killed mid-write left beside `path` (their temporaries, named by a pid no process on this
    host has now) is cleared first; a folder shared between hosts needs its writers on one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    for entry in _stale(path.parent, f".{path.name}.tmp"):
        _remove(entry)
    for aside in _stale(path.parent, f".{path.name}.old"):  # a swap without renameat2, killed between its renames
        if not path.exists():
            os.rename(aside, path)
        _remove(aside)
    _remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        if path.is_dir():
            for entry in path.iterdir():
                if carry(entry.name) and not (tmp / entry.name).exists() and entry.is_file() \
                        and not entry.is_symlink():
                    os.link(entry, tmp / entry.name)
        _fsync_tree(tmp)
        if not path.exists():
            os.rename(tmp, path)
        else:
            if not path.is_dir():
                raise NotADirectoryError(f"{path} is a file, not a folder")
            _exchange(tmp, path)  # tmp now holds the old folder
            for entry in tmp.iterdir():  # subfolders the new one does not have (files were linked above)
                if carry(entry.name) and entry.is_dir() and not (path / entry.name).exists():
                    os.rename(entry, path / entry.name)
            _remove(tmp)
        _fsync(path.parent)
    except BaseException:
        _remove(tmp)
        raise


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for entry in folder.iterdir():
        if entry.is_file():
            _fsync(entry)
    _fsync(folder)


def _exchange(a: Path, b: Path) -> None:
    """Swaps the two paths atomically where the system can (renameat2 RENAME_EXCHANGE), else b moves aside, a
    takes its place and the old b ends up at a."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), str(b))
    aside = b.with_name(f".{b.name}.old{os.getpid()}")
    os.rename(b, aside)
    os.rename(a, b)
    os.rename(aside, a)
