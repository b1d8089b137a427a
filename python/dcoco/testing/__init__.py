"""Fixtures for tests and bench scripts: the literal reference math (reference), a tiny random target (tiny) and a
vLLM server process (vllm_server). Nothing in the library imports them."""
