"""Decoder models for the torch runner: config, weights, layers, the Llama/Qwen2 forward."""
