"""specexport runtime: load a bundle and generate with speculative decoding. Torch-free by design:
numpy, onnxruntime, tokenizers and jinja2 only. `import specexport.runtime` must never import torch or
transformers (tests/test_runtime_imports.py proves it)."""
from .decoder import DecodeConfig, Stats
from .pipeline import Generation, Pipeline, load
from .sampling import SamplingParams

__all__ = ["DecodeConfig", "Generation", "Pipeline", "SamplingParams", "Stats", "load"]
