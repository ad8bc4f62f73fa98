"""TensorRT engines from a bundle's ONNX graphs (`specexport build ... --engine tensorrt`).

One engine per model, one optimisation profile per built T (decode, prefill chunk, each verify k+1;
min = opt = max for T) with S ranging over the capacity buckets. Precision is a builder flag (fp32, fp16,
bf16) over the float32 ONNX graph, so the ONNX graphs stay the CPU-checked ones. The engine's record in the
manifest names the TensorRT version, GPU and compute capability it was built for; the runtime refuses an
engine built for another (`mismatch`).

Written against the TensorRT 10 Python API; it has not run yet: no machine this project was lent carries
TensorRT (docs/gpu.md).
"""
from __future__ import annotations

import logging
from pathlib import Path

from ..backends.trt import environment, mismatch  # noqa: F401  (the engine record's compatibility check)
from ..bundle import ModelEntry

PRECISIONS = ("fp32", "fp16", "bf16")


def build_engine(root: Path, entry: ModelEntry, buckets: list, precision: str = "fp16", log=None) -> dict:
    """Write <graph stem>.plan beside the ONNX graph; -> the manifest's engine record. `log` takes progress
    lines (default: the specexport.build logger at INFO)."""
    import tensorrt as trt

    log = log or logging.getLogger("specexport.build").info

    env = environment()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(root / entry.graph)):  # reads the external .data file beside it
        errs = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {entry.graph}: {errs}")
    config = builder.create_builder_config()
    if precision == "fp16":
        config.set_flag(trt.BuilderFlag.FP16)
    elif precision == "bf16":
        config.set_flag(trt.BuilderFlag.BF16)
    smin, smax = min(buckets), max(buckets)
    profiles = {}
    for name, T in sorted(entry.profiles.items(), key=lambda x: x[1]):
        if T in profiles.values():
            continue
        prof = builder.create_optimization_profile()
        for spec in entry.inputs:
            def dims(S, spec=spec, T=T):
                return tuple(T if d == "T" else S if d == "S" else d for d in spec["shape"])
            prof.set_shape(spec["name"], dims(smin), dims(smax), dims(smax))
        config.add_optimization_profile(prof)
        profiles[name] = T
    log(f"TensorRT {env['tensorrt']}: building {entry.role} engine ({precision}, {len(profiles)} profiles) ...")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"TensorRT failed to build an engine for {entry.graph} (see its log above)")
    file = Path(entry.graph).with_suffix(".plan").name
    (root / file).write_bytes(bytes(plan))
    ts = sorted(set(profiles.values()))
    return {"file": file, "precision": precision, "profile_of_T": {str(T): i for i, T in enumerate(ts)}, **env}
