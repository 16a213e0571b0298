"""NVIDIA Dynamo's KV router as a peer of ``make bench-routing``, on the very same engines.

Dynamo 1.6.1 (``ai-dynamo``, installed into a venv of its own, ``~/.cache/kvgate/dynamo``:
without its dependencies, as its planner's stub dependency cannot be built offline) runs here
with file discovery, a TCP request plane and a ZMQ event plane, all on loopback. Its frontend
(``python -m dynamo.frontend --router-mode kv``) routes to workers registered in its
discovery; ``bench.dynamo_worker`` is one per engine, relaying token ids to the engine and the
engine's KV events to the router. Both sides tokenize alike: the model folder given to Dynamo
holds a ``tokenizer.json`` that is the reference backend's byte tokenizer (ids 0-255 the bytes,
256 the end of text) and its ChatML-style chat template, so the router hashes the token ids the
engines cache.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.venvs import venv_bin
from loadtest.harness.processes import external_process, free_port

CACHE = Path(os.environ.get("KVGATE_CACHE", Path.home() / ".cache" / "kvgate"))
VENV = CACHE / "dynamo"
PACKAGES = ("ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1")
REQUIREMENTS = (
    "aiohttp>=3.14.3,<4",
    "certifi",
    "kubernetes>=32,<33",
    "msgspec>=0.19",
    "prometheus-client>=0.23.1,<1",
    "pyzmq>=26",
    "redis>=6.2,<9",
    "tqdm",
    "transformers>=4.56",
    "typing-extensions>=4.10",
    "zstandard>=0.23,<1",
    "pydantic>=2.10.6,<=2.13.5",
    "uvloop>=0.21",
)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EOS = "<|endoftext|>"


def dynamo_python() -> tuple[Path | None, str]:
    """The Dynamo venv's python (made on first use from the package registry: its packages
    without their dependencies, then what they need at run time), or None and why."""
    bin_dir, why = venv_bin(VENV, ("--no-deps", *PACKAGES), REQUIREMENTS)
    return (bin_dir / "python" if bin_dir else None), why


def byte_level_chars() -> list[str]:
    """The printable character GPT-2's byte-level pre-tokenizer maps each byte to."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def write_model_folder(folder: Path, max_len: int) -> Path:
    """A weightless model folder whose tokenizer is the reference backend's."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {char: byte for byte, char in enumerate(byte_level_chars())}
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 256, "content": EOS, "single_word": False, "lstrip": False, "rstrip": False}
            | {"normalized": False, "special": True}
        ],
        "normalizer": None,
        "pre_tokenizer": byte_level | {"use_regex": False},
        "post_processor": None,
        "decoder": byte_level | {"use_regex": False},
        "model": {"type": "BPE", "vocab": vocab | {EOS: 256}, "merges": []},
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 257,
        "eos_token_id": 256,
        "max_position_embeddings": max_len,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 1,
    }
    tokenizer_config = {
        "chat_template": CHAT_TEMPLATE,
        "eos_token": EOS,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    for name, content in (
        ("tokenizer.json", tokenizer),
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
    ):
        (folder / name).write_text(json.dumps(content))
    return folder


def environment(discovery: Path) -> dict[str, str]:
    """What every Dynamo process of one run needs to find the others on loopback."""
    return {
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(discovery),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_PORT": "-1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "DYN_LOG": os.environ.get("DYN_LOG", "warn"),
    }


def wait_for_workers(url: str, model: str, deadline_s: float = 60.0) -> None:
    """Until the frontend lists ``model`` (its workers registered)."""
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:
                if any(m.get("id") == model for m in json.load(response).get("data", [])):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"Dynamo's frontend at {url} never listed {model}")


@contextmanager
def running_dynamo(
    python: Path,
    engines: list[tuple[str, int]],
    model: str,
    workdir: Path,
    policy: str = "kv",
) -> Iterator[tuple[str, int, list[int]]]:
    """Dynamo's frontend with one ``bench.dynamo_worker`` per engine (base URL, KV-event
    port); yields the frontend's URL, its process id and the workers' ids. ``policy``: ``kv``
    (its KV router, fed by the engines' KV events), ``approximate`` (the KV router predicting
    from its own picks, ``--no-router-kv-events``) or another ``--router-mode``."""
    folder = write_model_folder(workdir / "dynamo-model", 32_768)
    env = environment(workdir / "dynamo-discovery")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    front = [str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1"]
    mode = "kv" if policy == "approximate" else policy
    front += ["--http-port", str(port), "--router-mode", mode]
    front += ["--no-router-kv-events"] if policy == "approximate" else []
    root = str(Path(__file__).resolve().parents[1])
    with ExitStack() as stack:
        workers = []
        for number, (engine, events) in enumerate(engines):
            argv = [str(python), "-m", "bench.dynamo_worker", "--engine", engine]
            argv += ["--kv-events", str(events), "--model-dir", str(folder), "--model-name", model]
            log = workdir / f"dynamo-worker-{number}.log"
            proc = stack.enter_context(
                external_process(argv, None, env=env | {"PYTHONPATH": root}, log=log)
            )
            workers.append(proc.pid)
        frontend = stack.enter_context(
            external_process(front, f"{url}/health", env=env, log=workdir / "dynamo-frontend.log")
        )
        wait_for_workers(url, model)
        yield url, frontend.pid, workers
