"""The per-row map around `LlamaDecoder`'s int8 matmuls, in one compiled call each way where a C compiler is at hand.

`LlamaDecoder` quantizes each matmul input row on its own range by mapping the row affinely onto [-1, 1] before
fbgemm's kernel and undoing the map after it (`_Linear._int8_matmul` says why). In eager torch that map is 12 small
ops around every matmul, 120 matmuls a decode step: a quarter of a batch-1 step on a 2-core AVX2 CPU, more than the
rest of the step's non-matmul work. Here each direction is one C loop, compiled on first use with the system's C
compiler (``cc``, ``-O3 -march=native -fopenmp-simd -ffp-contract=off``, `rapo_agents.policies.native`). The C
code performs the same IEEE float32 operations as the eager ops (the undo step is fused multiply-add, as torch's
``addcmul_`` is on AVX2); the vector lanes reorder only each row's minimum and maximum, which are exact in any
order. So both give bit-identical results on the same CPU;
``tests/rapo_agents/policies/test_unit_rows.py`` checks that. Where no compiler works (or ``RAPO_NATIVE=0``), the
eager ops run.

Example:
    >>> import torch
    >>> rows = torch.tensor([[0.0, 2.0, 4.0]])
    >>> unit, scales = to_unit_rows(rows)
    >>> unit.tolist(), scales.tolist()  # the fixed [1, -1, 0...] row first; (half range, centre) per row
    ([[1.0, -1.0, 0.0], [-1.0, 0.0, 1.0]], [[2.0, 2.0]])
    >>> identity = torch.eye(3)  # after the identity map (weight rows summing to 1), the rows come back
    >>> from_unit_rows(unit @ identity.T, scales, identity.sum(dim=1)).tolist()
    [[0.0, 2.0, 4.0]]
"""

from __future__ import annotations

import ctypes
import functools

import torch

from rapo_agents.policies.native import NATIVE_ENV_VAR, compiled_library

MIN_HALF_RANGE = 1e-12
"""The smallest half range a row is divided by (a constant row maps to 0 instead of dividing by 0)."""

_SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* unit[0] = [1, -1, 0, ...]; unit[1 + i] = clamp((rows[i] - centre_i) / half_i, -1, 1), with
   half_i = max((max_i - min_i) * 0.5, MIN_HALF) and centre_i = min_i + half_i; scales[i] = (half_i, centre_i). */
void to_unit_rows(const float* rows, float* unit, float* scales, int64_t m, int64_t k, float min_half) {
    for (int64_t j = 0; j < k; ++j) unit[j] = 0.0f;
    unit[0] = 1.0f;
    if (k > 1) unit[1] = -1.0f;
    for (int64_t i = 0; i < m; ++i) {
        const float* x = rows + i * k;
        float* u = unit + (i + 1) * k;
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
        scales[2 * i] = half;
        scales[2 * i + 1] = centre;
    }
}

/* In place on out[1 + i]: out * half_i, then + centre_i * weight_sums fused (torch's addcmul_). */
void from_unit_rows(float* out, const float* scales, const float* weight_sums, int64_t m, int64_t n) {
    for (int64_t i = 0; i < m; ++i) {
        float* o = out + (i + 1) * n;
        const float half = scales[2 * i], centre = scales[2 * i + 1];
        for (int64_t j = 0; j < n; ++j) o[j] = fmaf(centre, weight_sums[j], o[j] * half);
    }
}
"""

_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=off")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled loops (built once per source, flags and CPU), or None where they cannot be built or are off."""
    return compiled_library("unit_rows", _SOURCE, _FLAGS, {
        "to_unit_rows": (["pointer", "pointer", "pointer", "int64", "int64", "float"], "void"),
        "from_unit_rows": (["pointer", "pointer", "pointer", "int64", "int64"], "void")})


def native_available() -> bool:
    """Whether the compiled loops run here (else the eager torch ops do)."""
    return _library() is not None


def to_unit_rows(rows: torch.Tensor, native: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each row of float32 ``rows`` ``[m, k]`` onto [-1, 1], after a fixed ``[1, -1, 0, ...]`` row.

    Returns ``unit`` ``[m + 1, k]`` and ``scales`` ``[m, 2]`` (each row's half range and centre), which
    `from_unit_rows` needs. ``native`` None: the compiled loop where it is available.
    """
    library = _library() if native in (None, True) else None
    if native and library is None:
        raise RuntimeError(f"the compiled loops are not available here (a C compiler 'cc', {NATIVE_ENV_VAR} != 0)")
    m, k = rows.shape
    if library is None:
        low, high = torch.aminmax(rows, dim=-1, keepdim=True)
        half = (high - low).mul_(0.5).clamp_min_(MIN_HALF_RANGE)
        centre = low.add_(half)
        fixed = torch.zeros(1, k)
        fixed[0, :2] = torch.tensor([1.0, -1.0])[:k]
        # The clamp keeps a rounding overshoot (1 + 1 ulp) from widening the kernel's range for the whole batch.
        return torch.cat([fixed, (rows - centre).div_(half).clamp_(-1.0, 1.0)]), torch.cat([half, centre], dim=1)
    rows = rows.contiguous()
    unit, scales = torch.empty(m + 1, k), torch.empty(m, 2)
    library.to_unit_rows(rows.data_ptr(), unit.data_ptr(), scales.data_ptr(), m, k, MIN_HALF_RANGE)
    return unit, scales


def from_unit_rows(out: torch.Tensor, scales: torch.Tensor, weight_sums: torch.Tensor,
                   native: bool | None = None) -> torch.Tensor:
    """Undo `to_unit_rows` after a linear map: ``out`` ``[m + 1, n]`` (row 0 is the fixed row's) to ``[m, n]``.

    Row ``i`` becomes ``out[1 + i] * half_i + centre_i * weight_sums``, in place in ``out``; returns that view.
    """
    library = _library() if native in (None, True) else None
    if native and library is None:
        raise RuntimeError(f"the compiled loops are not available here (a C compiler 'cc', {NATIVE_ENV_VAR} != 0)")
    if library is None:
        return out[1:].mul_(scales[:, :1]).addcmul_(scales[:, 1:], weight_sums)
    m, n = out.shape[0] - 1, out.shape[1]
    if not (out.is_contiguous() and weight_sums.is_contiguous() and out.dtype == torch.float32):
        raise ValueError("from_unit_rows needs contiguous float32 outputs and weight sums")
    library.from_unit_rows(out.data_ptr(), scales.data_ptr(), weight_sums.data_ptr(), m, n)
    return out[1:]
