"""Prefill/decode workers on the torch runner: the decode worker's greedy tokens, computed over
KV pulled from the prefill worker, are transformers' own; the blocks move bit for bit."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from backends.runners.torch_runner import TorchRunner
from tests.backends.pd.servers import ServerFactory, Worker, prefill_body, start_worker
from tests.backends.torch.conftest import hf_greedy

torch = pytest.importorskip("torch")

PROMPT = [(7 * i) % 900 + 5 for i in range(300)]  # 300 token ids: 19 blocks of 16


def torch_args(folder: Path, *extra: str) -> tuple[str, ...]:
    return (
        "--runner", "torch", "--model-path", str(folder), "--model", "tiny",
        "--kv-cache-memory", "16MiB", "--max-model-len", "1024", *extra,
    )  # fmt: skip


async def pd_tokens(
    session: aiohttp.ClientSession, prefill: Worker, decode: Worker, max_tokens: int
) -> list[int]:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    status, first = await prefill.post(session, prefill_body(body))
    assert status == 200, first
    status, second = await decode.post(
        session, {**body, "kv_transfer_params": first["kv_transfer_params"]}
    )
    assert status == 200, second
    tokens: list[int] = second["choices"][0]["token_ids"]
    return tokens


@pytest.mark.parametrize("decode_extra", [(), ("--engine-process",)], ids=["thread", "process"])
async def test_pd_greedy_tokens_are_transformers_own(
    aiohttp_server: ServerFactory,
    model_folders: dict[str, Path],
    hf_models: dict[str, object],
    decode_extra: tuple[str, ...],
) -> None:
    folder = model_folders["llama"]
    prefill = await start_worker(aiohttp_server, *torch_args(folder, "--role", "prefill"))
    decode = await start_worker(
        aiohttp_server, *torch_args(folder, "--role", "decode", *decode_extra)
    )
    async with aiohttp.ClientSession() as session:
        tokens = await pd_tokens(session, prefill, decode, 12)
        assert await decode.metric(session, "kvgate:kv_transfer_blocks_total") == 19
        assert await decode.metric(session, "kvgate:kv_transfer_failures_total") == 0
    assert tokens == hf_greedy(hf_models["llama"], PROMPT, 12)
    assert prefill.blocks_in_use == 0


@pytest.mark.parametrize(("dtype", "share"), [("float16", 2), ("float8_e4m3fn", 4)])
async def test_a_narrower_transfer_dtype_moves_fewer_bytes(
    aiohttp_server: ServerFactory, model_folders: dict[str, Path], dtype: str, share: int
) -> None:
    folder = model_folders["llama"]
    prefill = await start_worker(aiohttp_server, *torch_args(folder, "--role", "prefill"))
    exact = await start_worker(aiohttp_server, *torch_args(folder, "--role", "decode"))
    half = await start_worker(
        aiohttp_server, *torch_args(folder, "--role", "decode", "--kv-transfer-dtype", dtype)
    )
    async with aiohttp.ClientSession() as session:
        await pd_tokens(session, prefill, exact, 4)
        await pd_tokens(session, prefill, half, 4)
        full = await exact.metric(session, "kvgate:kv_transfer_bytes_total")
        halved = await half.metric(session, "kvgate:kv_transfer_bytes_total")
    assert full > 0 and halved == full / share


def test_blocks_read_from_one_cache_are_written_bit_for_bit_into_another(
    model_folders: dict[str, Path],
) -> None:
    from backends.runners.torch_setup import TorchModelSpec, build_torch_runner

    spec = TorchModelSpec(model_path=str(model_folders["llama"]), kv_cache_memory="4MiB")
    source, target = build_torch_runner(spec), build_torch_runner(spec)
    for runner in (source, target):
        runner.num_kv_blocks(16)
    assert isinstance(source, TorchRunner) and source.cache is not None
    for number, layer in enumerate(source.cache.layers):
        layer.copy_(torch.randn(layer.shape, generator=torch.Generator().manual_seed(number)))
    blocks = source.read_blocks_now([3, 7, 1], None)
    assert blocks.shape[:3] == (2, 3, 16) and blocks.num_bytes == len(blocks.data)
    target.write_blocks_now([10, 11, 12], blocks)
    assert target.cache is not None
    for mine, theirs in zip(source.cache.layers, target.cache.layers, strict=True):
        for read, written in ((3, 10), (7, 11), (1, 12)):
            assert torch.equal(
                mine[read * 16 : read * 16 + 16], theirs[written * 16 : written * 16 + 16]
            )
    with pytest.raises(ValueError, match="does not fit"):
        target.write_blocks_now([1, 2], blocks)  # three blocks into two
    with pytest.raises(ValueError, match="unknown KV transfer dtype"):
        source.read_blocks_now([1], "int8")
