"""benchmarks/lm_throughput.py's model FLOPs utilisation: the device peaks by name, and the MFU line's arithmetic."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import lm_throughput
from structbench.tasks.language import configs

LLAMA_60M = {
    "model_config": dataclasses.asdict(configs.resolve_config("llama-60m", seq_len=256)),
    "vocab_size": 32_000,
    "seq_len": 256,
    "autocast": "bf16",
}
"""What a llama-60m run's spec holds as `task_args_resolved` (the parts the MFU reads)."""


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H200", 989.5e12),
        ("NVIDIA H100 80GB HBM3", 989.5e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_the_dense_bf16_peak_is_half_the_datasheets_sparse_figure(name: str, peak: float | None) -> None:
    assert lm_throughput.peak_bf16_flops(name) == peak


def test_mfu_is_model_flops_times_tokens_per_second_over_the_peak() -> None:
    """570,000 tokens/s of llama-60m (262,668,288 FLOPs per token, test_language_models) on an H200: 149.72 TFLOP/s,
    15.1% of 989.5."""
    per_token = configs.training_flops_per_token(configs.resolve_config("llama-60m", seq_len=256), 32_000, 256)
    assert per_token == 262_668_288
    line = lm_throughput.utilisation(570_000, LLAMA_60M, "NVIDIA H200")
    assert f"{per_token * 570_000 / 1e12:.2f} TFLOP/s" in line and "149.72 TFLOP/s" in line
    assert "MFU 15.1% of NVIDIA H200's dense BF16 peak 990 TFLOP/s" in line


def test_no_mfu_without_bf16_autocast_or_a_known_peak() -> None:
    off = lm_throughput.utilisation(1_000, {**LLAMA_60M, "autocast": "off"}, "NVIDIA H200")
    assert "no MFU: autocast off" in off
    unknown = lm_throughput.utilisation(1_000, LLAMA_60M, "AMD EPYC")
    assert "no MFU: AMD EPYC's BF16 peak is not in the table" in unknown
