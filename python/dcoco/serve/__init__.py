"""Serving: the vLLM plugin (vllm_plugin, vllm_model, hook)."""
