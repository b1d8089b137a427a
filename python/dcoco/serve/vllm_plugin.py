"""The vLLM plugin (entry point `vllm.general_plugins`): registers the DCOCO drafter architecture so that stock vLLM
serves dcoco checkpoints with `--speculative-config '{"method": "dflash", "model": DIR, ...}'`.

vLLM calls register() in every process (API server, engine core, workers). It is idempotent, never raises, and
logs why it stays inactive (no vLLM, an unsupported version)."""

from __future__ import annotations

import logging

ARCHITECTURE = "DFlashDCOCODraftModel"  # vLLM keeps names that start with "DFlash" (others it renames)
MODEL = "dcoco.serve.vllm_model:DFlashDCOCOForCausalLM"
SUPPORTED = ((0, 32), (0, 33))  # (major, minor) releases whose DFlash drafter and V1 proposer we build on

log = logging.getLogger("dcoco.vllm")


def version_error(version: str) -> str | None:
    """Why this vLLM version is unsupported, or None."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return f"cannot parse the vLLM version {version!r}"
    if (major, minor) not in SUPPORTED:
        want = ", ".join(f"{a}.{b}.x" for a, b in SUPPORTED)
        return f"vLLM {version} is not supported (supported: {want}); pip install 'dcoco[vllm]'"
    return None


def register() -> bool:
    """Register DFlashDCOCODraftModel with vLLM's model registry; True when it is (or already was)."""
    try:
        import vllm
        from vllm import ModelRegistry
    except Exception as e:  # noqa: BLE001 (a plugin must never break the host)
        log.info("dcoco: vLLM plugin inactive (vLLM not importable: %s)", e)
        return False
    try:
        why = version_error(getattr(vllm, "__version__", "unknown"))
        if why:
            log.warning("dcoco: vLLM plugin inactive: %s", why)
            return False
        if ARCHITECTURE not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(ARCHITECTURE, MODEL)
        return True
    except Exception as e:  # noqa: BLE001
        log.warning("dcoco: vLLM plugin inactive: registering %s failed: %s", ARCHITECTURE, e)
        return False
