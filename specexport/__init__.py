"""specexport: compile-time export of target + draft LMs into fixed-shape ONNX bundles, and a lean
torch-free runtime for lossless speculative decoding."""
__version__ = "0.1.0"


def load(path, threads=None, verify=True, backend="onnxruntime", device="cpu"):
    """Load a bundle written by `specexport build` -> runtime.Pipeline. backend: "onnxruntime" (default,
    torch-free), "onnxruntime-device" (IO binding, KV cache on `device`: the CUDA EP path) or "torch"
    (graphs/ modules in torch, CUDA graphs on a CUDA device)."""
    from .runtime import load as _load
    return _load(path, threads=threads, verify=verify, backend=backend, device=device)
