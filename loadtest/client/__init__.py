"""Load-generating clients: closed-loop HTTP load, SSE streams, and Envoy-like ext_proc
messages."""
