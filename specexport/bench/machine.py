"""What machine a benchmark ran on: CPU model, the SIMD flags that decide which kernels run (AVX2 / AVX-512 /
AVX-512 BF16 / AMX), cores, and the versions of everything measured. Every record and summary carries it."""
from __future__ import annotations

import os
import platform
from functools import lru_cache
from importlib import metadata

FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@lru_cache(maxsize=1)
def cpu() -> dict:
    """{'model': 'AMD EPYC', 'flags': ['avx2', 'fma'], 'cores': 2} from /proc/cpuinfo (Linux) or platform."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key == "flags":
                    flags = set(value.split())
                if model and flags and key == "":
                    break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "flags": [f for f in FLAGS if f in flags], "cores": cores}


def label() -> str:
    """'AMD EPYC, 2 cores, avx2 fma (no avx512f, avx512_bf16, amx)' : one line for a summary."""
    c = cpu()
    absent = [f for f in ("avx512f", "avx512_bf16") if f not in c["flags"]] + \
        (["amx"] if not any(f.startswith("amx") for f in c["flags"]) else [])
    return f"{c['model']}, {c['cores']} cores, {' '.join(c['flags']) or 'no AVX2'}" + \
        (f" (no {', '.join(absent)})" if absent else "")


def versions(dists=("specexport", "onnxruntime", "numpy", "torch", "transformers", "onnxruntime-genai",
                    "openvino", "openvino-genai", "llama-cpp-python")) -> dict:
    out = {}
    for d in dists:
        try:
            out[d] = metadata.version(d)
        except metadata.PackageNotFoundError:
            pass
    return out
