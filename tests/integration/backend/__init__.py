"""The reference backend served for real: OpenAI API, KV events, LoRA, speculation, failures."""
