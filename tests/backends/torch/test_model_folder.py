"""A model folder that cannot be served fails at start, naming the file and the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from backends.models.config import PRESETS, ModelConfigError
from backends.runners.torch_setup import TorchModelSpec, build_torch_runner, parse_memory


def copy(folder: Path, tmp: Path) -> Path:
    target = tmp / "model"
    shutil.copytree(folder, target)
    return target


def edit_config(folder: Path, **changes: object) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_tensors(folder: Path, change: object) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    change(tensors)  # type: ignore[operator]
    save_file(tensors, path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "config.json").unlink(), r"config.json: missing"),
        (
            lambda d: edit_config(d, architectures=["GPT2LMHeadModel"]),
            r"'GPT2LMHeadModel'\] is not supported",
        ),
        (lambda d: (d / "model.safetensors").unlink(), r"no \*.safetensors weights"),
        (
            lambda d: edit_tensors(
                d, lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight", torch.zeros(3, 3))
            ),
            r"model.safetensors: tensor model.layers.1.mlp.up_proj.weight has shape \(3, 3\)",
        ),
        (
            lambda d: edit_tensors(d, lambda t: t.pop("model.norm.weight")),
            r"tensor model.norm.weight is missing",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64),
            r"model.safetensors: cannot be read",
        ),
    ],
)
def test_a_broken_model_folder_fails_at_start_naming_the_file_and_tensor(
    model_folders: dict[str, Path], tmp_path: Path, damage: object, message: str
) -> None:
    folder = copy(model_folders["llama"], tmp_path)
    damage(folder)  # type: ignore[operator]
    with pytest.raises(ModelConfigError, match=message):
        build_torch_runner(TorchModelSpec(model_path=str(folder), kv_cache_memory="8MiB"))


@pytest.mark.parametrize(("preset", "low", "high"), [("tiny", 4e6, 6e6), ("small", 25e6, 35e6)])
def test_presets_have_their_advertised_size_and_are_seeded(
    preset: str, low: float, high: float
) -> None:
    assert low <= PRESETS[preset].num_parameters <= high
    if preset == "tiny":
        first, second = (
            build_torch_runner(TorchModelSpec(preset="tiny", seed=3, kv_cache_memory="4MiB"))
            for _ in range(2)
        )
        assert torch.equal(first.model.weights.layers[0].qkv, second.model.weights.layers[0].qkv)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1048576", 2**20), ("0.25", 250), ("1", 1)],
)
def test_kv_cache_memory_is_a_size_or_a_fraction_of_free_memory(text: str, expected: int) -> None:
    assert parse_memory(text, free_bytes=1000) == expected


def test_a_kv_budget_that_holds_no_block_is_refused() -> None:
    runner = build_torch_runner(TorchModelSpec(preset="tiny", kv_cache_memory="1KiB"))
    with pytest.raises(ValueError, match="holds no block"):
        runner.num_kv_blocks(16)
