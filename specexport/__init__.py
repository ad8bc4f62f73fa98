"""specexport: compile-time export of target + draft LMs into fixed-shape ONNX bundles, and a lean
torch-free runtime for lossless speculative decoding."""
__version__ = "0.1.0"


def load(path, threads=None, verify=True):
    """Load a bundle written by `specexport build` -> runtime.Pipeline."""
    from .runtime import load as _load
    return _load(path, threads=threads, verify=verify)
