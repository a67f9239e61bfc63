"""The per-row map around `LlamaDecoder`'s int8 matmuls, in one compiled call each way where a C compiler is at hand.

`LlamaDecoder` quantizes each matmul input row on its own range by mapping the row affinely onto [-1, 1] before
fbgemm's kernel and undoing the map after it (`_Linear._int8_matmul` says why). In eager torch that map is 12 small
ops around every matmul, 120 matmuls a decode step: a quarter of a batch-1 step on a 2-core AVX2 CPU, more than the
rest of the step's non-matmul work. Here each direction is one C loop, compiled on first use with the system's C
compiler (``cc``, ``-O3 -march=native -fopenmp-simd -ffp-contract=off``) into ``$RAPO_CACHE_DIR/native`` and called
through ``ctypes``. The C code performs the same IEEE float32 operations as the eager ops (the undo step is fused
multiply-add, as torch's ``addcmul_`` is on AVX2); the vector lanes reorder only each row's minimum and maximum,
which are exact in any order. So both give bit-identical results on the same CPU;
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
import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

NATIVE_ENV_VAR = "RAPO_NATIVE"
"""Set to ``0`` to run the eager torch ops instead of the compiled loops (the results are the same)."""

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

_FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-ffp-contract=off", "-shared", "-fPIC")


def _cpu_key() -> str:
    """What the compiled code depends on besides its source: the CPU (``-march=native``) and the platform."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            lines = [line for line in cpuinfo.read().splitlines() if line.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [platform.processor()]
    return "\n".join([platform.machine(), platform.system(), *lines])


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled loops (built once per source, flags and CPU), or None where they cannot be built or are off."""
    if os.environ.get(NATIVE_ENV_VAR, "1") == "0" or platform.system() != "Linux":
        return None
    from rapo_tools.cache import rapo_cache_dir

    digest = hashlib.sha256("\n".join([_SOURCE, *_FLAGS, _cpu_key()]).encode()).hexdigest()[:16]
    target = rapo_cache_dir("native", f"unit_rows-{digest}.so")
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
                source, built = Path(scratch, "unit_rows.c"), Path(scratch, "unit_rows.so")
                source.write_text(_SOURCE)
                subprocess.run(["cc", *_FLAGS, str(source), "-o", str(built), "-lm"], check=True,
                               capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: a second process building at once keeps either copy
        library = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError):
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.to_unit_rows.argtypes = [pointer, pointer, pointer, size, size, ctypes.c_float]
    library.from_unit_rows.argtypes = [pointer, pointer, pointer, size, size]
    library.to_unit_rows.restype = library.from_unit_rows.restype = None
    return library


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
