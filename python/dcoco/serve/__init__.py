"""Serving: the vLLM plugin (vllm_plugin, vllm_model, vllm_patches, vllm_tp, hook)."""
