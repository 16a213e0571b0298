"""From command-line choices to a ``TorchRunner``: model folder or preset, dtype, device, and
the KV-cache memory budget (bytes, or a fraction of the free memory of the device)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from backends.models.config import PRESETS, ModelConfig, ModelConfigError, load_config
from backends.models.weights import load_weights, random_weights
from backends.runners.torch_runner import RunnerOptions, TorchRunner
from backends.runners.torch_thread import TorchThread

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kb": 10**3,
    "kib": 2**10,
    "m": 2**20,
    "mb": 10**6,
    "mib": 2**20,
    "g": 2**30,
    "gb": 10**9,
    "gib": 2**30,
}


@dataclass(frozen=True, slots=True)
class TorchModelSpec:
    model_path: str | None = None
    preset: str | None = None
    seed: int = 0
    dtype: str = "auto"  # float32 on CPU; the checkpoint's half type where the device has it
    device: str = "auto"  # cuda when present, else cpu
    kv_cache_memory: str = "0.1"  # bytes ("512MiB") or a fraction of free memory ("0.1")
    max_loras: int = 1
    max_lora_rank: int = 64
    packed_projections: bool = True  # oneDNN's packed weights where the device allows
    vocab_size: int | None = None  # a preset's vocabulary (the tokenizer's)


def parse_memory(text: str, free_bytes: int) -> int:
    """``"512MiB"``, ``"2GB"``, ``"1073741824"``, or a fraction of ``free_bytes`` (``"0.2"``)."""
    value = text.strip().lower()
    try:
        fraction = float(value)
    except ValueError:
        fraction = None
    if fraction is not None and 0 < fraction <= 1 and not value.isdigit():
        return int(free_bytes * fraction)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value)
    if match is None or match[2] not in UNITS:
        raise ValueError(
            f"--kv-cache-memory {text!r}: expected a size such as 512MiB or 2GB, or a fraction "
            "of free memory in (0, 1]"
        )
    return int(float(match[1]) * UNITS[match[2]])


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


def choose_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return torch.device(name)


def choose_dtype(name: str, config: ModelConfig, device: torch.device) -> torch.dtype:
    if name != "auto":
        if name not in DTYPES:
            raise ValueError(f"--dtype {name!r}: expected auto, {', '.join(DTYPES)}")
        if device.type == "cpu" and name == "float16":
            raise ValueError("--dtype float16 is not supported on the CPU; use float32")
        return DTYPES[name]
    if device.type == "cuda" and config.torch_dtype in ("bfloat16", "float16"):
        return DTYPES[config.torch_dtype]
    return torch.float32  # this CPU has no BF16 units: float32 is both exact and fastest


def build_torch_runner(
    spec: TorchModelSpec, eos_token_ids: tuple[int, ...] = (), *, inline: bool = False
) -> TorchRunner:
    """The runner for ``spec``, built on its own torch thread (on the calling thread when
    ``inline``); ``ValueError`` (``ModelConfigError``) on a bad folder or option."""
    thread = TorchThread(inline=inline)
    try:
        return thread.call(_build, spec, eos_token_ids, thread)
    except BaseException:
        thread.close()
        raise


def _build(
    spec: TorchModelSpec, eos_token_ids: tuple[int, ...], thread: TorchThread
) -> TorchRunner:
    device = choose_device(spec.device)
    if spec.model_path is not None:
        config = load_config(spec.model_path)
        dtype = choose_dtype(spec.dtype, config, device)
        weights = load_weights(spec.model_path, config, dtype, device)
    elif spec.preset is not None:
        if spec.preset not in PRESETS:
            raise ModelConfigError(f"--preset {spec.preset!r}: expected {', '.join(PRESETS)}")
        config = PRESETS[spec.preset]
        if spec.vocab_size is not None:
            config = config.with_vocab(spec.vocab_size)
        dtype = choose_dtype(spec.dtype, config, device)
        weights = random_weights(config, spec.seed, dtype, device)
    else:
        raise ValueError("the torch runner needs --model-path DIR or --preset NAME")
    options = RunnerOptions(
        kv_cache_bytes=parse_memory(spec.kv_cache_memory, free_memory(device)),
        max_loras=spec.max_loras,
        max_lora_rank=spec.max_lora_rank,
        packed_projections=spec.packed_projections,
        seed=spec.seed,
    )
    return TorchRunner(config, weights, options, eos_token_ids=eos_token_ids, thread=thread)
