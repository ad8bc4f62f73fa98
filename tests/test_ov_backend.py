"""The OpenVINO backend (backends/ov.py) on tiny bundles: float32 gives onnxruntime's tokens with every draft;
bfloat16 is measured at load (a verify call against decode calls): on a `slots` graph its verify rows score
exactly as its decode rows and every draft gives its plain tokens, solo and batched; on a `portable` graph it
speculates only if that holds too, else refuses drafts with the number; a fused bundle is refused at load."""
import sys

import pytest

import specexport
from specexport.bench.config import extra_bundle
from specexport.bundle import BundleError
from specexport.cli import main
from conftest import build_bundle, cpu_has

pytest.importorskip("openvino", reason="backend openvino needs OpenVINO: pip install 'specexport[openvino]' "
                    "(scripts/setup.sh installs it)")

PROMPTS = ["hello world", "the quick brown fox", "abc abc abc abc", "1 2 3 4 5 6"]
DRAFTS = [("none", 4), ("model", 2), ("ngram", 4), ("recycle", 4)]


def test_openvino_f32_matches_onnxruntime(bundle_noisy, bundle_portable):
    with pytest.raises(BundleError, match="--attention slots"):
        specexport.load(bundle_noisy, backend="openvino")
    ort = specexport.load(bundle_portable)
    ov = specexport.load(bundle_portable, backend="openvino")
    e = ov.target.entry
    assert e.speculative and 0 <= e.verify_drift <= e.parity_tolerance  # measured at load, on OpenVINO
    for p in PROMPTS:
        want = ort.generate(p, max_new_tokens=30, draft="none").token_ids
        for draft, k in DRAFTS:
            assert ov.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == want, (p, draft)
    got = ov.generate_batch(PROMPTS, max_new_tokens=30, draft="recycle")  # the engine: pool rows, B > 1 calls
    assert [g.token_ids for g in got] == [ort.generate(p, max_new_tokens=30, draft="none").token_ids
                                          for p in PROMPTS]


@pytest.fixture(scope="module")
def bundle_slots(ckpts, tmp_path_factory):
    return build_bundle(tmp_path_factory.mktemp("b") / "slots", ckpts["target"], ckpts["noisy"], attention="slots")


def test_slots_graph_same_tokens(bundle_slots, bundle_noisy):
    """--attention slots in float32 generates what the fused graph does, with every draft, solo and batched,
    on onnxruntime and on OpenVINO."""
    fused = specexport.load(bundle_noisy)
    for backend in ("onnxruntime", "openvino"):
        pipe = specexport.load(bundle_slots, backend=backend)
        assert pipe.target.entry.attention == "slots" and pipe.target.entry.speculative
        for p in PROMPTS:
            want = fused.generate(p, max_new_tokens=30, draft="none").token_ids
            for draft, k in DRAFTS:
                assert pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == want, (backend, p, draft)
        got = pipe.generate_batch(PROMPTS, max_new_tokens=30, draft="recycle")
        assert [g.token_ids for g in got] == [fused.generate(p, max_new_tokens=30, draft="none").token_ids
                                              for p in PROMPTS], backend


def exact_chains_or_skip(chain: float, speculative: bool) -> None:
    """A chain's verify rows score exactly as its decode calls on OpenVINO where the CPU has AVX-512; elsewhere
    they round apart within the tolerance (the target still speculates), and the exact-token checks after it
    are skipped with the number."""
    assert speculative
    if not cpu_has("avx512f"):
        assert chain < 1e-4, chain
        pytest.skip(f"no AVX-512: OpenVINO's kernels round a chain's verify rows {chain:.2g} apart from its decode "
                    "calls here (within the tolerance), so chain drafts are not exactly its plain decoding")
    assert chain == 0.0


def test_openvino_bf16_slots_speculates_losslessly(bundle_slots):
    """bfloat16 is another model (its plain decoding is the reference, as for int4); on a slots graph a
    verify call scores a chain exactly as decode calls do, so chain drafts (a draft model, prompt lookup),
    solo or batched, give the plain tokens; trees are not drafted: their branches sit in other slots than
    decoding puts them, which bfloat16 rounds apart, so recycle drafts its tree's best path, a chain."""
    pipe = specexport.load(bundle_slots, backend="openvino-bf16")
    e = pipe.target.entry
    exact_chains_or_skip(e.verify_drift, e.speculative)
    plain = [pipe.generate(p, max_new_tokens=30, draft="none").token_ids for p in PROMPTS]
    for p, want in zip(PROMPTS, plain):
        for draft, k in DRAFTS[:3]:
            assert pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == want, (p, draft)
    assert pipe._recycler(pipe.config(draft="recycle"))().chain  # a chain where trees are not exact
    for p, want in zip(PROMPTS, plain):
        assert pipe.generate(p, max_new_tokens=30, draft="recycle").token_ids == want, p
    assert pipe.config().draft == "model"  # the bundle's separate draft model, a chain
    assert pipe._free_draft() == "recycle"  # what the engine runs by default here: as a chain
    for draft in (None, "none", "ngram", "recycle"):  # the engine: rows at different lengths, B > 1 verify calls
        got = pipe.generate_batch(PROMPTS, max_new_tokens=30, draft=draft)
        assert [g.token_ids for g in got] == plain, draft


def test_openvino_int4_is_its_own_target_and_speculates_on_chains(bundle_slots):
    """backend openvino-int4 quantises the float32 graph's weights at load (int4 projections, an int8 LM
    head): another model than float32 (its logits move), whose plain decoding is the reference. Its verify
    rows are measured at load: a chain scores exactly as decode calls (activations are quantised per row),
    so chain drafts give the plain tokens, solo and batched; a tree is drafted only if the check found
    trees exact too, else recycle drafts its best path."""
    import numpy as np

    from specexport.runtime.prefill import verify_drifts

    f32 = specexport.load(bundle_slots, backend="openvino")
    pipe = specexport.load(bundle_slots, backend="openvino-int4")
    m = pipe.target
    L = m.entry.arch["num_layers"]
    assert m.compressed == 4 * L + 1  # qkv, o, gate/up, down per layer and the LM head; not the rotary
    ids = [5, 9, 2, 7, 1]
    a, b = (x.target.step(x.target.new_cache(), ids, 0).logits for x in (f32, pipe))
    assert 1e-3 < np.abs(a - b).max() < 0.5 * np.abs(a).max()  # quantised, not broken
    chain, tree = verify_drifts(m)
    exact_chains_or_skip(chain, m.entry.speculative)
    assert m.exact_trees == (tree <= m.entry.parity_tolerance)
    plain = [pipe.generate(p, max_new_tokens=30, draft="none").token_ids for p in PROMPTS]
    for p, want in zip(PROMPTS, plain):
        for draft, k in DRAFTS[1:]:
            assert pipe.generate(p, max_new_tokens=30, draft=draft, k=k).token_ids == want, (p, draft)
    for draft in ("ngram", "recycle"):  # the engine: rows at different lengths, B > 1 verify calls
        got = pipe.generate_batch(PROMPTS, max_new_tokens=30, draft=draft)
        assert [g.token_ids for g in got] == plain, draft


def test_generate_cli_backend(bundle_slots, bundle_noisy, capsys):
    """`specexport generate --backend`: drafts run on bfloat16, a graph OpenVINO cannot speculate on is refused
    as a usage error that names the fix."""
    assert main(["generate", str(bundle_slots), "--backend", "openvino-bf16", "--prompt", "hi", "--max-new-tokens",
                 "6", "--draft", "ngram", "--json"]) == 0
    assert '"finish_reason"' in capsys.readouterr().out
    assert main(["generate", str(bundle_slots), "--backend", "openvino-bf16", "--prompt", "hi", "--max-new-tokens",
                 "6", "--draft", "recycle", "--json"]) == 0  # recycle drafts a chain there
    assert '"finish_reason"' in capsys.readouterr().out
    assert main(["generate", str(bundle_noisy), "--backend", "openvino", "--prompt", "hi"]) == 2
    assert "rebuild with --attention slots" in capsys.readouterr().err


def test_openvino_bf16_portable_measured_at_load(bundle_portable):
    """On a portable graph bfloat16 rounds [cache; new] attention's two halves apart: speculation is allowed
    only if the measured verify-vs-decode drift is within the tolerance, else refused with it."""
    from specexport.runtime.prefill import verify_drifts

    pipe = specexport.load(bundle_portable, backend="openvino-bf16")
    e = pipe.target.entry
    assert e.verify_drift is not None and e.speculative == (verify_drifts(pipe.target)[0] <= e.parity_tolerance)
    plain = pipe.generate(PROMPTS[0], max_new_tokens=30, draft="none").token_ids
    if not e.speculative:
        with pytest.raises(ValueError, match="bfloat16 math"):
            pipe.generate(PROMPTS[0], max_new_tokens=8, draft="recycle")
        assert pipe.generate(PROMPTS[0], max_new_tokens=30).token_ids == plain  # the default: plain


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack is read through Linux's libc")
def test_loading_keeps_the_threads_signal_stack(bundle_slots):
    """OpenVINO's compile_model gives the calling thread an alternate signal stack of its own and may unmap it
    later while the thread still points at it; Python's handlers run there, so a later SIGINT segfaulted
    (this suite, run in another order). Loading must leave the thread's stack as it was, and a signal
    afterwards is a KeyboardInterrupt."""
    import ctypes
    import os
    import signal

    from specexport.backends.ov import _Stack

    libc = ctypes.CDLL(None, use_errno=True)

    def stack():
        s = _Stack()
        assert libc.sigaltstack(None, ctypes.byref(s)) == 0
        return s.sp, s.flags, s.size

    before = stack()
    for backend in ("openvino", "openvino-bf16"):
        pipe = specexport.load(bundle_slots, backend=backend)
        assert stack() == before, backend
        pipe.generate(PROMPTS[0], max_new_tokens=4, draft="none")
        del pipe
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        signal.sigtimedwait([], 0.1)  # a bytecode boundary for the handler


def test_extra_bundle_backend_suffix():
    assert extra_bundle("ovb=bundles/x:openvino-bf16") == ("ovb", "bundles/x", "openvino-bf16")
    assert extra_bundle("c64=bundles/x") == ("c64", "bundles/x", "onnxruntime")
    assert extra_bundle("w=C:/dir") == ("w", "C:/dir", "onnxruntime")  # a colon that names no backend stays


def test_fixed_shape_models(bundle_slots, monkeypatch):
    """A sequence's decode and verify calls run on models compiled with B = 1 and their T fixed (the cache
    length dynamic); prefill and B-row calls on the dynamic one. In float32 both score a step alike and
    generate the same tokens; the batching engine drops them; SPECEXPORT_OV_FIXED turns them off ("0"), and
    "auto" keeps them for small weights only."""
    import numpy as np

    from specexport.backends import ov as ovb
    from specexport.errors import OptionError

    fixed = specexport.load(bundle_slots, backend="openvino")
    e = fixed.target.entry
    assert sorted(fixed.target.fixed) == sorted({T for n, T in e.profiles.items() if not n.startswith("prefill")})
    monkeypatch.setenv("SPECEXPORT_OV_FIXED", "0")
    dynamic = specexport.load(bundle_slots, backend="openvino")
    assert dynamic.target.fixed == {}
    P, T = e.profiles["prefill"], max(fixed.target.fixed)
    outs = []
    for pipe in (fixed, dynamic):
        cache = pipe.target.new_cache()
        first = pipe.target.step(cache, list(range(5, 5 + P)), 0)  # a prefill chunk: the dynamic model in both
        cache.commit(first.new_kv, range(P))
        outs.append(pipe.target.step(cache, list(range(3, 3 + T)), P).logits)  # a verify call
        req = cache.scratch[("ov", id(pipe.target), T)][1]
        shape = req.get_compiled_model().input("input_ids").get_partial_shape()
        assert str(shape) == (f"[1,{T}]" if pipe is fixed else "[?,?]"), shape
    assert np.allclose(outs[0], outs[1], atol=1e-4), float(np.abs(outs[0] - outs[1]).max())
    for p in PROMPTS:
        assert fixed.generate(p, max_new_tokens=20, draft="ngram").token_ids == \
            dynamic.generate(p, max_new_tokens=20, draft="none").token_ids, p
    # the engine's B-row calls run on the dynamic model: starting it drops the fixed ones (and re-measures),
    # so solo runs from then on score as batched ones do
    got = fixed.generate_batch(PROMPTS, max_new_tokens=20, draft="ngram")
    assert fixed.target.fixed == {} and fixed.target.entry.speculative
    assert [g.token_ids for g in got] == [fixed.generate(p, max_new_tokens=20, draft="none").token_ids
                                          for p in PROMPTS]
    monkeypatch.setenv("SPECEXPORT_OV_FIXED", "auto")
    monkeypatch.setattr(ovb, "FIXED_MAX_BYTES", 0)  # weights over the limit: no copies
    assert specexport.load(bundle_slots, backend="openvino").target.fixed == {}
    monkeypatch.setenv("SPECEXPORT_OV_FIXED", "yes")
    with pytest.raises(OptionError, match="SPECEXPORT_OV_FIXED must be auto, 0 or 1"):
        specexport.load(bundle_slots, backend="openvino")
