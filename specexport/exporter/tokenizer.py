"""Tokenizer files, EOS ids and chat template into the bundle; draft/target vocabulary check."""
from __future__ import annotations

from pathlib import Path


def _load(path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise ValueError(f"cannot load the tokenizer of {path} ({type(e).__name__}: {e}); the checkpoint "
                         "needs its tokenizer files (tokenizer.json or equivalent)") from None


def copy_tokenizer(ckpt: Path, dest: Path, hf_model) -> dict:
    """Save a fast tokenizer.json under dest and return the manifest's tokenizer section."""
    tok = _load(ckpt)
    if not tok.is_fast:
        raise ValueError(f"the tokenizer of {ckpt} has no fast (tokenizers) version; the runtime needs tokenizer.json")
    dest.mkdir(parents=True)
    tok.backend_tokenizer.save(str(dest / "tokenizer.json"))
    eos = set()
    for src in (getattr(hf_model, "generation_config", None), hf_model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        eos.update(e if isinstance(e, list) else [e] if e is not None else [])
    if tok.eos_token_id is not None:
        eos.add(tok.eos_token_id)
    template = tok.chat_template if isinstance(tok.chat_template, str) else None
    return {
        "file": "tokenizer/tokenizer.json",
        "eos_token_ids": sorted(eos),
        "bos_token_id": tok.bos_token_id,
        "chat_template": template,
        "special_tokens": {"bos_token": tok.bos_token or "", "eos_token": tok.eos_token or ""},
    }


def check_compatible(target: Path, draft: Path, v_target: int, v_draft: int) -> None:
    """A draft must share the target's tokens id for id, or its proposals mean something else."""
    if v_target != v_draft:
        raise ValueError(f"draft vocabulary size {v_draft} != target's {v_target}: a draft must use the "
                         "target's tokenizer; pick a draft from the same model family")
    vt, vd = _load(target).get_vocab(), _load(draft).get_vocab()
    diff = [t for t, i in vd.items() if vt.get(t) != i]
    if diff or len(vt) != len(vd):
        raise ValueError(f"draft and target tokenizers differ ({len(diff)} tokens map to other ids, e.g. "
                         f"{diff[:3]}): a draft must use the target's tokenizer")
