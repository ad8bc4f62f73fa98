"""The build side (torch, transformers, onnx): trace checkpoints into step graphs, check them, write bundles. Nothing at run time imports it."""
