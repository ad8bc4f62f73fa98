"""The torch backend (graphs/ modules, device-resident ring buffer) gives the ONNX Runtime backend's tokens.
CUDA-graph capture and replay need a GPU: those tests are marked gpu and skipped, with a reason, without one."""
import pytest
import torch

import specexport

PROMPTS = ["hello world, hello world", "the cat sat on the mat. the cat"]


def test_torch_backend_matches_onnxruntime(bundle_noisy):
    ort_pipe = specexport.load(bundle_noisy)
    torch_pipe = specexport.load(bundle_noisy, backend="torch")
    for p in PROMPTS:
        for draft, k in [("none", 4), ("model", 2), ("ngram", 4)]:
            a = ort_pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids
            assert torch_pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == a, (p, draft)
    g = torch_pipe.generate(PROMPTS[0], max_new_tokens=30, temperature=0.8, seed=3, draft="model", k=2)
    assert g.token_ids == ort_pipe.generate(PROMPTS[0], max_new_tokens=30, temperature=0.8, seed=3, draft="none").token_ids


def test_torch_backend_batches_requests_on_its_device_pool(bundle_noisy, bundle_portable):
    """The engine on the torch backend: pool rows in a device tensor (CPU here), B > 1 calls that verify
    drafts too; every request == its solo run on the same backend. A backend without batch calls is refused
    at start_engine with the fix."""
    from specexport.errors import OptionError

    prompts = PROMPTS + ["abc abc abc abc", "Q: 12+7? A:", "to be or not to be"]
    pipe = specexport.load(bundle_noisy, backend="torch")
    want = [pipe.generate(p, max_new_tokens=24, draft="none").token_ids for p in prompts]
    pipe.start_engine(max_batch=4, warm=False)  # the cost table then holds only the calls the requests made
    drafts = ["none", "recycle", "ngram", "model", "model", "recycle"]  # model: the draft's own device pool
    cs = [pipe.submit(p, max_new_tokens=24, draft=d, k=4) for p, d in zip(prompts, drafts)]
    assert [c.wait(120).token_ids for c in cs] == want
    assert any(B > 1 for B in pipe.engine.stats()["draft_batch"]), pipe.engine.stats()
    seen = pipe.engine.costs.seen
    assert any(B > 1 and T > 1 for B, T in seen), seen  # batched verify calls ran
    assert type(pipe.engine.pool.data) is torch.Tensor
    dev = specexport.load(bundle_portable, backend="onnxruntime-device", device="cpu")
    with pytest.raises(OptionError, match="runs one sequence per call.*generate and stream"):
        dev.submit("hello", max_new_tokens=4)


def test_torch_backend_refuses_onnx_only_models(ckpts, tmp_path):
    from conftest import build_bundle

    out = build_bundle(tmp_path / "b", ckpts["target"], draft="self:int8", ks=(2,))
    with pytest.raises(ValueError, match="cannot run the int8 draft"):
        specexport.load(out, backend="torch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_graph_replay_matches_eager_and_cpu(bundle_noisy):
    cpu = specexport.load(bundle_noisy)
    eager = specexport.load(bundle_noisy, backend="torch", device="cuda")
    eager.target.cuda_graphs = eager.draft.cuda_graphs = False
    graphs = specexport.load(bundle_noisy, backend="torch", device="cuda")
    for p in PROMPTS:
        want = cpu.generate(p, max_new_tokens=30, draft="none").token_ids
        assert eager.generate(p, max_new_tokens=30, draft="model", k=2).token_ids == want
        assert graphs.generate(p, max_new_tokens=30, draft="model", k=2).token_ids == want


def test_onnxruntime_device_backend_matches_onnxruntime(bundle_noisy, bundle_portable):
    """IO binding by pointer into a torch-resident ring buffer (the CUDA EP's code path, run on the CPU EP);
    it binds the portable graph and refuses a fused one at load."""
    from specexport.bundle import BundleError

    with pytest.raises(BundleError, match="--attention portable"):
        specexport.load(bundle_noisy, backend="onnxruntime-device", device="cpu")
    ort_pipe = specexport.load(bundle_noisy)
    dev_pipe = specexport.load(bundle_portable, backend="onnxruntime-device", device="cpu")
    for p in PROMPTS:
        for draft, k in [("none", 4), ("model", 2), ("ngram", 4), ("recycle", 4)]:
            a = ort_pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids
            assert dev_pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == a, (p, draft)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_onnxruntime_cuda_matches_cpu(bundle_noisy, bundle_portable):
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider here (onnxruntime-gpu not installed)")
    cpu = specexport.load(bundle_noisy)
    cuda = specexport.load(bundle_portable, backend="onnxruntime-device", device="cuda")
    for p in PROMPTS:
        want = cpu.generate(p, max_new_tokens=30, draft="none").token_ids
        assert cuda.generate(p, max_new_tokens=30, draft="model", k=2).token_ids == want


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_tensorrt_matches_cpu(ckpts, tmp_path):
    pytest.importorskip("tensorrt", reason="TensorRT is not installed here")
    from conftest import build_bundle

    out = build_bundle(tmp_path / "trt", ckpts["target"], ckpts["noisy"], engine="tensorrt", engine_precision="fp32")
    cpu = specexport.load(out)
    trt = specexport.load(out, backend="tensorrt", device="cuda")
    for p in PROMPTS:
        want = cpu.generate(p, max_new_tokens=30, draft="none").token_ids
        for draft, k in [("none", 4), ("model", 2), ("recycle", 4)]:
            assert trt.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == want, (p, draft)


@pytest.mark.parametrize("slots", [False, True])
def test_graph_step_makes_no_tensor_off_the_inputs_device(slots):
    """CUDA-graph capture refuses any copy from host memory, and a tensor made on the CPU inside the step (a
    `torch.tensor(0.0)` constant, which eager CUDA silently accepts as a scalar) is one: on the H200 on 2026-12-04
    every captured step failed that way. Here, with no GPU: run the step with weights and inputs on the meta
    device and record the device of every tensor any op makes; all must be meta."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves, tree_map

    from specexport.graphs.config import GraphConfig
    from specexport.graphs.llama import LlamaGraph, empty_inputs

    class Devices(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.seen.setdefault(t.device.type, str(func))
            return out

    D = 16
    c = GraphConfig(arch="llama", rms_norm_eps=1e-5, rope_type="default", inv_freq=tuple(1e-4 ** (i / D) for i in
                    range(0, D, 2)), rope_scaling=1.0, qkv_bias=False, o_bias=False, mlp_bias=False, vocab_size=64,
                    hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=D,
                    tie_word_embeddings=True)
    g = LlamaGraph(c, slots=slots).to("meta")
    x = tree_map(lambda t: t.to("meta"), empty_inputs(c, T=3, S=8, B=2))
    with torch.no_grad(), Devices() as mode:
        logits, _ = g(*x)
    assert logits.shape == (2, 3, 64)
    assert set(mode.seen) == {"meta"}, f"the step made tensors on {mode.seen} (first op named)"


def test_torch_backend_in_bfloat16_is_plain_only_when_verify_rows_drift(bundle_noisy):
    """A lower-precision torch target measures its verify-vs-decode drift at load, as the build does for float32
    and the bf16 onnxruntime/OpenVINO backends do: beyond the tolerance speculation is refused with the number
    (on the H200 bf16 speculation changed the output in 3 of 4 draft settings). Plain decoding still runs."""
    from specexport import bundle
    from specexport.backends.torch_graphs import TorchBackend

    m = bundle.read(bundle_noisy)
    pipe = specexport.load(bundle_noisy, verify=False)
    pipe.target = TorchBackend(bundle_noisy, m.target, m.buckets, device="cpu", dtype=torch.bfloat16)
    e = pipe.target.entry
    assert e.verify_drift is not None and e.verify_drift > (e.parity_tolerance or 1e-3)  # bf16: ~1e-2 here
    assert not e.speculative and not e.exact_trees
    with pytest.raises(ValueError, match="bfloat16 math.*dtype=torch.float32"):
        pipe.generate(PROMPTS[0], max_new_tokens=8, draft="ngram")
    assert len(pipe.generate(PROMPTS[0], max_new_tokens=8, draft="none").token_ids) == 8
