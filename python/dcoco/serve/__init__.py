"""Serving: the vLLM plugin (vllm_plugin, vllm_model, hook) and the serving benchmark `dcoco bench` (serve_bench,
serve_bench_report)."""
