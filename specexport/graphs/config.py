"""GraphConfig: the architecture numbers a graph needs, as one frozen dataclass.

Built by the exporter from a loaded Hugging Face model (`from_hf`); the graph modules never see a
transformers object. RoPE frequencies are taken from the HF model's own rotary module, so every rope
type transformers computes statically (default, linear, llama3, yarn) is reproduced exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")
SUPPORTED_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class GraphConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_type: str
    inv_freq: tuple[float, ...] = field(repr=False)  # [D/2]
    rope_scaling: float  # multiplies cos/sin (1.0 except yarn)
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_window: int | None = None

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if len(self.inv_freq) * 2 != self.head_dim:
            raise ValueError(f"inv_freq has {len(self.inv_freq)} entries, head_dim {self.head_dim} needs {self.head_dim // 2}")

    def with_layers(self, n: int) -> "GraphConfig":
        """The config of an early-exit slice: the first n layers, same norm and head."""
        if not 1 <= n < self.num_layers:
            raise ValueError(f"an early-exit draft needs 1 <= layers < {self.num_layers}, got {n}")
        d = dict(self.__dict__)
        d["num_layers"] = n
        return GraphConfig(**d)

    def summary(self) -> dict:
        """The manifest's `arch`: every field, so GraphConfig(**arch) rebuilds it (the torch backend does)."""
        return {**self.__dict__, "inv_freq": list(self.inv_freq)}

    @staticmethod
    def from_summary(d: dict) -> "GraphConfig":
        return GraphConfig(**{**d, "inv_freq": tuple(d["inv_freq"])})


def from_hf(model) -> GraphConfig:
    """Read a loaded transformers causal LM into a GraphConfig; refuse what the graphs cannot express."""
    c = model.config
    arch = (c.architectures or [type(model).__name__])[0]
    if type(model).__name__ not in SUPPORTED_ARCHS:
        raise ValueError(f"unsupported architecture {type(model).__name__} (config says {arch}); "
                         f"supported: {', '.join(SUPPORTED_ARCHS)}")
    rope = model.model.rotary_emb
    rope_type = getattr(rope, "rope_type", "default")
    if rope_type not in SUPPORTED_ROPE:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE)}")
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    qwen = type(model).__name__ == "Qwen2ForCausalLM"
    attn_bias = bool(getattr(c, "attention_bias", False))
    act = getattr(c, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported activation {act!r}; the Llama family uses 'silu'")
    window = getattr(c, "sliding_window", None) if getattr(c, "use_sliding_window", True) else None
    return GraphConfig(
        arch=type(model).__name__,
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=float(c.rms_norm_eps),
        rope_type=rope_type,
        inv_freq=tuple(float(x) for x in rope.inv_freq.float().tolist()),
        rope_scaling=float(getattr(rope, "attention_scaling", 1.0)),
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
        qkv_bias=qwen or attn_bias,
        o_bias=attn_bias and not qwen,
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        sliding_window=window,
    )
