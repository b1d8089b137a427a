"""How a subcommand ends on an error its input causes: one `dcoco <command>: ...` line and exit code 1."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..errors import ExternalError


@contextlib.contextmanager
def exits(command: str) -> Iterator[None]:
    """Inside: a ValueError (bad input found after argument parsing) or an ExternalError (a server, hub or package
    that cannot be used) becomes SystemExit("<command>: <message>")."""
    try:
        yield
    except (ValueError, ExternalError) as e:
        raise SystemExit(f"{command}: {e}") from None
