"""The per-row map around `LlamaDecoder`'s int8 matmuls, in one compiled call each way where a C compiler is at hand.

`LlamaDecoder` quantizes each matmul input row on its own range by mapping the row affinely onto [-1, 1] before
fbgemm's kernel and undoing the map after it (`_Linear._int8_matmul` says why). The kernel rounds each mapped value
to a 7-bit grid (`KERNEL_STEP`); what that rounding loses (the row's residual) goes through the same matmul as a
second row, on its own range, and the two results are added: 14-bit activations at the cost of twice the rows
(fbgemm's kernel is bound by arithmetic from a few rows on, so about 15% of a batch-1 decode step and a third at
batch 16). That cut the teacher-forced log-prob error of the embedded model
about threefold and brought its greedy held-out accuracy level with float32 (`docs/training.md`).

In eager torch the map is a dozen small ops around every matmul, 120 matmuls a decode step: a quarter of a batch-1
step on a 2-core AVX2 CPU, more than the rest of the step's non-matmul work. Here each direction is one C loop,
compiled on first use with the system's C compiler (``cc``, ``-O3 -march=native -fopenmp-simd -ffp-contract=off``,
`rapo_agents.policies.native`). The C code performs the same IEEE float32 operations as the eager ops (the undo
step is fused multiply-add, as torch's ``addcmul_`` is on AVX2; rounding to the grid is round-half-to-even, as
``torch.round`` is); the vector lanes reorder only each row's minimum and maximum, which are exact in any order. So
both give bit-identical results on the same CPU; ``tests/rapo_agents/policies/test_unit_rows.py`` checks that.
Where no compiler works (or ``RAPO_NATIVE=0``), the eager ops run.

Example:
    >>> import torch
    >>> rows = torch.tensor([[0.0, 2.0, 4.0]])
    >>> unit, scales = to_unit_rows(rows)  # the fixed [1, -1, 0...] row, the row mapped, then its residual mapped
    >>> unit[:2].tolist(), unit.shape, scales.shape
    ([[1.0, -1.0, 0.0], [-1.0, 0.0, 1.0]], torch.Size([3, 3]), torch.Size([2, 2]))
    >>> on_grid = on_kernel_grid(unit)  # as the kernel rounds its input
    >>> identity = torch.eye(3)  # after the identity map (weight rows summing to 1), the rows come back
    >>> [round(value, 3) for value in from_unit_rows(on_grid @ identity.T, scales, identity.sum(dim=1))[0].tolist()]
    [0.0, 2.0, 4.0]
"""

from __future__ import annotations

import ctypes
import functools

import torch

from rapo_agents.policies.native import NATIVE_ENV_VAR, compiled_library

MIN_HALF_RANGE = 1e-12
"""The smallest half range a row is divided by (a constant row maps to 0 instead of dividing by 0)."""

KERNEL_STEP = float(torch.tensor(2.0 / 127.0, dtype=torch.float32))
"""The grid step fbgemm's 7-bit (``reduce_range``) input quantization takes over [-1, 1]: its scale, in float32."""

KERNEL_STEP_INVERSE = float(1.0 / torch.tensor(KERNEL_STEP, dtype=torch.float32))
"""``1 / KERNEL_STEP`` in float32, as fbgemm multiplies by it (a mapped value ``u`` lands on ``round(u / step)``)."""

_SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* u = clamp((x - centre) / half, -1, 1) with half = max((max - min) * 0.5, MIN_HALF) and centre = min + half;
   scale = (half, centre). In place is allowed (u == x). */
static void map_row(const float* x, float* u, float* scale, int64_t k, float min_half) {
    float low = x[0], high = x[0];
    /* Minimum and maximum are exact in any order, so the reduction may run in vector lanes. */
    #pragma omp simd reduction(min:low) reduction(max:high)
    for (int64_t j = 1; j < k; ++j) {
        low = x[j] < low ? x[j] : low;
        high = x[j] > high ? x[j] : high;
    }
    float half = (high - low) * 0.5f;
    half = half < min_half ? min_half : half;
    float centre = low + half;
    for (int64_t j = 0; j < k; ++j) {
        float v = (x[j] - centre) / half;
        v = v < -1.0f ? -1.0f : v;
        u[j] = v > 1.0f ? 1.0f : v;
    }
    scale[0] = half;
    scale[1] = centre;
}

/* unit[0] = [1, -1, 0, ...]; unit[1 + i] = the map of rows[i]; unit[1 + m + i] = the map of its residual
   rows[i] - (round(unit[1 + i] * inverse_step) * step * half_i + centre_i); scales[i] and scales[m + i]. */
void to_unit_rows(const float* rows, float* unit, float* scales, int64_t m, int64_t k, float min_half,
                  float step, float inverse_step) {
    for (int64_t j = 0; j < k; ++j) unit[j] = 0.0f;
    unit[0] = 1.0f;
    if (k > 1) unit[1] = -1.0f;
    for (int64_t i = 0; i < m; ++i) {
        const float* x = rows + i * k;
        float* u = unit + (i + 1) * k;
        float* r = unit + (m + i + 1) * k;
        map_row(x, u, scales + 2 * i, k, min_half);
        const float half = scales[2 * i], centre = scales[2 * i + 1];
        for (int64_t j = 0; j < k; ++j) r[j] = x[j] - (nearbyintf(u[j] * inverse_step) * step * half + centre);
        map_row(r, r, scales + 2 * (m + i), k, min_half);
    }
}

/* out[1 + i] = (out[1 + i] * half_i + centre_i * weight_sums, fused) + (the same for out[1 + m + i]). */
void from_unit_rows(float* out, const float* scales, const float* weight_sums, int64_t m, int64_t n) {
    for (int64_t i = 0; i < m; ++i) {
        float* o = out + (i + 1) * n;
        const float* r = out + (m + i + 1) * n;
        const float half = scales[2 * i], centre = scales[2 * i + 1];
        const float residual_half = scales[2 * (m + i)], residual_centre = scales[2 * (m + i) + 1];
        for (int64_t j = 0; j < n; ++j)
            o[j] = fmaf(centre, weight_sums[j], o[j] * half)
                   + fmaf(residual_centre, weight_sums[j], r[j] * residual_half);
    }
}
"""

_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=off")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled loops (built once per source, flags and CPU), or None where they cannot be built or are off."""
    return compiled_library("unit_rows", _SOURCE, _FLAGS, {
        "to_unit_rows": (["pointer", "pointer", "pointer", "int64", "int64", "float", "float", "float"], "void"),
        "from_unit_rows": (["pointer", "pointer", "pointer", "int64", "int64"], "void")})


def native_available() -> bool:
    """Whether the compiled loops run here (else the eager torch ops do)."""
    return _library() is not None


def _loaded(native: bool | None) -> ctypes.CDLL | None:
    """The compiled loops where ``native`` allows them (None: where available; True: required), else None."""
    library = _library() if native in (None, True) else None
    if native and library is None:
        raise RuntimeError(f"the compiled loops are not available here (a C compiler 'cc', {NATIVE_ENV_VAR} != 0)")
    return library


def on_kernel_grid(unit: torch.Tensor) -> torch.Tensor:
    """Mapped values rounded as fbgemm's 7-bit input quantization rounds them (round half to even)."""
    return (unit * KERNEL_STEP_INVERSE).round_().mul_(KERNEL_STEP)


def _eager_map(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`to_unit_rows`' map of each row alone, in torch ops: ``(unit rows, [half range, centre] per row)``."""
    low, high = torch.aminmax(rows, dim=-1, keepdim=True)
    half = (high - low).mul_(0.5).clamp_min_(MIN_HALF_RANGE)
    centre = low.add_(half)
    # The clamp keeps a rounding overshoot (1 + 1 ulp) from widening the kernel's range for the whole batch.
    return (rows - centre).div_(half).clamp_(-1.0, 1.0), torch.cat([half, centre], dim=1)


def to_unit_rows(rows: torch.Tensor, native: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each float32 row of ``rows`` ``[m, k]``, then its residual, onto [-1, 1], after a fixed ``[1, -1, 0...]``.

    Returns ``unit`` ``[1 + 2m, k]`` (the fixed row, the ``m`` rows, their ``m`` residuals) and ``scales``
    ``[2m, 2]`` (each mapped row's half range and centre), which `from_unit_rows` needs. A row's residual is what
    the kernel's rounding of its mapped values to `KERNEL_STEP` loses. ``native`` None: the compiled loop where it
    is available.
    """
    library = _loaded(native)
    m, k = rows.shape
    if library is None:
        unit, scales = _eager_map(rows)
        approx = on_kernel_grid(unit).mul_(scales[:, :1]).add_(scales[:, 1:])
        residual_unit, residual_scales = _eager_map(rows - approx)
        fixed = torch.zeros(1, k)
        fixed[0, :2] = torch.tensor([1.0, -1.0])[:k]
        return torch.cat([fixed, unit, residual_unit]), torch.cat([scales, residual_scales])
    rows = rows.contiguous()
    unit, scales = torch.empty(1 + 2 * m, k), torch.empty(2 * m, 2)
    library.to_unit_rows(rows.data_ptr(), unit.data_ptr(), scales.data_ptr(), m, k, MIN_HALF_RANGE, KERNEL_STEP,
                         KERNEL_STEP_INVERSE)
    return unit, scales


def from_unit_rows(out: torch.Tensor, scales: torch.Tensor, weight_sums: torch.Tensor,
                   native: bool | None = None) -> torch.Tensor:
    """Undo `to_unit_rows` after a linear map: ``out`` ``[1 + 2m, n]`` (row 0 is the fixed row's) to ``[m, n]``.

    Row ``i`` becomes ``out[1 + i] * half_i + centre_i * weight_sums`` plus the same of its residual's row
    ``out[1 + m + i]``, in place in ``out``; returns that view.
    """
    library = _loaded(native)
    m, n = (out.shape[0] - 1) // 2, out.shape[1]
    if library is None:
        residual = out[1 + m:].mul_(scales[m:, :1]).addcmul_(scales[m:, 1:], weight_sums)
        return out[1:1 + m].mul_(scales[:m, :1]).addcmul_(scales[:m, 1:], weight_sums).add_(residual)
    if not (out.is_contiguous() and weight_sums.is_contiguous() and out.dtype == torch.float32):
        raise ValueError("from_unit_rows needs contiguous float32 outputs and weight sums")
    library.from_unit_rows(out.data_ptr(), scales.data_ptr(), weight_sums.data_ptr(), m, n)
    return out[1:1 + m]
