"""One request to an OpenAI-compatible chat server (vLLM, SGLang, ...), as `dcoco bench` and `dcoco data generate`
send it."""

from __future__ import annotations

import time


async def chat(client, base: str, body: dict, messages: list[dict]) -> dict:
    """One chat-completions request: {status: ok, tokens, latency, finish, content, token_ids and prompt_token_ids
    (None unless the server returns them, e.g. vLLM with return_token_ids)} or {status: error, error, http_status
    (when it answered)}."""
    import httpx

    t0 = time.perf_counter()
    try:
        r = await client.post(f"{base}/v1/chat/completions", json={**body, "messages": messages})
    except httpx.TimeoutException:
        return {"status": "error", "error": f"no answer within --timeout ({client.timeout.read} s)"}
    except httpx.HTTPError as e:  # refused, dropped mid-response, ...
        return {"status": "error", "error": f"{type(e).__name__}: {e}"}
    lat = time.perf_counter() - t0
    if r.status_code != 200:
        return {"status": "error", "http_status": r.status_code, "error": f"HTTP {r.status_code}: {r.text[:500]}"}
    try:
        data = r.json()
        choice, tokens = data["choices"][0], int(data["usage"]["completion_tokens"])
        content = choice["message"].get("content") or ""
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        return {"status": "error", "http_status": r.status_code,
                "error": f"malformed response ({type(e).__name__}: {e}): {r.text[:300]}"}
    return {"status": "ok", "tokens": tokens, "latency": lat, "finish": choice.get("finish_reason"),
            "content": content, "token_ids": choice.get("token_ids"), "prompt_token_ids": data.get("prompt_token_ids")}
