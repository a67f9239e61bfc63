"""The per-row map around the int8 matmuls: what it computes, and that the compiled loops and the eager ops agree bit
for bit (so a machine without a C compiler decodes the same tokens)."""

from __future__ import annotations

import pytest
import torch

from rapo_agents.policies import unit_rows
from rapo_agents.policies.llama_decoder import _Linear
from rapo_agents.policies.unit_rows import (
    from_unit_rows,
    native_available,
    on_kernel_grid,
    to_unit_rows,
)

needs_native = pytest.mark.skipif(not native_available(), reason="no C compiler ('cc') builds the compiled loops here")


def hostile_rows(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows of very different scales and offsets, one constant row and one with a single outlier."""
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(m, k, generator=generator) * (1 + 50 * torch.rand(m, 1, generator=generator))
    rows += 10 * torch.randn(m, 1, generator=generator)
    rows[0] = 3.0
    if m > 1:
        rows[1, k // 2] = 1e4
    return rows


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)])
def test_each_row_and_its_residual_map_onto_minus_one_to_one_after_the_fixed_row(native):
    rows = hostile_rows(5, 64, seed=0)
    unit, scales = to_unit_rows(rows, native=native)
    assert unit.shape == (11, 64) and scales.shape == (10, 2)
    assert unit[0, :2].tolist() == [1.0, -1.0] and not unit[0, 2:].any()
    assert unit.abs().max() <= 1.0
    for i in range(1, 5):  # the constant row 0 has no range to span; the centre's rounding may cost an ulp
        for mapped in (unit[1 + i], unit[6 + i]):
            assert mapped.min() <= -1.0 + 1e-6 and mapped.max() >= 1.0 - 1e-6
    assert not unit[1].any()  # a constant row maps to 0 (its half range is the floor, not 0)
    half, centre = scales[:5, :1], scales[:5, 1:]
    assert torch.allclose(unit[1:6] * half + centre, rows, rtol=1e-5, atol=1e-5 * rows.abs().max())
    on_grid = on_kernel_grid(unit[1:6]) * half + centre
    residual_half, residual_centre = scales[5:, :1], scales[5:, 1:]
    assert torch.allclose(unit[6:] * residual_half + residual_centre, rows - on_grid, rtol=1e-5,
                          atol=1e-5 * (rows - on_grid).abs().max())


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_native)])
def test_the_undo_after_a_linear_map_gives_the_matmul_of_the_original_rows(native):
    rows, weight = hostile_rows(4, 32, seed=1), torch.randn(16, 32, dtype=torch.float64)
    unit, scales = to_unit_rows(rows, native=native)
    out = (on_kernel_grid(unit).double() @ weight.T).float()
    result = from_unit_rows(out, scales, weight.sum(dim=1).float(), native=native)
    assert result.shape == (4, 16)
    expected = rows.double() @ weight.T
    # Rounded twice to 7 bits: about 14 bits of each row's range (the outlier row's is 1e4 wide).
    assert torch.allclose(result.double(), expected, rtol=1e-4, atol=1e-3 * expected.abs().max())


def test_the_residual_rows_take_the_kernels_rounding_error_down_more_than_tenfold():
    rows = hostile_rows(6, 576, seed=2)[2:]  # the rows with a range to round
    linear = _Linear(torch.randn(64, 576), "int8")  # the decoder's packed int8 weights
    packed, weight_sums = linear.weight, linear.weight_sums
    dequantized = torch.ops.quantized.linear_unpack(packed)[0].dequantize()
    expected = rows.double() @ dequantized.double().T  # what the int8 weights give exact inputs
    unit, unit_scales = to_unit_rows(rows)
    out = torch.ops.quantized.linear_dynamic(unit, packed, True)
    m = rows.shape[0]
    one_pass = out[1:1 + m] * unit_scales[:m, :1] + unit_scales[:m, 1:] * weight_sums
    two_pass = from_unit_rows(out.clone(), unit_scales, weight_sums)
    one_pass_error, two_pass_error = ((result.double() - expected).abs().mean() for result in (one_pass, two_pass))
    assert two_pass_error < one_pass_error / 10


@needs_native
@pytest.mark.parametrize(("m", "k", "n"), [(1, 576, 960), (8, 576, 3072), (37, 1536, 576), (3, 576, 49152),
                                           (2, 1, 3), (3, 2, 5), (5, 19, 23)])
def test_the_compiled_loops_agree_with_the_eager_ops_bit_for_bit(m, k, n):
    for seed in range(4):
        rows = hostile_rows(m, k, seed)
        (eager_unit, eager_scales), (native_unit, native_scales) = (to_unit_rows(rows, native=flag)
                                                                    for flag in (False, True))
        assert torch.equal(eager_unit, native_unit) and torch.equal(eager_scales, native_scales)
        out, weight_sums = torch.randn(1 + 2 * m, n), torch.randn(n)
        assert torch.equal(from_unit_rows(out.clone(), eager_scales, weight_sums, native=False),
                           from_unit_rows(out.clone(), native_scales, weight_sums, native=True))


def test_without_a_compiler_the_eager_ops_run_and_asking_for_the_loops_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no 'cc' to be found
    monkeypatch.setenv("RAPO_CACHE_DIR", str(tmp_path / "cache"))  # and no earlier build to load
    unit_rows._library.cache_clear()
    try:
        assert not native_available()
        unit, scales = to_unit_rows(torch.tensor([[0.0, 2.0, 4.0]]))
        assert unit[1].tolist() == [-1.0, 0.0, 1.0]
        with pytest.raises(RuntimeError, match="C compiler"):
            to_unit_rows(torch.ones(1, 3), native=True)
    finally:
        unit_rows._library.cache_clear()


def test_rapo_native_0_turns_the_loops_off(monkeypatch):
    monkeypatch.setenv("RAPO_NATIVE", "0")
    unit_rows._library.cache_clear()
    try:
        assert not native_available()
    finally:
        unit_rows._library.cache_clear()
