"""One small chat request sent again and again: the proxy-overhead benchmarks' request."""

from __future__ import annotations

CHAT = {
    "model": "mock",
    "max_tokens": 16,
    "temperature": 0,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello in one word, please."},
    ],
}
