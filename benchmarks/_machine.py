"""The machine a benchmark ran on: CPU model, the ISA extensions kernels dispatch on, and the knobs that cap them."""

from __future__ import annotations

import os
from typing import Any

ISA_FLAGS = {"AVX2": "avx2", "AVX-512": "avx512f", "AVX-512 VNNI": "avx512_vnni", "AVX-VNNI": "avx_vnni",
             "AVX-512 BF16": "avx512_bf16", "AMX-BF16": "amx_bf16", "AMX-INT8": "amx_int8"}
"""ISA name -> its ``/proc/cpuinfo`` flag: the extensions int8 and bf16 kernels dispatch on."""

ISA_ENV = ("FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA",
           "CT2_FORCE_CPU_ISA")
"""Environment variables that cap the ISA of fbgemm, MKL (CTranslate2's int8 GEMM), torch, oneDNN and CTranslate2."""


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model and `ISA_FLAGS` present, from the text of ``/proc/cpuinfo`` (its first processor).

    Example:
        >>> facts = parse_cpuinfo("model name\\t: Some CPU\\nflags\\t: fpu avx avx2 avx512f\\n\\nmodel name\\t: x\\n")
        >>> facts["model"], facts["isa"]
        ('Some CPU', ['AVX2', 'AVX-512'])
    """
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name", "unknown"), "isa": [name for name, flag in ISA_FLAGS.items()
                                                                 if flag in flags]}


def cpu_facts() -> dict[str, Any]:
    """This CPU's model, ISA flags, torch's dispatch level and the ISA environment knobs that are set."""
    import torch

    try:
        with open("/proc/cpuinfo") as cpuinfo:
            facts = parse_cpuinfo(cpuinfo.read())
    except OSError:
        facts = {"model": "unknown (no /proc/cpuinfo)", "isa": []}
    facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    facts["isa_env"] = {name: os.environ[name] for name in ISA_ENV if name in os.environ}
    facts["cores"] = os.cpu_count()
    from rapo_agents.policies.row_attention import row_attention_available
    from rapo_agents.policies.unit_rows import native_available

    facts["native_unit_rows"] = native_available()  # the int8 path's compiled loops (else its eager ops)
    facts["native_row_attention"] = row_attention_available(64)  # else torch's attention: not batch-invariant
    return facts


def cpu_line(cpu: dict[str, Any]) -> str:
    """One line naming the CPU, its ISA flags and the knobs in effect (printed with every table)."""
    knobs = ", ".join(f"{k}={v}" for k, v in cpu["isa_env"].items()) or "no ISA env knobs"
    return (f"CPU: {cpu['model']} ({cpu['cores']} cores); ISA: {', '.join(cpu['isa']) or 'none listed'}; "
            f"torch dispatch {cpu['torch_cpu_capability']}; {knobs}; int8 row map "
            f"{'compiled' if cpu.get('native_unit_rows') else 'eager'}, int8 attention "
            f"{'fixed-order (compiled)' if cpu.get('native_row_attention') else 'torch SDPA'}")
