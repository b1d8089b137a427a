"""The exceptions dcoco's library code raises beside the built-in ones; the command line (dcoco.cli) turns them into
one line and an exit code."""

from __future__ import annotations


class ExternalError(RuntimeError):
    """Something outside dcoco cannot be used: a server that does not answer or does not serve the model, a hub
    dataset that cannot be fetched, a package the step needs that is not installed. The message says what to do."""
