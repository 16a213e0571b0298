"""The engine benchmark's Markdown summary of ``build/bench-engine.json``'s results."""

from __future__ import annotations

from loadtest.reports.stats import percentile

PARAMETERS = 5_246_208  # of the bench shape: 2 x params FLOP per generated token


LABELS = {
    "kvgate-process": "kvgate, --engine-process",
    "kvgate-plain": "kvgate, --plain-matmul",
    "vllm": "vLLM CPU",
    "hf_sequential": "HF `generate`, one request at a time",
    "hf_static8": "HF `generate`, static batches of 8",
    "hf_continuous": "HF `generate_batch` (continuous batching)",
}


def report(results: dict[str, object]) -> None:
    rounds = results["rounds"]
    assert isinstance(rounds, dict)
    floor = results["matmul_floor"]
    assert isinstance(floor, dict)
    kv = [r["tokens_per_s"] for r in rounds["kvgate"]]
    print("\n| engine | output tok/s per round | median | kvgate / it per round | median |")
    print("|---|---|---:|---|---:|")
    med = percentile(kv, 50)
    print(f"| kvgate (torch runner) | {', '.join(f'{v:.0f}' for v in kv)} | {med:.0f} | | 1.00 |")
    for name, label in LABELS.items():
        if name not in rounds:
            continue
        them = [r["tokens_per_s"] for r in rounds[name]]
        ratios = [ours / theirs for ours, theirs in zip(kv, them, strict=False)]
        print(
            f"| {label} | {', '.join(f'{v:.0f}' for v in them)} | {percentile(them, 50):.0f} | "
            f"{', '.join(f'{r:.2f}' for r in ratios)} | **{percentile(ratios, 50):.2f}** |"
        )
    achieved = 2 * PARAMETERS * med / 1e9
    print(
        f"\nmatmul floor: {floor['square_1024_gflops']:.0f} GFLOP/s (1024^3), "
        f"{floor['decode16_mlp_gflops']:.0f} GFLOP/s (decode-shaped, batch 16); kvgate's "
        f"weights-only FLOP/s at {med:.0f} tok/s: {achieved:.1f} GFLOP/s = "
        f"{achieved / floor['decode16_mlp_gflops']:.1%} of the decode-shaped floor"
    )
    if "decode16_mlp_packed_gflops" in floor:
        print(
            f"  (plain matmul / oneDNN packed: {floor['square_1024_plain_gflops']:.0f} / "
            f"{floor['square_1024_packed_gflops']:.0f} GFLOP/s at 1024^3, "
            f"{floor['decode16_mlp_plain_gflops']:.0f} / "
            f"{floor['decode16_mlp_packed_gflops']:.0f} decode-shaped)"
        )
    ceiling = results.get("torch_floor")
    if isinstance(ceiling, dict):
        sequential_rounds = [r["tokens_per_s"] for r in rounds.get("hf_sequential", [])]
        sequential = percentile(sequential_rounds, 50) if sequential_rounds else 0
        versus = (
            f" = {ceiling['ceiling_tokens_per_s'] / sequential:.1f}x HF sequential"
            if sequential
            else ""
        )
        print(
            f"plain-torch ceiling of this workload: {ceiling['ceiling_tokens_per_s']:.0f} tok/s"
            f"{versus} (decode step of {ceiling['batch']} at context "
            f"{ceiling['mean_decode_context']}: {ceiling['decode_step_ms']:.2f} ms, "
            f"{ceiling['decode_step_without_attention_ms']:.2f} ms without attention; prefill "
            f"{ceiling['prefill_tokens_per_s']:.0f} tok/s); kvgate reaches "
            f"{med / ceiling['ceiling_tokens_per_s']:.0%} of it"
        )
    shared = results.get("shared_prefix")
    if isinstance(shared, dict):
        for name, value in shared.items():
            print(
                f"shared prefix, {name}: TTFT cold {value['cold_ms']:.0f} ms, cached "
                f"{value['warm_ms']:.0f} ms ({value['cold_ms'] / value['warm_ms']:.1f}x)"
            )
