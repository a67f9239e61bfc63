"""The generation benchmark's pure logic (not its timings): the CPU facts it prints and the bytes per token of the
bandwidth-bound limit, read from the decoder's own storage."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu sse sse2 avx f16c fma bmi2 avx2 sha_ni

processor\t: 1
model name\t: another one
flags\t\t: avx512f avx512_vnni amx_int8
"""


@pytest.fixture(scope="module")
def generation():
    sys.path.insert(0, str(BENCHMARKS))  # the script imports its siblings _report and _rounds
    spec = importlib.util.spec_from_file_location("generation_benchmark", BENCHMARKS / "generation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))


def test_cpuinfo_gives_the_first_processors_model_and_isa(generation):
    assert generation.parse_cpuinfo(ZEN3) == {"model": "AMD EPYC 7B13 64-Core Processor", "isa": ["AVX2"]}
    sapphire = "model name\t: Xeon\nflags\t\t: avx2 avx512f avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_int8\n"
    assert generation.parse_cpuinfo(sapphire)["isa"] == ["AVX2", "AVX-512", "AVX-512 VNNI", "AVX-VNNI",
                                                         "AVX-512 BF16", "AMX-BF16", "AMX-INT8"]
    assert generation.parse_cpuinfo("") == {"model": "unknown", "isa": []}


def tiny_decoder(weight_format: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapo_agents.policies.llama_decoder import LlamaDecoder

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return LlamaDecoder.from_hf(LlamaForCausalLM(config).eval(), weight_format=weight_format)


# Per layer: qkv (4 + 2 * 2 heads of 8) x 32, o 32 x 32, gate_up 96 x 32, down 32 x 48; then the lm_head 64 x 32.
MATMUL_WEIGHTS = 2 * (64 * 32 + 32 * 32 + 96 * 32 + 32 * 48) + 64 * 32


def test_fp32_bytes_per_token_are_every_weight_a_step_reads(generation):
    streamed = generation.decode_bytes_per_token(tiny_decoder("fp32"))
    norms = 2 * 2 * 32 + 32  # two per layer and the final one
    assert streamed["by_dtype"] == {"float32": 4 * (MATMUL_WEIGHTS + norms + 32)}  # + one embedding row
    assert streamed["total"] == 4 * (MATMUL_WEIGHTS + norms + 32)
    assert streamed["kv_bytes_per_context_token"] == 2 * 2 * 2 * 8 * 4  # keys and values, 2 layers, 2 heads of 8


@pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="int8 needs fbgemm")
def test_int8_bytes_per_token_count_the_packed_payload_once(generation):
    streamed = generation.decode_bytes_per_token(tiny_decoder("int8"))
    assert streamed["by_dtype"]["qint8"] == MATMUL_WEIGHTS  # one byte a weight, the lm_head included
    assert streamed["total"] == sum(streamed["by_dtype"].values()) > MATMUL_WEIGHTS  # norms and row sums stay float

