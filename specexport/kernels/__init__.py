"""specexport's own CPU kernels for onnxruntime, compiled on first use for the CPU they run on.

gqa.c is GroupQueryAttention as the fused graphs use it (gqa_amx.h: its products on AMX tiles, for a bf16dot
session whose MatMuls run there; SPECEXPORT_ATTENTION_AMX=0 keeps the float32 attention), matmul.c their
weights' MatMul (and MatMulSwiGLU, domain specexport: the MLP's gate/up MatMul and silu(gate) * up in one op,
which graphs built since 2026-12-05 hold with its definition as an ONNX function), matmul4.c MatMulNBits
for int4 weights with int8 activations (why and how: each file's header comment, docs/design.md "The attention
kernel", "The weights' MatMul" and "Quantised targets"). `library(head_dim)` gives
the path of the shared library to load into a session's options (`register_custom_ops_library`); it registers
each op under its own domain and name (com.microsoft's GroupQueryAttention, the ONNX domain's MatMul), so the
graph and the bundle stay as they are and a session without the library runs onnxruntime's kernels.
SPECEXPORT_MATMUL=0 leaves MatMul to onnxruntime (the attention kernel still runs), to compare the two. A session
whose options carry specexport.matmul_weights=bf16 (session_options(weights="bf16"), backend onnxruntime-bf16)
gets the MatMul with its weights rounded to bfloat16 (float32 math), on any CPU the library builds for.

The library is built with the system C compiler ($CC, else cc or gcc; -O3 -march=native: this CPU's vector
width, AVX-512 or AVX2; SPECEXPORT_MARCH=haswell builds the AVX2 code on any newer x86 CPU, which is how
scripts/test.sh tests it on AVX-512 machines) into a cache keyed by the sources, the flags and this CPU's flags
($SPECEXPORT_CACHE, else ~/.cache/specexport), once per machine (~1 s). No compiler, a failed build, a head
size it does not serve (multiples of 16 up to 128 only) or SPECEXPORT_KERNELS=0 give None: onnxruntime's kernel runs,
with one warning for a failed build. Torch-free, like the rest of the runtime.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = ("gqa.c", "gqa_rows.h", "gqa_amx.h", "matmul.c", "matmul4.c", "ops.h")
HEAD_DIMS = tuple(range(16, 129, 16))  # gqa.c's register-blocked paths
FLAGS = ["-O3", "-march=native", "-std=gnu11", "-fPIC", "-shared", "-pthread", "-Wl,-z,nodelete", "-Wall"]
log = logging.getLogger("specexport")
_lock = threading.Lock()
_built: dict = {}  # cache path -> Path or None (a failed build is not retried in this process)


def flags() -> list[str]:
    """The compiler's flags: FLAGS, with -march=$SPECEXPORT_MARCH in place of native where that is set."""
    march = os.environ.get("SPECEXPORT_MARCH")
    return [f"-march={march}" if f == "-march=native" and march else f for f in FLAGS]


def enabled() -> bool:
    """SPECEXPORT_KERNELS=0 turns the kernels off (onnxruntime's own then run), e.g. to compare the two."""
    return os.environ.get("SPECEXPORT_KERNELS", "1") != "0"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cpu_flags() -> str:
    """This CPU's model and feature flags (what -march=native compiles for), for the cache key."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "\n".join(sorted({ln for ln in info.splitlines() if ln.startswith(("flags", "model name"))}))
    except OSError:
        return platform.processor() or platform.machine()


def cache_path(cc: str) -> Path:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update((HERE / name).read_bytes())
    h.update(" ".join([cc, *flags(), platform.machine(), cpu_flags()]).encode())
    root = Path(os.environ.get("SPECEXPORT_CACHE") or Path.home() / ".cache" / "specexport")
    return root / "kernels" / f"libspecexport_gqa-{h.hexdigest()[:16]}.so"


def build(cc: str, out: Path) -> None:
    """Compile into a temporary file beside `out`, then rename: processes that build at once each get a whole
    library. Raises RuntimeError with the compiler's message."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name, suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        cmd = [cc, *flags(), "-I", str(HERE / "include"), "-o", tmp, *(str(HERE / n) for n in SOURCES if n.endswith(".c")), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def set_threads(path: str, n: int) -> None:
    """Tell the library how many threads onnxruntime's pool has: matmul.c splits a call's columns into that many
    parts (the CPU count until told). The library is the one the session loaded (same path, one copy)."""
    ctypes.CDLL(path).specexport_threads(int(n))


def matmul_dot(path: str) -> bool:
    """Whether the library has the bfloat16 dot-product format (built for a CPU with avx512_bf16)."""
    return bool(ctypes.CDLL(path).specexport_matmul_dot())


def matmul_amx(path: str) -> bool:
    """Whether the bfloat16 dot-product format runs on AMX tiles here (a CPU with amx_bf16, the tiles granted by
    Linux, SPECEXPORT_AMX not 0): a numerically different bf16dot target than VDPBF16PS's, row-consistent alike."""
    return bool(ctypes.CDLL(path).specexport_matmul_amx())


def matmul4_on(path: str) -> bool:
    """Whether the library has matmul4.c's MatMulNBits (int4 weights, int8 activations; AVX512-VNNI, AVX2 builds) and
    SPECEXPORT_MATMUL4 does not turn it off."""
    return bool(ctypes.CDLL(path).specexport_matmul4_on())


def matmul_on(path: str, bf16: bool = False) -> bool:
    """Whether sessions that load the library run its MatMul (float32 weights, or bfloat16 ones): gqa.c's own
    rule (AVX-512 builds by default, SPECEXPORT_MATMUL=0 off, =1 on anywhere; bfloat16 on anywhere unless off)."""
    return bool(ctypes.CDLL(path).specexport_matmul_on(int(bf16)))


def library(head_dim: int) -> str | None:
    """The kernel library's path for a model of this head size, building it if need be; None where onnxruntime's
    own kernel should run (see the module docstring)."""
    if not enabled() or head_dim not in HEAD_DIMS:
        return None
    cc = compiler()
    if cc is None:
        return None
    out = cache_path(cc)
    with _lock:
        if out not in _built:
            try:
                if not out.exists():
                    build(cc, out)
                _built[out] = out
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                log.warning("specexport: its attention kernel could not be built, onnxruntime's own runs "
                            "instead (slower at several rows; set SPECEXPORT_KERNELS=0 to silence this): %s", e)
                _built[out] = None
        path = _built[out]
    return str(path) if path else None


def attention_amx(path: str) -> bool:
    """Whether a bf16dot session's attention runs on AMX tiles too (gqa_amx.h): where its MatMuls do."""
    return bool(ctypes.CDLL(path).specexport_attention_amx())
