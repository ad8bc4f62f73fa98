"""Export-friendly Llama-family decoder (Llama 1/2/3, SmolLM, Mistral, Qwen2): pure torch, static shapes.

One forward = one step over T new tokens against a cache of S slots that the caller owns:
  inputs   input_ids    int64 [B,T]
           position_ids int64 [B,T]          absolute positions (RoPE)
           past_mask    bool  [B,S]          slot holds a valid earlier token of this sequence: slots
                                             [0, n) for a row with n cached tokens
           new_mask     bool  [B,T,T]        which new tokens each new token sees (causal by default;
                                             a tree mask for tree verification)
           past_kv      2L x float [B,Hkv,S,D]  K (already rotated) and V per layer, in that order
  outputs  logits       float [B,T,V]
           new_kv       float [L,2,B,Hkv,T,D]  K (rotated) and V of the T new tokens
The graph never writes the cache: the runtime commits the accepted rows of new_kv into its ring buffer,
so a rejected proposal costs nothing to roll back. (FusedStep, the default "fused" attention, differs: its
GroupQueryAttention nodes rotate and write the new K/V into the cache's free slots in place; no new_kv.)
With `slots` (attention "slots") it attends over copies of the cache with the new tokens placed in slots
n..n+T-1 instead of over [cache; new tokens].
Parameter names mirror transformers' (model.layers.N.input_layernorm.weight, ...) except that q/k/v and
gate/up are stacked into one projection each (fewer, larger MatMuls); `build` does the stacking. Nothing here imports transformers.
"""
from __future__ import annotations

import torch
from torch import nn

from .config import GraphConfig

TOPK = 8  # a fused graph also outputs each row's top-8 token ids (the recycle drafter's successor table)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        # written as x / sqrt(.) so onnxruntime fuses it into one SimplifiedLayerNormalization
        return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotation(D: int) -> torch.Tensor:
    """R: [D,D] with x @ R == rotate_half(x) == cat(-x[D/2:], x[:D/2]): one tiny MatMul instead of four ops."""
    h = D // 2
    R = torch.zeros(D, D)
    R[torch.arange(h) + h, torch.arange(h)] = -1.0
    R[torch.arange(h), torch.arange(h) + h] = 1.0
    return R


class Attention(nn.Module):
    """q/k/v in one projection (transformers' q_proj, k_proj, v_proj stacked by `build`)."""

    def __init__(self, c: GraphConfig):
        super().__init__()
        self.c = c
        h, kv, d = c.num_heads, c.num_kv_heads, c.head_dim
        self.qkv_proj = nn.Linear(c.hidden_size, (h + 2 * kv) * d, bias=c.qkv_bias)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=c.o_bias)

    def project(self, x, rope):
        """x [B,T,E] -> q [B,T,H,D] (pre-scaled by D^-0.5: stack_projections), k and v [B,T,Hkv,D], q and k
        rotated together in one MatMul."""
        return self.split(self.qkv_proj(x), rope)

    def split(self, qkv, rope):
        """The stacked projection [B,T,(H+2Hkv)*D] -> q, k, v as `project` returns them."""
        c = self.c
        B, T, _ = qkv.shape
        H, Hkv = c.num_heads, c.num_kv_heads
        qkv = qkv.view(B, T, H + 2 * Hkv, c.head_dim)
        cos, sin, rot = rope
        qk = qkv[:, :, :H + Hkv]
        qk = qk * cos + (qk @ rot) * sin  # rot: rotate_half as a constant [D,D] product (exact: a signed permutation)
        return qk[:, :, :H], qk[:, :, H:], qkv[:, :, H + Hkv:]

    def forward(self, x, rope, past_k, past_v, bias, place=None):
        # x: [B,T,E]; rope: LlamaGraph.rope's (cos, sin, rot); past_k/v: [B,Hkv,S,D]; bias: [B,1,G*T,S+T], or
        # [B,1,G*T,S] with place = (onehot [B,1,S,T], written [B,1,S,1]): which slots take which new token
        c = self.c
        B, T, _ = x.shape
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        G = H // Hkv
        q, k, v = (t.transpose(1, 2) for t in self.project(x, rope))  # [B,H,T,D], [B,Hkv,T,D] x2
        # GQA without repeating the cache: head h = kv * G + g (transformers' repeat_kv order), so the G
        # query heads of one KV head become G*T rows against that head's cache
        q = q.reshape(B, Hkv, G * T, D)
        if place is None:  # "portable": attend over [cache; new tokens]
            s = torch.cat([q @ past_k.transpose(-1, -2), q @ k.transpose(-1, -2)], dim=-1) + bias  # [.., S+T]
            S = past_k.shape[2]
            p = torch.softmax(s, dim=-1)
            o = p[..., :S] @ past_v + p[..., S:] @ v  # [B,Hkv,G*T,D]
        else:  # "slots": attend over copies of the cache with the new tokens' K/V in their slots n..n+T-1
            # (a product with a one-hot matrix moves values exactly), so a verify row sums its keys in the
            # same places and order as the decode call of the same token: bit-identical rows wherever the
            # math is row-consistent, bfloat16 included (splitting each sum in [cache; new] rounds the two
            # halves apart in bfloat16: |dlogit| ~0.5 between a verify and a decode row on SmolLM2)
            onehot, written = place
            keys = torch.where(written, onehot @ k, past_k)
            values = torch.where(written, onehot @ v, past_v)
            o = torch.softmax(q @ keys.transpose(-1, -2) + bias, dim=-1) @ values  # [B,Hkv,G*T,D]
        o = o.reshape(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
        return self.o_proj(o), k, v

    def fused(self, x, rope, past_k, past_v, bias, seqlens_k, total_len):
        """The same attention as one onnxruntime GroupQueryAttention node (export only): it rotates q and k
        itself, reads the first total_len slots of past_k/v, writes this step's K/V into slots total_len-T..
        in place (the runtime binds past and present to one buffer) and adds `bias` [B,1,T,total_len] (the
        tree mask) to its causal mask. rope: (cos table, sin table, positions [B,T]) as RopeTables.rope gives.
        Returns (output, present_k, present_v)."""
        o, pk, pv = self.gqa(self.qkv_proj(x), rope, past_k, past_v, bias, seqlens_k, total_len)
        return self.o_proj(o), pk, pv

    def gqa(self, qkv, rope, past_k, past_v, bias, seqlens_k, total_len):
        """`fused` from the stacked projection qkv [B,T,(H+2Hkv)*D] up to the node's output [B,T,H*D] (before
        o_proj): the mixed graph projects every group's tokens in one MatMul and attends per group. The node
        takes q, k and v packed as projected and rotates q and k at the given positions (a tree's tokens sit
        at their depth, not their index) from cos/sin tables indexed by position: one node per layer where
        the rotary as graph ops was eight (split, multiply, rotate, add, reshape), each an onnxruntime kernel
        launch of a few microseconds on tensors of a few KB."""
        c = self.c
        B, T, _ = qkv.shape
        cos, sin, positions = rope
        o, pk, pv = torch.onnx.ops.symbolic_multi_out(
            "com.microsoft::GroupQueryAttention",
            [qkv, None, None, past_k, past_v, seqlens_k, total_len, cos, sin, positions, bias],
            dict(num_heads=c.num_heads, kv_num_heads=c.num_kv_heads, scale=1.0, do_rotary=1),  # q rows pre-scaled
            dtypes=[qkv.dtype] * 3, shapes=[(B, T, c.num_heads * c.head_dim), past_k.shape, past_v.shape], version=1)
        return o, pk, pv


class MLP(nn.Module):
    """gate and up in one projection (stacked by `build`)."""

    def __init__(self, c: GraphConfig):
        super().__init__()
        self.inter = c.intermediate_size
        self.gate_up_proj = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x):
        gu = self.gate_up_proj(x)
        return self.down_proj(nn.functional.silu(gu[..., :self.inter]) * gu[..., self.inter:])


class Layer(nn.Module):
    def __init__(self, c: GraphConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, rope, past_k, past_v, bias, fused=None, place=None):
        h = self.input_layernorm(x)
        if fused:
            a, *present = self.self_attn.fused(h, rope, past_k, past_v, bias, *fused)
            k = v = None
        else:
            (a, k, v), present = self.self_attn(h, rope, past_k, past_v, bias, place), []
        x = x + a
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v, present


class Backbone(nn.Module):
    def __init__(self, c: GraphConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaGraph(nn.Module):
    """The whole step: embed -> L layers -> norm -> head, with explicit KV in and new KV out."""

    def __init__(self, c: GraphConfig, slots: bool = False):
        super().__init__()
        self.c = c
        self.slots = slots  # attention "slots" (see Attention.forward) instead of "portable"
        self.model = Backbone(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", torch.tensor(c.inv_freq, dtype=torch.float32), persistent=False)
        self.register_buffer("rot", rotation(c.head_dim), persistent=False)

    def rope(self, position_ids, dtype):
        """Rotary for the step's positions, built once per step -> (cos, sin [B,T,1,D], rot [D,D]), applied per
        layer as x*cos + (x @ rot)*sin == x*cos + rotate_half(x)*sin. (One [D,D] matrix per position, x @ M,
        was one op per layer but a batched product of T small matrices: 11.6 of 218 ms of a 256-token prefill
        call on SmolLM2.)"""
        c = self.c
        freqs = position_ids.unsqueeze(-1).float() * self.inv_freq  # [B,T,D/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos = (emb.cos() * c.rope_scaling).to(dtype)  # [B,T,D]; angles stay float32
        sin = (emb.sin() * c.rope_scaling).to(dtype)
        return cos.unsqueeze(-2), sin.unsqueeze(-2), self.rot.to(dtype)

    def head(self, x, kv):
        c = self.c
        new_kv = torch.stack(kv).view(c.num_layers, 2, *kv[0].shape)  # one Concat for the whole step
        return self.lm_head(self.model.norm(x)).float(), new_kv  # [B,T,V], [L,2,B,Hkv,T,D]

    def forward(self, input_ids, position_ids, past_mask, new_mask, past_kv: list, logit_rows=None):
        c = self.c
        x = self.model.embed_tokens(input_ids)  # [B,T,E]
        rope = self.rope(position_ids, x.dtype)
        G = c.num_heads // c.num_kv_heads
        B, T = input_ids.shape
        S = past_mask.shape[1]
        place = None
        if not self.slots:
            dev = past_mask.device  # filled on the device: copying a CPU tensor there breaks CUDA-graph capture
            neg, zero = torch.full((), float("-inf"), device=dev), torch.zeros((), device=dev)
            bias_past = torch.where(past_mask, zero, neg)[:, None, None, :].expand(B, 1, G * T, S)
            bias_new = torch.where(new_mask, zero, neg).repeat(1, G, 1)[:, None]  # [B,1,G*T,T], row g*T+t
            bias = torch.cat([bias_past, bias_new], dim=-1).to(x.dtype)  # [B,1,G*T,S+T], once per step
        else:
            # the T new tokens go to slots n..n+T-1, n = the row's committed length (its valid slots are
            # [0, n): a cache does not wrap within a bucket); a token past the last slot (padding at the
            # capacity) is not placed, and nothing sees it
            src = torch.arange(S, device=past_mask.device)[None] - past_mask.sum(-1, keepdim=True)  # [B,S]
            written = (src >= 0) & (src < T)
            src = src.clamp(0, T - 1)
            sees_new = new_mask.gather(2, src[:, None, :].expand(B, T, S))  # [B,T,S]: token t sees slot s's
            sees = past_mask[:, None, :] | (written[:, None, :] & sees_new)
            bias = torch.where(sees, 0.0, float("-inf")).repeat(1, G, 1)[:, None].to(x.dtype)  # [B,1,G*T,S]
            onehot = (written[..., None] & (src[..., None] == torch.arange(T, device=src.device))).to(x.dtype)
            place = (onehot[:, None], written[:, None, :, None])  # [B,1,S,T], [B,1,S,1]
        kv = []
        for i, layer in enumerate(self.model.layers):
            x, k, v, _ = layer(x, rope, past_kv[2 * i], past_kv[2 * i + 1], bias, place=place)
            kv += [k, v]
        return self.head(x if logit_rows is None else x.index_select(1, logit_rows), kv)


class SlotsStep(nn.Module):
    """The step with attention "slots" (export only): LlamaGraph's inputs plus logit_rows int64 [R] before the
    cache, as the fused graph's (a prefill chunk computes the LM head of its last row only); logits [B,R,V]."""

    def __init__(self, g: LlamaGraph):
        super().__init__()
        self.g = g

    def forward(self, input_ids, position_ids, past_mask, new_mask, logit_rows, past_kv: list):
        return self.g(input_ids, position_ids, past_mask, new_mask, past_kv, logit_rows)


class RopeTables(nn.Module):
    """A GroupQueryAttention step's graph `g` and its rotary tables: cos and sin [positions, D/2] float32 of
    position * inv_freq (the same float32 products as LlamaGraph.rope, times the rope's attention scaling),
    constants of the graph."""

    def __init__(self, g: LlamaGraph, positions: int):
        super().__init__()
        self.g = g
        freqs = torch.arange(positions, dtype=torch.float32)[:, None] * g.inv_freq[None]
        self.register_buffer("cos", freqs.cos() * g.c.rope_scaling, persistent=False)
        self.register_buffer("sin", freqs.sin() * g.c.rope_scaling, persistent=False)

    def rope(self, position_ids):
        """What Attention.fused / gqa take as `rope` for tokens at position_ids [B,T]."""
        return self.cos, self.sin, position_ids


class FusedStep(RopeTables):
    """The step with onnxruntime's GroupQueryAttention (export only; `attention="fused"` bundles):
      inputs   input_ids, position_ids as LlamaGraph; attn_bias float [B,1,T,n+T] (0 or -inf: which of the
               n cached and T new tokens each new token sees, on top of causal); seqlens_k int32 [B] = n+T-1;
               total_len int32 [] = n+T; logit_rows int64 [R]: the rows that get logits (all T for a verify
               step; the last only for a prefill chunk nobody reads the rest of: the LM head is ~21% of a
               SmolLM2 row's FLOPs); past_kv 2L x [B,Hkv,S,D], slots [0,n) valid, S >= n+T
      outputs  logits [B,R,V] of logit_rows; top_ids int64 [B,R,TOPK]: each row's largest logits, largest
               first (what the recycle drafter learns, computed here instead of in Python); then
               present_key/value.i: the SAME buffers as past_kv (bind them so; the node writes the T new
               tokens' K (rotated) and V into slots n..n+T-1 in place, which are free: commit moves the
               accepted ones to n, n+1, ..., and rollback is unchanged).
    `positions`: the rotary tables' length, the capacity: a fused call's positions are below n + T <= capacity,
    which the runtime checks before every call (onnxruntime refuses a position past the tables)."""

    def forward(self, input_ids, position_ids, attn_bias, seqlens_k, total_len, logit_rows, past_kv: list):
        g = self.g
        x = g.model.embed_tokens(input_ids)
        rope = self.rope(position_ids)
        bias = attn_bias.to(x.dtype)
        present = []
        for i, layer in enumerate(g.model.layers):
            x, _, _, p = layer(x, rope, past_kv[2 * i], past_kv[2 * i + 1], bias, fused=(seqlens_k, total_len))
            present += p
        logits = g.lm_head(g.model.norm(x.index_select(1, logit_rows))).float()
        return logits, torch.topk(logits, TOPK, dim=-1).indices, *present


class MixedStep(RopeTables):
    """FusedStep's call plus `groups` single-sequence groups in the same call (export only; the batching
    engine's graph for fused bundles). onnxruntime's GroupQueryAttention takes several new tokens per row
    with a past only at B = 1, so a batch of decode rows cannot carry a prefill chunk or a verify tree in
    one node; here every token of the call (the batch's B x T and each group's Tj) goes through ONE set of
    MatMuls (the weight read shared), and attention runs per group: one node for the batch, one batch-1 node
    per group, each on its own cache buffer.
      inputs   FusedStep's, for the batch; then per group j: input_ids.j, position_ids.j [1,Tj],
               attn_bias.j [1,1,Tj,nj+Tj], seqlens_k.j [1], total_len.j [], logit_rows.j [Rj] (may be
               empty), past_key/value.i.j [1,Hkv,Sj,D]
      outputs  logits [B*R + sum Rj, V]: the batch's rows, then each group's; top_ids [.., TOPK] likewise;
               present_key/value.i (the batch's) and present_key/value.i.j: the same buffers as the pasts,
               written in place as in FusedStep.
    A group's row of the pool also sits in the batch (rows [0, B) are contiguous): the runtime feeds it there
    as padding whose one write lands past the group's tokens, and reads nothing of it."""

    def __init__(self, g: LlamaGraph, groups: int, positions: int):
        super().__init__(g, positions)
        self.groups = groups

    def forward(self, input_ids, position_ids, attn_bias, seqlens_k, total_len, logit_rows, past_kv: list,
                groups: list):
        g, c = self.g, self.g.c
        E = c.hidden_size
        calls = [(input_ids, position_ids, attn_bias, seqlens_k, total_len, logit_rows, past_kv)] + list(groups)
        shapes = [tuple(a[0].shape) for a in calls]
        sizes = [b * t for b, t in shapes]
        # [1,N,E], N = all tokens: 3-D as in FusedStep, so the projections are the same MatMuls (same kernels,
        # same numbers) as the fused graph's
        x = torch.cat([g.model.embed_tokens(a[0]).reshape(1, -1, E) for a in calls], dim=1)
        present = [[] for _ in calls]
        for i, layer in enumerate(g.model.layers):
            at = layer.self_attn
            qkv = at.qkv_proj(layer.input_layernorm(x))
            outs = []
            for j, (part, a) in enumerate(zip(torch.split(qkv, sizes, dim=1), calls)):
                b, t = shapes[j]
                o, pk, pv = at.gqa(part.reshape(b, t, -1), self.rope(a[1]), a[6][2 * i],
                                   a[6][2 * i + 1], a[2].to(x.dtype), a[3], a[4])
                outs.append(o.reshape(1, b * t, -1))
                present[j] += [pk, pv]
            x = x + at.o_proj(torch.cat(outs, dim=1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows = [x_j.reshape(b, t, E).index_select(1, a[5]).reshape(1, -1, E)  # the rows that get logits
                for x_j, (b, t), a in zip(torch.split(x, sizes, dim=1), shapes, calls)]
        logits = g.lm_head(g.model.norm(torch.cat(rows, dim=1))).float()[0]  # one LM-head MatMul for all
        return (logits, torch.topk(logits, TOPK, dim=-1).indices, *[p for ps in present for p in ps])


def stack_projections(sd: dict, num_layers: int, q_scale: float = 1.0) -> dict:
    """transformers' names -> ours: q/k/v_proj -> qkv_proj (q rows times q_scale, the attention's D^-0.5,
    exact for D = 64 or 256), gate/up_proj -> gate_up_proj (concatenated)."""
    sd = dict(sd)
    for i in range(num_layers):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        for kind in ("weight", "bias"):
            if f"{a}q_proj.{kind}" in sd:
                q = sd.pop(f"{a}q_proj.{kind}") * q_scale
                sd[f"{a}qkv_proj.{kind}"] = torch.cat([q] + [sd.pop(f"{a}{n}_proj.{kind}") for n in "kv"])
            if f"{m}gate_proj.{kind}" in sd:
                sd[f"{m}gate_up_proj.{kind}"] = torch.cat([sd.pop(f"{m}{n}_proj.{kind}") for n in ("gate", "up")])
    return sd


def build(c: GraphConfig, state_dict: dict, slots: bool = False) -> LlamaGraph:
    """A LlamaGraph with the HF weights loaded (extra layers in state_dict are ignored for early exit)."""
    g = LlamaGraph(c, slots)
    state_dict = stack_projections(state_dict, c.num_layers, q_scale=c.head_dim ** -0.5)
    own = g.state_dict()
    missing = [k for k in own if k not in state_dict and not (k == "lm_head.weight" and c.tie_word_embeddings)]
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} weights the graph needs, e.g. {missing[:3]}")
    g.load_state_dict({k: state_dict[k] for k in own if k in state_dict}, strict=False)
    if c.tie_word_embeddings:
        g.lm_head.weight = g.model.embed_tokens.weight
    return g.eval()


def empty_inputs(c: GraphConfig, T: int, S: int, B: int = 1, dtype=torch.float32):
    """Inputs of one step with an empty cache and a causal new-token mask (for tracing)."""
    ids = torch.zeros(B, T, dtype=torch.long)
    pos = torch.arange(T).expand(B, T).contiguous()
    past_mask = torch.zeros(B, S, dtype=torch.bool)
    new_mask = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T).contiguous()
    kv = [torch.zeros(B, c.num_kv_heads, S, c.head_dim, dtype=dtype) for _ in range(2 * c.num_layers)]
    return (ids, pos, past_mask, new_mask, kv)
