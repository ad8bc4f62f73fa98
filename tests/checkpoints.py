"""Tiny random checkpoints written with transformers' save_pretrained, for tests that go through the real
loading path. Nothing is downloaded."""
from __future__ import annotations

import string
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{{ eos_token }}{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def char_tokenizer(chars: str):
    """A character-level fast tokenizer: <unk>=0, <s>=1, </s>=2, then one id per character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in chars:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=CHAT_TEMPLATE)


CHARS = string.ascii_letters + string.digits + " .,!?'-:;<>/\n"


def make_checkpoint(path: Path, *, arch: str = "llama", layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, vocab: int = 128, tie: bool = False, rope_scaling: dict | None = None,
                    chars: str = CHARS, seed: int = 0, logit_scale: float = 1.0) -> Path:
    """Save a random Llama-family model + tokenizer to `path`. logit_scale > 1 makes its predictions peakier."""
    import torch
    from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                  tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "qwen2":
        cfg = Qwen2Config(**common)
        model = Qwen2ForCausalLM(cfg)
    elif arch == "mistral":
        cfg = MistralConfig(**common, sliding_window=4096)
        model = MistralForCausalLM(cfg)
    else:
        if rope_scaling:
            common["rope_parameters"] = {"rope_theta": 10000.0, **rope_scaling}
        cfg = LlamaConfig(**common)
        model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)  # transformers initialises biases to zero: make them matter
        model.lm_head.weight.mul_(logit_scale)
    model.eval().save_pretrained(path)
    char_tokenizer(chars).save_pretrained(path)
    return Path(path)


def perturbed_copy(src: Path, dst: Path, noise: float, seed: int = 1) -> Path:
    """A draft that agrees with `src` often but not always: the same model with Gaussian noise on its weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_pretrained(src)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * noise * p.std().clamp(min=1e-3))
    m.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return Path(dst)
