"""kvgate: what every part shares.

``kvgate.wire`` is the shared wire layer (HTTP/1.1 server and pool, SSE, request ids, OpenAI
error bodies and usage, the vLLM KV-event format, tokenizer and chat template); ``kvgate.api``
holds the generated gRPC code of ``proto/``; ``kvgate.cli`` is the root ``kvgate`` command,
the only module here that may import the packages above (``docs/architecture.md``).
"""
