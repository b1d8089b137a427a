"""Speculative decoding offline: the engine (engine), its exact simulation (simulate), confidence intervals (stats)
and `dcoco eval` (evaluate)."""
