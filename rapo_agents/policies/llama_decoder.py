"""`LlamaDecoder`: a compact inference copy of a Llama-family causal LM with a static KV cache.

What makes it faster than ``transformers`` decoding on a CPU, step by step (measured in
``benchmarks/generation.py``): fused QKV and gate/up matmuls (3 matmuls a layer instead of 7),
bfloat16 weights where the CPU has native bf16 dot products (half the memory traffic of a
bandwidth-bound mat-vec), a KV cache written in place instead of concatenated every step, and
one plain function per step instead of the module tree's hooks, kwargs and cache objects.

The residual stream, RMSNorm, softmax and the logits stay float32, so log-probs drift only by
the bf16 rounding of the matmul inputs (``logprob_max_abs_diff`` in the benchmark). Only the
architectures whose forward this file reproduces exactly are accepted (`check_supported`).

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                      num_attention_heads=4, num_key_value_heads=2)
    >>> decoder = LlamaDecoder.from_hf(LlamaForCausalLM(config).eval(), weight_format="fp32")
    >>> cache = decoder.new_cache(batch=1, capacity=8)
    >>> logits = decoder.forward(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]), cache, 0,
    ...                          torch.ones(1, 3, dtype=torch.bool))
    >>> tuple(logits.shape)
    (1, 64)
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from rapo_agents.lora import merged_weights
from rapo_agents.policies.row_attention import row_attention, row_attention_available
from rapo_agents.policies.unit_rows import from_unit_rows, to_unit_rows

SUPPORTED_MODEL_TYPES = ("llama",)


def check_supported(config: Any) -> None:
    """Raise ValueError unless ``config`` describes a model this decoder reproduces (Llama, default RoPE, no biases)."""
    problems = []
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model_type {getattr(config, 'model_type', None)!r} is not one of {SUPPORTED_MODEL_TYPES}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        problems.append(f"rope_type {rope.get('rope_type')!r} is not 'default'")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        problems.append("attention or MLP biases")
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.hidden_act!r} is not 'silu'")
    if problems:
        raise ValueError("LlamaDecoder cannot run this model: " + "; ".join(problems))


def cpu_has_bf16() -> bool:
    """True when this CPU has native bf16 dot products (AVX512-BF16 or AMX), where bf16 matmuls pay."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = cpuinfo.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


WEIGHT_FORMATS = ("int8", "bf16", "fp32")
"""How `LlamaDecoder` stores its matmul weights: ``int8`` (per-channel int8 weights, dynamically quantized
activations, fbgemm kernels: a quarter of fp32's memory traffic), ``bf16`` or ``fp32``."""


def default_weight_format(device: torch.device) -> str:
    """int8 on CPUs with the quantized kernels, else bf16 where the CPU has bf16 dot products, else fp32."""
    if device.type != "cpu":
        return "bf16"
    if "fbgemm" in torch.backends.quantized.supported_engines:
        return "int8"
    return "bf16" if cpu_has_bf16() else "fp32"


SMOOTHED_INPUTS = ("self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj")
"""The matmul inputs of each layer whose channel maxima SmoothQuant uses (plus the model's ``lm_head``)."""


class _Linear:
    """One bias-free matmul ``x @ weight.T`` in a `WEIGHT_FORMATS` storage; float32 (or bf16) in, float32 out."""

    def __init__(self, weight: torch.Tensor, weight_format: str):
        self.format = weight_format
        if weight_format == "int8":
            weight = weight.float()
            scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            zeros = torch.zeros(weight.shape[0], dtype=torch.long)
            with warnings.catch_warnings():  # quantized tensors are deprecated, but fbgemm's kernels are the fastest
                warnings.simplefilter("ignore", UserWarning)
                quantized = torch.quantize_per_channel(weight, scales.double(), zeros, 0, torch.qint8)
            self.weight = torch.ops.quantized.linear_prepack(quantized, None)
            self.weight_sums = quantized.dequantize().sum(dim=1)  # what the centring subtracted, added back
        else:
            self.weight = weight.to(torch.bfloat16 if weight_format == "bf16" else torch.float32).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.format == "int8":
            shape = x.shape
            out = self._int8_matmul(x.float().reshape(-1, shape[-1]))
            return out.view(*shape[:-1], out.shape[-1])
        return F.linear(x.to(self.weight.dtype), self.weight).float()

    def _int8_matmul(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows @ weight.T`` with each row quantized on its own range to 7 bits, exact on every ISA.

        fbgemm's dynamic kernel quantizes its whole input with one range, so a row's result depended on the other
        rows of the batch (and a prompt's on how it was split into prefill chunks). Each row is mapped affinely onto
        [-1, 1] first and a fixed [-1, 1] row joins the input (`to_unit_rows`), so the kernel's range is that of every
        row: each row gets its own 255-level grid (finer than one shared grid, where an outlier token set it for all)
        whatever else is in the batch, and the map is undone exactly after the (linear) matmul (`from_unit_rows`).

        ``reduce_range`` (7-bit activations): without VNNI (AVX2, plain AVX-512), fbgemm adds pairs of u8 x s8
        products in saturating int16 lanes; 255 * 127 * 2 overflows them, 127 * 128 * 2 cannot. With 8 bits an
        AVX2 CPU gave other greedy tokens than a VNNI one from the first token on (``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``
        reproduces that path on a VNNI CPU); with 7 bits the int32 sums are exact and the outputs identical.

        Each row's residual (what rounding to the 7-bit grid loses) joins the input as a second row on its own
        range, and the two results are added (`to_unit_rows`): 14-bit activations for twice the rows. One pass
        left the embedded model 0.11 below float32 in greedy held-out accuracy, outside the interval.
        """
        unit, scales = to_unit_rows(rows)  # one compiled loop each way where a C compiler is at hand
        return from_unit_rows(torch.ops.quantized.linear_dynamic(unit, self.weight, True), scales, self.weight_sums)


@dataclasses.dataclass
class _Layer:
    input_norm: torch.Tensor
    qkv: _Linear  # [(heads + 2 kv_heads) * head_dim, hidden]
    o: _Linear
    post_norm: torch.Tensor
    gate_up: _Linear  # [2 * intermediate, hidden]
    down: _Linear


@dataclasses.dataclass
class KVCache:
    """Keys and values of every layer, written in place: ``[layers, batch, kv_heads, capacity, head_dim]`` each."""

    keys: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor
    """``[batch, capacity]``: which cache slots hold a real (not padding) token."""
    padded: bool = True
    """Whether any row has padding slots (set by the prefill); False lets decode steps skip the mask."""

    @property
    def capacity(self) -> int:
        """Token slots per row."""
        return self.valid.shape[1]

    def keep(self, rows: list[int]) -> tuple[KVCache, list[int]]:
        """The cache of the given batch rows only (finished rows leave the batch), in its first ``len(rows)`` rows.

        Each kept row past them moves into the slot of a row that left, so only those rows are copied (a gather
        of the kept rows copied the whole cache each time a row finished: 12% of a held-out evaluation). This
        cache's rows are rearranged in place; returns the new cache (a view of this one's first rows) and the old
        row of each of its rows.
        """
        count = len(rows)
        kept = set(rows)
        order = list(range(count))
        holes = [row for row in order if row not in kept]
        movers = [row for row in rows if row >= count]
        for hole, mover in zip(holes, movers, strict=True):
            order[hole] = mover
        if movers:
            source, target = (torch.tensor(part, device=self.keys.device) for part in (movers, holes))
            self.keys[:, target] = self.keys[:, source]
            self.values[:, target] = self.values[:, source]
            self.valid[target] = self.valid[source]
        return KVCache(self.keys[:, :count], self.values[:, :count], self.valid[:count], self.padded), order

    def grow(self, slots: int) -> KVCache:
        """A copy with ``slots`` more (empty) token slots per row."""
        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros(*x.shape[:3], slots, x.shape[4])], dim=3)

        return KVCache(pad(self.keys), pad(self.values),
                       torch.cat([self.valid, self.valid.new_zeros(self.valid.shape[0], slots)], dim=1), self.padded)

    def place(self, row: int, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write stored ``keys`` and ``values`` (``[layers, kv_heads, tokens, head_dim]``) of one row from ``slot`` on.

        Their RoPE is already applied at their own positions, so they may sit anywhere before the row's next
        tokens: the slots between stay invalid, and `LlamaDecoder.forward` masks them like padding.
        """
        end = slot + keys.shape[2]
        self.keys[:, row, :, slot:end] = keys
        self.values[:, row, :, slot:end] = values
        self.valid[row, slot:end] = True

    def row_kv(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of one row's keys and values at its valid slots in order: ``[layers, kv_heads, tokens, head_dim]``."""
        valid = self.valid[row]
        return self.keys[:, row][:, :, valid], self.values[:, row][:, :, valid]


class LlamaDecoder:
    """Inference weights of a Llama-family model, packed for decoding; `load_from` refreshes them after an update.

    Args:
        config: the model's transformers config (`check_supported` must accept it).
        weight_format: one of `WEIGHT_FORMATS`.
        device: where the weights and caches live.
    """

    def __init__(self, config: Any, weight_format: str, device: torch.device):
        check_supported(config)
        if weight_format not in WEIGHT_FORMATS:
            raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
        if weight_format == "int8" and (device.type != "cpu" or
                                        "fbgemm" not in torch.backends.quantized.supported_engines):
            raise ValueError("weight_format 'int8' needs a CPU with torch's fbgemm kernels; use 'bf16' or 'fp32'")
        self.config, self.weight_format, self.device = config, weight_format, device
        # Activations (and the KV cache) follow bf16 weights; int8 kernels take float32 in.
        self.dtype = torch.bfloat16 if weight_format == "bf16" else torch.float32
        self.hidden = int(config.hidden_size)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or self.hidden // self.heads)
        self.eps = float(config.rms_norm_eps)
        rope = getattr(config, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim
        self.inv_freq = (1.0 / theta**exponents).to(device)
        # Attention that depends on a row's own tokens alone (`row_attention`): with int8, whose matmuls already
        # do, a row decodes the same tokens whatever shares its batch. fp32 takes it for speed: it reads only the
        # row's valid slots of the window, where torch's kernel reads every slot (a held-out evaluation's decode
        # windows are mostly other rows' columns). bf16 keeps torch's kernel (the compiled one reads float32).
        self.row_attention = weight_format != "bf16" and row_attention_available(self.head_dim)
        self.smoothed_inputs = [tuple(f"model.layers.{i}.{name}" for name in SMOOTHED_INPUTS)
                                for i in range(int(config.num_hidden_layers))]
        """Each layer's `SMOOTHED_INPUTS`, by module name: the keys of `input_maxima` (and of ``lm_head``)."""
        self.layers: list[_Layer] = []
        self.embed = self.final_norm = torch.empty(0)
        self.lm_head: _Linear | None = None

    @classmethod
    def from_hf(cls, model: Any, weight_format: str | None = None) -> LlamaDecoder:
        """Pack a transformers ``LlamaForCausalLM`` (``weight_format`` None = `default_weight_format`)."""
        device = next(model.parameters()).device
        decoder = cls(model.config, weight_format or default_weight_format(device), device)
        decoder.load_from(model)
        return decoder

    @torch.no_grad()
    def load_from(self, source: Any, input_maxima: Mapping[str, torch.Tensor] | None = None) -> None:
        """Copy (and pack) the weights of a module or a state dict of the same architecture.

        ``input_maxima`` (`input_maxima` of the same weights, packed without it, on typical text) turns on
        SmoothQuant for int8: each matmul's input channels are divided by ``s = sqrt(max|x| / max|w|)`` and its
        weight columns multiplied by it, folded into the RMSNorm weights (and the up projection before the down
        one), so the math is unchanged but activation outliers no longer eat the int8 range.
        """
        state = merged_weights(source)

        def get(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"weights lack {name!r}; is this a LlamaForCausalLM state dict?")
            return state[name].detach().to(self.device, torch.float32)

        def smoothing(module: str, weight: torch.Tensor) -> torch.Tensor:
            if input_maxima is None or self.weight_format != "int8":
                return torch.ones(weight.shape[1], device=self.device)
            x_max = input_maxima[module].to(self.device).clamp(min=1e-5)
            w_max = weight.abs().amax(dim=0).clamp(min=1e-5)
            # SmoothQuant's migration strength 1/2 (the smallest log-prob error of 0/0.3/0.4/0.5/0.7 on
            # SmolLM2-135M), as a square root: IEEE-exact on every ISA, where pow's vector kernels are not.
            return (x_max / w_max).sqrt().clamp(1e-2, 1e2)

        layers = []
        for i in range(int(self.config.num_hidden_layers)):
            prefix = f"model.layers.{i}."
            attention, mlp = prefix + "self_attn.", prefix + "mlp."
            qkv = torch.cat([get(attention + f"{n}_proj.weight") for n in "qkv"])
            gate_up = torch.cat([get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight")])
            down = get(mlp + "down_proj.weight")
            qkv_input, gate_up_input, down_input = self.smoothed_inputs[i]
            s_qkv, s_gate_up, s_down = (smoothing(qkv_input, qkv), smoothing(gate_up_input, gate_up),
                                        smoothing(down_input, down))
            gate_up = gate_up * s_gate_up
            gate_up[down.shape[1]:] /= s_down[:, None]  # silu(gate) * up / s: the down input, smoothed
            layers.append(_Layer(
                input_norm=get(prefix + "input_layernorm.weight") / s_qkv,
                qkv=_Linear(qkv * s_qkv, self.weight_format),
                o=_Linear(get(attention + "o_proj.weight"), self.weight_format),
                post_norm=get(prefix + "post_attention_layernorm.weight") / s_gate_up,
                gate_up=_Linear(gate_up, self.weight_format),
                down=_Linear(down * s_down, self.weight_format),
            ))
        self.layers = layers
        self.embed = get("model.embed_tokens.weight")
        head = get("lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight")  # tied
        s_head = smoothing("lm_head", head)
        self.final_norm = get("model.norm.weight") / s_head
        self.lm_head = _Linear(head * s_head, self.weight_format)

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        """An empty cache for ``batch`` rows of at most ``capacity`` tokens each."""
        shape = (len(self.layers), batch, self.kv_heads, capacity, self.head_dim)
        return KVCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros((batch, capacity), dtype=torch.bool, device=self.device))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps).to(self.dtype)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # [batch, 1, seq, head_dim]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def _sdpa_mask(self, cache: KVCache, start: int, seq: int) -> torch.Tensor | None:
        """torch's attention mask for queries at slots ``start..start+seq``, grouped as `forward` queries."""
        batch, end, groups = cache.valid.shape[0], start + seq, self.heads // self.kv_heads
        # Recounted at every call (cheap): a prefill after `KVCache.place` leaves gaps mid-row, and rows that
        # leave the batch may take the last padding with them.
        cache.padded = not bool(cache.valid[:, :end].all())
        # Causal over the written slots; padding slots are never attended to, except each by itself, so that
        # no query row is fully masked (SDPA would give NaN, and NaN times a zero weight poisons real rows).
        # A decode step without padding needs no mask at all (SDPA is faster without one).
        visible = None if seq == 1 and not cache.padded else cache.valid[:, None, None, :end]
        if seq > 1:
            causal = torch.ones(seq, end, dtype=torch.bool, device=self.device).tril(diagonal=start)
            itself = F.pad(torch.eye(seq, seq, dtype=torch.bool, device=self.device), (start, 0))
            visible = ((visible & causal) | itself)[:, :, None].expand(batch, 1, groups, seq, end)
            visible = visible.reshape(batch, 1, groups * seq, end)
        return visible

    @torch.inference_mode()
    def input_maxima(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-channel ``max |x|`` of the inputs of the matmuls `load_from` smooths, over one row ``[1, seq]``.

        Taken from this decoder's own forward, packed without smoothing: its int8 path is exact on every ISA,
        so the scales are too (a transformers forward sums in another order on AVX2 than on AVX-512).
        """
        maxima: dict[str, torch.Tensor] = {}
        seq = input_ids.shape[1]
        self.forward(input_ids, torch.arange(seq)[None], self.new_cache(1, seq), 0,
                     torch.ones(1, seq, dtype=torch.bool), record=maxima)
        return maxima

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: int,
                valid: torch.Tensor, record: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Run ``input_ids`` ``[batch, seq]`` written at cache slots ``start..start+seq``; last-position logits.

        ``positions`` are the RoPE positions of those tokens, ``valid`` ``[batch, seq]`` marks the real
        (not left-padding) ones. Returns float32 logits ``[batch, vocab]`` of each row's last token.
        ``record``, if given, receives the channel maxima of `input_maxima`.
        """

        def recorded(name: str, inputs: torch.Tensor) -> torch.Tensor:
            if record is not None:
                record[name] = inputs.abs().amax(dim=0)
            return inputs

        batch, seq = input_ids.shape
        end = start + seq
        groups = self.heads // self.kv_heads
        cache.valid[:, start:end] = valid
        visible = None if self.row_attention else self._sdpa_mask(cache, start, seq)
        cos, sin = self._rope(positions)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        # A prefill's rows are left-padded to its longest one (35% of the prefill tokens of a QA evaluation were
        # padding), but only attention needs the rows aligned: the matmuls and the residual stream run on the
        # real tokens alone, packed, and attention reads them scattered back into the padded layout.
        real = valid.reshape(-1).nonzero().squeeze(1) if seq > 1 and not bool(valid.all()) else None
        x = self.embed[input_ids.reshape(-1) if real is None else input_ids.reshape(-1)[real]]
        for index, layer in enumerate(self.layers):
            qkv_input, gate_up_input, down_input = self.smoothed_inputs[index]
            qkv = layer.qkv(recorded(qkv_input, self._norm(x, layer.input_norm))).to(self.dtype)
            if real is not None:
                qkv = qkv.new_zeros(batch * seq, qkv.shape[-1]).index_copy_(0, real, qkv)
            qkv = qkv.view(batch, seq, -1)
            # Queries and keys take RoPE in one call (elementwise, so the same values as two calls, in half the ops).
            qk = self._rotate(qkv[..., :q_size + kv_size].view(batch, seq, self.heads + self.kv_heads,
                                                               self.head_dim).transpose(1, 2), cos, sin)
            q = qk[:, :self.heads]
            cache.keys[index, :, :, start:end] = qk[:, self.heads:]
            cache.values[index, :, :, start:end] = qkv[..., q_size + kv_size:].view(
                batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
            if self.row_attention:
                attended = row_attention(q, cache.keys[index], cache.values[index], cache.valid, start)
            else:
                # Grouped-query attention without copying the cache: the query heads sharing a KV head become
                # extra query rows of that head.
                attended = F.scaled_dot_product_attention(
                    q.reshape(batch, self.kv_heads, groups * seq, self.head_dim),
                    cache.keys[index, :, :, :end], cache.values[index, :, :, :end], attn_mask=visible)
                attended = attended.view(batch, self.heads, seq, self.head_dim).transpose(1, 2)
            attended = attended.reshape(batch * seq, q_size)
            x = x + layer.o(attended if real is None else attended[real])
            gate, up = layer.gate_up(recorded(gate_up_input, self._norm(x, layer.post_norm))).chunk(2, dim=-1)
            x = x + layer.down(recorded(down_input, F.silu(gate) * up))
        # Each row's last token is real (rows are left-padded): the last of its run in the packed order.
        last = (torch.arange(1, batch + 1, device=self.device) * seq if real is None
                else valid.sum(dim=1).cumsum(0)) - 1
        if record is not None:
            recorded("lm_head", self._norm(x, self.final_norm))
        return self.lm_head(self._norm(x[last], self.final_norm))
