"""graphs == transformers eager; ONNX (via the build's parity check: chunked prefill, partly filled cache,
every profile and capacity bucket) == eager, for the Llama-family variants we claim."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from checkpoints import make_checkpoint
from conftest import build_bundle
from specexport.graphs.config import from_hf
from specexport.graphs.llama import build, empty_inputs

VARIANTS = {
    "gqa-untied": dict(),
    "tied": dict(tie=True, kv_heads=4),
    "qwen2-bias": dict(arch="qwen2"),
    "mistral": dict(arch="mistral"),
    "llama3-rope": dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "linear-rope-mqa": dict(kv_heads=1, rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp(request.param) / "ckpt", seed=3, **VARIANTS[request.param])
    return request.param, path


def test_graph_matches_eager_with_partly_filled_cache(variant):
    _, path = variant
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    c = from_hf(hf)
    g = build(c, hf.state_dict())
    ids = torch.randint(0, c.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    S, n = 32, 13
    with torch.no_grad():
        want = hf(ids).logits[0]
        x = list(empty_inputs(c, n, S))
        x[0] = ids[:, :n]
        logits1, kv1 = g(*x)
        cache = [torch.zeros(1, c.num_kv_heads, S, c.head_dim) for _ in range(2 * c.num_layers)]
        for i in range(c.num_layers):  # slots 0..n-1 hold positions 0..n-1
            cache[2 * i][:, :, :n], cache[2 * i + 1][:, :, :n] = kv1[i, 0], kv1[i, 1]
        mask = torch.zeros(1, S, dtype=torch.bool)
        mask[:, :n] = True
        T = 20 - n
        logits2, _ = g(ids[:, n:], torch.arange(n, 20)[None], mask, torch.ones(T, T, dtype=torch.bool).tril()[None], cache)
    assert (logits1[0] - want[:n]).abs().max() < 1e-4
    assert (logits2[0] - want[n:]).abs().max() < 1e-4


def test_build_records_onnx_parity_for_every_profile(variant, tmp_path):
    name, path = variant
    out = build_bundle(tmp_path / "b", path, draft="self:layers=1", ks=(2, 3), capacity=64, chunk=8)
    m = json.loads((out / "manifest.json").read_text())
    for role in ("target", "draft"):
        e = m["models"][role]
        assert set(e["profiles"]) <= set(e["parity"])
        for prof, r in e["parity"].items():
            assert r["max_abs"] < 1e-4 and r["top1"] == 1.0, (name, role, prof, r)
    assert m["models"]["target"]["profiles"] == {"decode": 1, "prefill": 8, "verify_2": 3, "verify_3": 4}
    assert m["models"]["draft"]["kind"] == "early-exit" and m["models"]["draft"]["arch"]["num_layers"] == 1
