"""The vLLM entry point `dcoco.vllm_plugin:register` (pyproject, installed environments): the plugin lives in
dcoco.serve.vllm_plugin."""

from .serve.vllm_plugin import register

__all__ = ["register"]
