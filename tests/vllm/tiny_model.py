"""Build a tiny random-weight Llama, its tokenizer and two LoRA adapters, all locally.

Run with the vLLM venv's Python (it has torch, transformers and, once installed, peft):
``python tests/vllm/tiny_model.py OUT_DIR``; ``--shape bench`` builds instead the ~5M-parameter
Llama of ``make bench-engine`` (no adapters). Nothing is downloaded: the weights come from a
seed, and the BPE tokenizer is trained on this repository's own docs. The chat template is
Llama 3's shape (header tokens, ``<|eot_id|>``), rendered by transformers' jinja2 rules.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)
VOCAB = 1024
ADAPTERS = ("sql", "poet")


VOCABULARY = (
    "the a an of to in on for with by at from and or but not is are was be been have has "
    "do you we they it this that these those which who what where when why how here "
    "there gateway route request response backend engine cache prefix block token model "
    "server parcel depot driver address delivery package tracking number order customer "
    "support question answer short sentence brief clear please thanks hello world select "
    "from where table join group count sum poem rhyme verse line night day light dark "
    "river mountain one two three four five six seven eight nine ten first second last "
    "next before after ünïcödé spaces newlines tabs punctuation , . ; : ! ? ' \" ( ) [ ] "
    "{ } - _ / \\ @ # $ % "
)
WORDS = tuple(VOCABULARY.split())


def corpus(seed: int = 0, lines: int = 4000) -> list[str]:
    """Seeded sentences over a fixed word list: the same tokenizer on every machine."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 16))) for _ in range(lines)]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer)
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "bench": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}


def build_model(out: Path, shape: str = "tiny") -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        **SHAPES[shape],
        max_position_embeddings=4096,
        bos_token_id=0,
        eos_token_id=4,
        tie_word_embeddings=False,
        torch_dtype="float32",  # type: ignore[call-arg]  # the name transformers 4.x reads
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    if shape != "tiny":
        return
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        return
    for index, name in enumerate(ADAPTERS):
        torch.manual_seed(1 + index)
        lora = get_peft_model(
            LlamaForCausalLM(config),
            LoraConfig(
                r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
            ),
        )
        lora.save_pretrained(str(out.parent / f"lora-{name}"))


def main() -> int:
    out = Path(sys.argv[1])
    shape = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--shape" else "tiny"
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out, shape)
    (out / "kvgate-built.json").write_text(json.dumps({"vocab": VOCAB, "adapters": ADAPTERS}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
