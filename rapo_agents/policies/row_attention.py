"""Attention whose result for a row depends on that row's own tokens alone: the int8 decoder's batch invariance.

The int8 matmuls give a row the same bits whatever else is in its batch (`LlamaDecoder`), but torch's attention
kernel does not: its sums run in blocks whose bounds move with the padding, the cache window and the number of
threads, so a row's last bits depend on which rows share its batch and on how its context was split into prefills
(docs/training.md, "A row in another batch"). Int8 rounding and greedy or sampled decoding turn a last-bit
difference into another token now and then, so rollouts depended on the batches that the tools' timing formed.

Here each query is computed by one thread, over its visible columns (the row's valid cache slots up to its own) in
increasing order, with sums in a fixed order of 16 lanes and an exponential written out in float32 operations
(no libm, no fused multiply-add): the same bits wherever the row sits in the cache, whatever the padding, batch,
window and threads, and whether its context came in one prefill or in several (tests). It is compiled on first
use (`rapo_agents.policies.native`); where no C compiler works, `LlamaDecoder` keeps torch's kernel and the
invariance does not hold. The fp32 decoder takes it too, for speed: a row reads only its own valid slots, in place
in the running cache's window, where torch's kernel reads every column of the window.

Example:
    >>> import torch
    >>> q, keys, values = torch.randn(1, 2, 1, 16), torch.randn(1, 1, 4, 16), torch.randn(1, 1, 4, 16)
    >>> valid = torch.tensor([[True, False, True, True]])  # slot 1 is a gap: never attended to
    >>> out = row_attention(q, keys, values, valid, start=3)
    >>> out is None or tuple(out.shape) == (1, 1, 32)  # [batch, seq, heads * dim]; None without a C compiler
    True
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from rapo_agents.policies.native import compiled_library

LANES = 16
"""The fixed number of partial sums in a dot product (the head dimension must be a multiple of it)."""

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16

/* e^x for x <= 0 (Cephes' polynomial), in plain float32 operations: the same bits at any vector width. The
   nearest integer comes from adding and subtracting 1.5 * 2^23 (floorf would keep the loop out of vector lanes). */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * (r * r) + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float power;
    memcpy(&power, &bits, sizeof power);
    return y * power;
}

/* Sixteen partial sums, then a fixed tree: the vector lanes of any width do the same operations. */
static inline float dot(const float* a, const float* b, int64_t dim) {
    float acc[LANES];
    for (int l = 0; l < LANES; ++l) acc[l] = 0.0f;
    for (int64_t i = 0; i < dim; i += LANES)
        for (int l = 0; l < LANES; ++l) acc[l] += a[i + l] * b[i + l];
    for (int width = LANES / 2; width > 0; width /= 2)
        for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
    return acc[0];
}

/* out[b, s, h] = sum over visible c of softmax_c(q[b, h, s] . k[b, h / groups, c] * scale) v[b, h / groups, c],
   visible: valid[b, c] and c <= start + s, in increasing c. A query at a padding slot gets zeros. Keys and values
   may be a window of a larger cache: rows and heads are row_stride and head_stride floats apart (the same for
   both), a slot's dim floats are contiguous, and valid's rows are valid_stride bytes apart. */
void row_attention(const float* q, const float* keys, const float* values, const uint8_t* valid, float* out,
                   int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq, int64_t dim,
                   int64_t row_stride, int64_t head_stride, int64_t valid_stride,
                   int64_t start, float scale, int threads) {
    const int64_t groups = heads / kv_heads;
    #pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t h = 0; h < heads; ++h) {
            float* weights = malloc((size_t)(start + seq) * sizeof(float));  /* not a VLA: those do not vectorize */
            const uint8_t* slots = valid + b * valid_stride;
            const float* k = keys + b * row_stride + (h / groups) * head_stride;
            const float* v = values + b * row_stride + (h / groups) * head_stride;
            for (int64_t s = 0; s < seq; ++s) {
                const float* query = q + ((b * heads + h) * seq + s) * dim;
                float* o = out + ((b * seq + s) * heads + h) * dim;
                for (int64_t d = 0; d < dim; ++d) o[d] = 0.0f;
                const int64_t last = start + s;
                if (!slots[last]) continue;
                float high = -INFINITY;
                for (int64_t c = 0; c <= last; ++c) {
                    weights[c] = slots[c] ? dot(query, k + c * dim, dim) * scale : -INFINITY;
                    high = weights[c] > high ? weights[c] : high;
                }
                /* Branch-free, so that the exponentials run in vector lanes; a gap's weight is exactly 0. */
                float partial[LANES];
                for (int l = 0; l < LANES; ++l) partial[l] = 0.0f;
                const int64_t count = last + 1;
                for (int64_t c = 0; c < count; ++c) {
                    const float e = exp_nonpositive(weights[c] - high);
                    weights[c] = slots[c] ? e : 0.0f;
                }
                for (int64_t c = 0; c + LANES <= count; c += LANES)
                    for (int l = 0; l < LANES; ++l) partial[l] += weights[c + l];
                for (int64_t c = count - count % LANES; c < count; ++c) partial[c % LANES] += weights[c];
                for (int width = LANES / 2; width > 0; width /= 2)
                    for (int l = 0; l < width; ++l) partial[l] += partial[l + width];
                const float total = partial[0];
                for (int64_t c = 0; c < count; ++c) {
                    if (!slots[c]) continue;
                    const float w = weights[c];
                    const float* vc = v + c * dim;
                    for (int64_t d = 0; d < dim; ++d) o[d] += w * vc[d];
                }
                for (int64_t d = 0; d < dim; ++d) o[d] /= total;
            }
            free(weights);
        }
    }
}
"""

_FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off")
_SIGNATURES = {"row_attention": (["pointer"] * 5 + ["int64"] * 9 + ["float", "int"], "void")}


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel (built once per source, flags and CPU), or None where it cannot be built or is off."""
    return compiled_library("row_attention", _SOURCE, _FLAGS, _SIGNATURES)


def row_attention_available(head_dim: int) -> bool:
    """Whether the compiled kernel runs here for heads of ``head_dim`` (a multiple of `LANES`)."""
    return head_dim % LANES == 0 and _library() is not None


def row_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                  start: int) -> torch.Tensor | None:
    """Attention of float32 queries ``q`` ``[batch, heads, seq, dim]`` written at cache slots ``start..start+seq``.

    ``keys`` and ``values`` are one layer's cache, ``[batch, kv_heads, capacity, dim]``; ``valid``
    ``[batch, capacity]`` marks the slots holding real tokens (a query sees the valid slots up to its own, and a
    query at an invalid slot gets zeros). Returns ``[batch, seq, heads * dim]``, or None where the kernel is not
    available (`row_attention_available`).
    """
    library = _library()
    batch, heads, seq, dim = q.shape
    kv_heads, capacity = keys.shape[1], keys.shape[2]
    if library is None or dim % LANES:
        return None
    if heads % kv_heads or start + seq > capacity:
        raise ValueError(f"{heads} query heads over {kv_heads} KV heads, slots {start}..{start + seq} of "
                         f"{capacity}: heads must group evenly and the slots fit the cache")
    if any(t.dtype != torch.float32 for t in (q, keys, values)) or valid.dtype != torch.bool:
        raise ValueError("row_attention needs float32 queries, keys and values and a bool valid mask")
    # A decode step reads a window of the running cache: the kernel walks its strides, since copying the window
    # out (as .contiguous() would, every layer) cost several times the attention itself.
    if keys.stride() != values.stride() or keys.stride()[2:] != (dim, 1):
        keys, values = keys.contiguous(), values.contiguous()
    q, slots = q.contiguous(), (valid if valid.stride(1) == 1 else valid.contiguous())
    out = torch.empty(batch, seq, heads * dim)
    library.row_attention(q.data_ptr(), keys.data_ptr(), values.data_ptr(), slots.data_ptr(),
                          out.data_ptr(), batch, heads, kv_heads, seq, dim, keys.stride(0), keys.stride(1),
                          slots.stride(0), start, 1.0 / math.sqrt(dim), torch.get_num_threads())
    return out
