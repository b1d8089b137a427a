"""dcoco.spec, the engine's module path users know: it lives in dcoco.specdec.engine."""

from .specdec.engine import KS, Engine, Result, probs, summarize, target_only

__all__ = ["KS", "Engine", "Result", "probs", "summarize", "target_only"]
