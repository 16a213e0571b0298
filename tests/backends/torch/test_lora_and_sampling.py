"""Multi-LoRA against transformers with the adapter merged; the sampler's contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.engine.sequence import SamplingParams
from backends.runners.sampler import Sampler, SampleRow
from tests.backends.torch.conftest import hf_greedy
from tests.backends.torch.helpers import collect, greedy, make_engine, make_runner
from tests.backends.torch.test_model_exactness import last_logits, prefill

peft = pytest.importorskip("peft")


def save_adapter(base: Path, out: Path, seed: int, targets: list[str]) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    lora = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.3)
    lora.save_pretrained(out)


def merged(base: Path, adapter: Path) -> object:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base)
    return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()


@pytest.fixture(scope="module")
def adapters(
    model_folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("adapters")
    base = model_folders["llama"]
    found = {"attn": tmp / "attn", "mlp": tmp / "mlp"}
    save_adapter(base, found["attn"], 1, ["q_proj", "k_proj", "v_proj", "o_proj"])
    save_adapter(base, found["mlp"], 2, ["gate_proj", "up_proj", "down_proj"])
    return found


async def test_two_adapters_and_the_base_model_in_one_batch_match_merged_transformers(
    model_folders: dict[str, Path], adapters: dict[str, Path], hf_models: dict[str, object]
) -> None:
    base = model_folders["llama"]
    runner = make_runner(base, max_loras=2)
    for name, path in adapters.items():
        await runner.load_lora(name, str(path))
    engine = make_engine(runner, max_loras=2)
    prompt = list(range(40, 75))
    engine.start()
    try:
        outs = await collect(
            engine,
            [(prompt, greedy(32), "attn"), (prompt, greedy(32), None), (prompt, greedy(32), "mlp")],
        )
    finally:
        await engine.stop()
    assert outs[0] == hf_greedy(merged(base, adapters["attn"]), prompt, 32)
    assert outs[1] == hf_greedy(hf_models["llama"], prompt, 32)
    assert outs[2] == hf_greedy(merged(base, adapters["mlp"]), prompt, 32)
    assert outs[0] != outs[1] != outs[2]
    assert sorted(runner.loras.resident) == ["attn", "mlp"]


async def test_adapter_logits_match_transformers_with_the_adapter_merged(
    model_folders: dict[str, Path], adapters: dict[str, Path]
) -> None:
    base = model_folders["llama"]
    runner = make_runner(base, max_loras=2)
    runner.num_kv_blocks(16)
    tokens = list(range(100, 141))
    steps = [prefill(0, tokens, [0, 1, 2], lora="attn"), prefill(1, tokens, [5, 6, 7], lora="mlp")]
    for name, path in adapters.items():
        await runner.load_lora(name, str(path))
    ours = last_logits(runner, steps)
    for row, name in enumerate(("attn", "mlp")):
        with torch.no_grad():
            ref = merged(base, adapters[name])(torch.tensor([tokens])).logits[0, -1]  # type: ignore[operator]
        assert (ours[row] - ref).abs().max().item() <= 1e-4


async def test_at_most_max_loras_are_resident_and_the_least_recently_used_is_swapped_out(
    model_folders: dict[str, Path], adapters: dict[str, Path]
) -> None:
    runner = make_runner(model_folders["llama"], max_loras=1)
    for name, path in adapters.items():
        await runner.load_lora(name, str(path))
    engine = make_engine(runner, max_loras=1)
    engine.start()
    try:
        first = await collect(engine, [(list(range(9, 30)), greedy(8), "attn")])
        await collect(engine, [(list(range(9, 30)), greedy(8), "mlp")])
        again = await collect(engine, [(list(range(9, 30)), greedy(8), "attn")])
    finally:
        await engine.stop()
    assert runner.loras.resident == ["attn"]
    assert runner.loras.num_swaps == 3
    assert again == first  # swapped out and back in, the adapter computes the same


async def test_a_request_running_on_an_adapter_finishes_after_it_is_unloaded(
    model_folders: dict[str, Path], adapters: dict[str, Path], hf_models: dict[str, object]
) -> None:
    base = model_folders["llama"]
    runner = make_runner(base, max_loras=1)
    await runner.load_lora("attn", str(adapters["attn"]))
    engine = make_engine(runner, max_loras=1)
    prompt = list(range(60, 90))
    engine.start()
    try:
        stream = engine.add_request(prompt, greedy(24), lora_name="attn")
        tokens = await stream.next_tokens()
        runner.unload_lora("attn")
        while batch := await stream.next_tokens():
            tokens += batch
        (base_out,) = await collect(engine, [(prompt, greedy(8), None)])
    finally:
        await engine.stop()
    assert tokens == hf_greedy(merged(base, adapters["attn"]), prompt, 24)
    assert base_out == hf_greedy(hf_models["llama"], prompt, 8)
    with pytest.raises(ValueError, match="not loaded"):  # never loaded here
        runner.loras.batch([prefill(0, prompt, [40, 41], lora="mlp")])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "adapter_config.json").unlink(), "adapter_config.json"),
        (
            lambda d: (d / "adapter_model.safetensors").write_bytes(b"not a tensor file"),
            "adapter_model.safetensors",
        ),
        (
            lambda d: (d / "adapter_config.json").write_text(
                json.dumps({"r": 16, "lora_alpha": 8})
            ),
            "do not fit rank 16",
        ),
    ],
)
async def test_a_broken_adapter_is_refused_with_the_file_named(
    model_folders: dict[str, Path],
    adapters: dict[str, Path],
    tmp_path: Path,
    damage: object,
    message: str,
) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(adapters["attn"], broken)
    damage(broken)  # type: ignore[operator]
    runner = make_runner(model_folders["llama"])
    with pytest.raises(ValueError, match=message):
        await runner.load_lora("broken", str(broken))


def rows(*params: SamplingParams) -> list[SampleRow]:
    return [SampleRow(seq_id=i, sampling=p, num_output_tokens=0) for i, p in enumerate(params)]


def test_a_seeded_request_draws_the_same_tokens_whatever_else_is_in_the_batch() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    seeded = SamplingParams(temperature=1.0, seed=42)
    alone = [Sampler(()).sample(logits[:1], rows(seeded)).tokens[0] for _ in range(2)]
    sampler = Sampler(())
    mixed = sampler.sample(logits, rows(seeded, SamplingParams(), SamplingParams())).tokens[0]
    assert alone[0] == alone[1] == mixed


def test_top_k_one_is_greedy_and_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.tensor([[0.0, 5.0, 4.9, -3.0]])
    sampler = Sampler((), seed=1)
    for _ in range(20):
        assert sampler.sample(logits, rows(SamplingParams(top_k=1))).tokens == [1]
        (token,) = sampler.sample(logits, rows(SamplingParams(top_p=0.9))).tokens
        assert token in (1, 2)


def test_min_tokens_masks_eos_and_stop_tokens_until_reached() -> None:
    logits = torch.tensor([[0.0, 0.0, 9.0, 8.0, 7.0]])
    sampler = Sampler(eos_token_ids=(2,))
    early = SampleRow(0, SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(3,)), 1)
    late = SampleRow(0, SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(3,)), 3)
    assert sampler.sample(logits.clone(), [early]).tokens == [4]
    assert sampler.sample(logits.clone(), [late]).tokens == [2]


def test_logprobs_are_those_of_the_unmodified_distribution() -> None:
    logits = torch.randn(3, 30, generator=torch.Generator().manual_seed(5))
    sampled = Sampler(()).sample(
        logits,
        rows(
            SamplingParams(temperature=0.0, logprobs=True),
            SamplingParams(temperature=0.5),
            SamplingParams(temperature=0.7, logprobs=True, top_logprobs=4),
        ),
    )
    tokens, logprobs, tops = sampled.tokens, sampled.logprobs, sampled.top_logprobs
    assert logprobs is not None and logprobs[1] is None
    expected = torch.log_softmax(logits, -1)
    for row in (0, 2):
        assert logprobs[row] == pytest.approx(expected[row, tokens[row]].item(), abs=1e-6)
    assert tops is not None and tops[0] is None and tops[1] is None and tops[2] is not None
    most = torch.topk(expected[2], 4)
    assert [token for token, _ in tops[2]] == most.indices.tolist()
    assert [lp for _, lp in tops[2]] == pytest.approx(most.values.tolist(), abs=1e-6)


def test_logprobs_under_min_tokens_are_the_models_and_the_logits_are_left_alone() -> None:
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]])
    before = logits.clone()
    early = SampleRow(0, SamplingParams(temperature=0.0, min_tokens=2, logprobs=True), 0)
    sampled = Sampler(eos_token_ids=(2,)).sample(logits, [early])
    assert sampled.tokens == [3]  # EOS (2) ruled out for the draw...
    assert sampled.logprobs is not None
    expected = torch.log_softmax(before, -1)[0, 3].item()
    assert sampled.logprobs[0] == pytest.approx(expected, abs=1e-6)  # ...not for the logprob
    assert torch.equal(logits, before)


def test_min_p_rules_out_the_unlikely() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    sampler = Sampler((), seed=2)
    drawn = {sampler.sample(logits, rows(SamplingParams(min_p=0.5))).tokens[0] for _ in range(200)}
    assert drawn == {0, 1}  # 0.15 and 0.05 are under half of 0.5
