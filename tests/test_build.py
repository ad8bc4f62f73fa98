"""Build outputs and every refusal: a clear error, and nothing half-written left behind."""
import json
import time

import numpy as np
import onnx
import specexport
import pytest

from checkpoints import make_checkpoint
from conftest import build_bundle, cpu_has
from specexport import bundle, kernels
from specexport.cli import main
from specexport.exporter.build import BuildConfig, DraftSpec, ParityError
from specexport.exporter.models import ModelNotFound


def leftovers(parent):
    return [p.name for p in parent.iterdir() if p.name.startswith(".")]


def test_bundle_contents_and_weight_sharing(bundle_noisy, ckpts):
    m = bundle.read(bundle_noisy)
    assert m.target.profiles == {"decode": 1, "prefill": 8, "verify_1": 2, "verify_2": 3, "verify_4": 5}
    assert m.draft.profiles == {"decode": 1, "catchup": 2, "prefill": 8}
    # one graph + one weights file per model, whatever the number of profiles; the target's mixed graph (the
    # batching engine's) reads the same weights file
    onnx_files = sorted(f for f in m.files if f.endswith(".onnx"))
    assert onnx_files == ["draft.onnx", "target.mixed.onnx", "target.onnx"]
    assert sorted(f for f in m.files if f.endswith(".data")) == ["draft.onnx.data", "target.onnx.data"]
    ckpt_bytes = (ckpts["target"] / "model.safetensors").stat().st_size
    assert (bundle_noisy / "target.onnx.data").stat().st_size <= 1.1 * ckpt_bytes
    mixed = onnx.load(str(bundle_noisy / "target.mixed.onnx"), load_external_data=False).graph
    places = {kv.value for t in mixed.initializer for kv in t.external_data if kv.key == "location"}
    assert places == {"target.onnx.data"}, places
    assert m.target.mixed == {"graph": "target.mixed.onnx", "groups": 1, "max_abs": 0.0}
    assert m.tokenizer["eos_token_ids"] == [2] and "<assistant>" in m.tokenizer["chat_template"]
    # fused attention by default: onnxruntime's GroupQueryAttention, cache buffers bound as past and present
    assert m.target.attention == m.draft.attention == "fused"
    names = [i["name"] for i in m.target.inputs]
    assert names[:6] == ["input_ids", "position_ids", "attn_bias", "seqlens_k", "total_len", "logit_rows"]
    assert names[6] == "past_key.0"
    # no new_kv: the node rotates q and k itself and writes the new K/V into the cache only
    assert [o["name"] for o in m.target.outputs][:3] == ["logits", "top_ids", "present_key.0"]
    graph = onnx.load(str(bundle_noisy / "target.onnx"), load_external_data=False).graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == m.target.arch["num_layers"]
    assert all({a.name: a.i for a in n.attribute}["do_rotary"] == 1 and n.input[9] == "position_ids" for n in gqa)
    # the fused graph also ranks each row's top-8 tokens (the recycle drafter's successor table reads them)
    from specexport.backends.ort import OrtBackend

    be = OrtBackend(bundle_noisy, m.target, m.buckets)
    whole = be.new_cache()
    out = be.step(whole, [3, 5, 7], 0)
    assert out.top.shape == (3, 8) and (out.top == np.argsort(-out.logits, axis=1, kind="stable")[:, :8]).all()
    # logits of some rows only (a prefill chunk's last): the graph skips the LM head of the others
    cache = be.new_cache()
    part = be.step(cache, [3, 5, 7], 0, rows=[2])
    assert part.logits.shape == (1, m.target.arch["vocab_size"]) and part.top.shape == (1, 8)
    np.testing.assert_allclose(part.logits[0], out.logits[2], atol=1e-5)
    assert (part.top[0] == out.top[2]).all() and part.new_kv is None and out.new_kv is None
    assert np.array_equal(cache.data[..., :3, :], whole.data[..., :3, :]) and cache.data[..., :3, :].any()


def test_portable_attention_same_tokens(bundle_portable, bundle_noisy, tmp_path):
    """--attention portable (standard ONNX ops: TensorRT, device backends) generates what fused does."""
    import specexport

    out = bundle_portable
    m = bundle.read(out)
    names = [i["name"] for i in m.target.inputs]
    assert m.target.attention == "portable" and names[:4] == ["input_ids", "position_ids", "past_mask", "new_mask"]
    assert m.target.inputs[3]["shape"] == ["B", "T", "T"]  # the tree-mask input, causal by default
    fused, portable = specexport.load(bundle_noisy), specexport.load(out)
    for draft, k in [("none", 1), ("model", 4), ("ngram", 2), ("recycle", 4)]:
        want = fused.generate("hello world hello", max_new_tokens=24, draft=draft, k=k)
        got = portable.generate("hello world hello", max_new_tokens=24, draft=draft, k=k)
        assert got.token_ids == want.token_ids, draft
        assert got.stats.steps == want.stats.steps or draft == "recycle"  # its tree size follows measured times
    with pytest.raises(ValueError, match="--attention portable"):
        BuildConfig(target="x", out=tmp_path / "z", engine="tensorrt", attention="fused")
    assert BuildConfig(target="x", out=tmp_path / "z", engine="tensorrt").resolved().attention == "portable"
    assert BuildConfig(target="x", out=tmp_path / "z").resolved().attention == "fused"
    assert BuildConfig(target="x", out=tmp_path / "z").attention is None  # the config itself is not patched


@pytest.mark.parametrize("spec,kind", [("self:int8", "int8"), ("self:int4", "int4"), ("self:layers=2", "early-exit")])
def test_derived_drafts(ckpts, tmp_path, spec, kind):
    import specexport
    from specexport.runtime.drafters import ModelDrafter, shares_cache
    from specexport.runtime.kv import SharedKV

    out = build_bundle(tmp_path / "b", ckpts["target"], draft=spec, ks=(2,))
    m = bundle.read(out)
    assert m.draft.kind == kind
    # the fused graphs' MLPs are MatMulSwiGLU nodes, defined in the graph as a function (what runs without the
    # kernels); a quantised copy has them back as plain ops, its gate/up projection a MatMulNBits like the others
    import onnx

    ops = {r: [n.op_type for n in onnx.load(str(out / e.graph), load_external_data=False).graph.node]
           for r, e in (("target", m.target), ("draft", m.draft))}
    layers = m.target.arch["num_layers"]
    assert ops["target"].count("MatMulSwiGLU") == layers and "Sigmoid" not in ops["target"]
    assert [f.name for f in onnx.load(str(out / m.target.graph), load_external_data=False).functions] == ["MatMulSwiGLU"]
    if kind != "early-exit":
        assert "MatMulSwiGLU" not in ops["draft"] and ops["draft"].count("Sigmoid") == layers
        assert ops["draft"].count("MatMulNBits") == 4 * layers + 1  # qkv, o, gate/up, down; the LM head
    pipe = specexport.load(out)
    plain = pipe.generate("hello world", max_new_tokens=20, draft="none").token_ids
    assert pipe.generate("hello world", max_new_tokens=20, draft="model", k=2).token_ids == plain
    # an int4 or int8 draft (built at int8 activations) runs specexport's MatMulNBits where it builds (AVX512-VNNI,
    # AVX2)
    lib = pipe.target.kernel
    assert pipe.draft.nbits == (kind in ("int4", "int8") and bool(lib) and kernels.matmul4_on(lib))
    # the default draft: the int4 or int8 self-draft where it runs on that kernel (on the engine with k sized per
    # step), else recycle (a self-draft on onnxruntime's kernels is slower than recycle)
    pays = bool(pipe.draft.nbits)
    assert pipe.config().draft == ("model" if pays else "recycle")
    c = pipe.submit("hello world", max_new_tokens=4)
    assert c.request[2].draft == ("model" if pays else "recycle") and (c.request[2].adaptive or not pays)
    assert c.wait(60).token_ids == plain[:4]
    pipe.close(10)
    # an int4/int8 copy reads the target's cache (no prefill, no cache of its own); the output above came that way
    assert shares_cache(pipe.target, pipe.draft) == (kind != "early-exit")
    if kind != "early-exit":
        d = ModelDrafter(pipe.draft, share=True)
        cache = pipe.target.new_cache()
        assert d.start([1, 2, 3], cache) == 0.0  # no prefill of its own
        assert isinstance(d.cache, SharedKV) and d.cache.data is cache.data
        cache.n = 2  # what the target's prefill would have committed
        d.propose([1, 2, 3], 2, lambda logits, pos: (int(logits.argmax()), None))
        assert cache.n == 2 and d.cache.n == 4  # the draft wrote slots 2..3 (free in the target), committed nothing


def test_default_draft_is_a_separate_checkpoint(bundle_noisy):
    import specexport

    assert specexport.load(bundle_noisy).config().draft == "model"


def test_existing_output_refused_without_force(bundle_noisy, ckpts):
    before = (bundle_noisy / "manifest.json").read_text()
    with pytest.raises(FileExistsError, match="--force"):
        build_bundle(bundle_noisy, ckpts["target"])
    assert (bundle_noisy / "manifest.json").read_text() == before


def test_force_replaces(ckpts, tmp_path):
    out = build_bundle(tmp_path / "b", ckpts["target"], ks=(2,))
    build_bundle(out, ckpts["target"], ks=(3,), force=True)
    assert bundle.read(out).target.verify_ks() == [3]
    assert leftovers(tmp_path) == []


def test_force_replaces_only_a_bundle_or_an_empty_directory(ckpts, tmp_path):
    """--force on a directory that is not a bundle (a typo'd --out, a home directory) is refused before any
    work and the directory keeps its files; on an empty one it builds."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a bundle"):
        build_bundle(victim, ckpts["target"], force=True)
    assert (victim / "precious.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="--capacity must be between"):
        build_bundle(tmp_path / "huge", ckpts["target"], capacity=bundle.MAX_CAPACITY + 1)
    empty = tmp_path / "empty"
    empty.mkdir()
    build_bundle(empty, ckpts["target"], ks=(2,), force=True)
    assert bundle.read(empty).target.verify_ks() == [2]


def test_parity_failure_leaves_nothing(ckpts, tmp_path):
    with pytest.raises(ParityError, match="tolerance"):
        build_bundle(tmp_path / "b", ckpts["target"], tolerance=1e-12)
    assert list(tmp_path.iterdir()) == []


def test_interrupted_build_leaves_nothing(ckpts, tmp_path):
    from specexport.exporter.build import build

    def interrupt(msg):
        if "parity" in msg:
            raise KeyboardInterrupt

    cfg = BuildConfig(target=str(ckpts["target"]), out=tmp_path / "b", capacity=64, prefill_chunk=8)
    with pytest.raises(KeyboardInterrupt):
        build(cfg, log=interrupt)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kw,match", [
    (dict(ks=(0,)), "k"), (dict(ks=(70,)), "does not fit"), (dict(capacity=4), "capacity"),
    (dict(prefill_chunk=0), "prefill-chunk"), (dict(prefill_chunk=1000), "prefill-chunk"),
    (dict(long_prefill=(64,)), "long-prefill"), (dict(long_prefill=(128,)), "long-prefill"),
    (dict(tolerance=0), "tolerance"), (dict(engine="tvm"), "engine"), (dict(engine=""), "engine"),
    (dict(attention="gqa"), "attention"), (dict(target_quant="int3"), "quantize-target"),
    (dict(target_quant="int4", target_activations="int4"), "target-activations"),
    (dict(engine="tensorrt", engine_precision="int8"), "engine-precision"),
])
def test_bad_options(kw, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        BuildConfig(**{"target": "x", "out": tmp_path / "b", "capacity": 64, **kw})


@pytest.mark.parametrize("spec", ["self:layers=x", "self:int3", "self:"])
def test_bad_draft_spec(spec):
    with pytest.raises(ValueError, match="self:layers=N"):
        DraftSpec.parse(spec)


def test_missing_and_uncached_models(tmp_path):
    with pytest.raises(ModelNotFound, match="neither a checkpoint directory"):
        build_bundle(tmp_path / "b", tmp_path / "nope")
    with pytest.raises(ModelNotFound, match="not in the local Hugging Face cache"):
        build_bundle(tmp_path / "b", "llama-160m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFound, match="config.json"):
        build_bundle(tmp_path / "b", tmp_path / "empty")
    assert not (tmp_path / "b").exists()


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="supported: LlamaForCausalLM"):
        build_bundle(tmp_path / "b", tmp_path / "gpt2")
    assert not (tmp_path / "b").exists()


def test_draft_with_other_vocabulary_refused(ckpts, tmp_path):
    other = make_checkpoint(tmp_path / "other", layers=1, chars="zyxwvutsrqponmlkjihgfedcba ")
    with pytest.raises(ValueError, match="tokenizer"):
        build_bundle(tmp_path / "b", ckpts["target"], draft=other)
    small_vocab = make_checkpoint(tmp_path / "v64", layers=1, vocab=96)
    with pytest.raises(ValueError, match="vocabulary size"):
        build_bundle(tmp_path / "b", ckpts["target"], draft=small_vocab)
    assert not (tmp_path / "b").exists()


def test_cli_bench_help(capsys):
    """`specexport bench --help` reaches the benchmark's own parser (options may come before the bundle)."""
    from specexport import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0 and "--per-category" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--per-category", "1"])
    assert e.value.code == 2 and "bundle" in capsys.readouterr().err


def test_cli_build_inspect_generate(ckpts, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["build", "--target", str(ckpts["target"]), "--draft", str(ckpts["noisy"]), "--k", "2,4",
                 "--capacity", "64", "--prefill-chunk", "8", "--out", str(out)]) == 0
    assert "verify_4" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    assert "decode@capacity" in capsys.readouterr().out
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["models"]["target"]["profiles"]["verify_2"] == 3
    assert main(["generate", str(out), "--prompt", "hello", "--max-new-tokens", "8", "--stats", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(res["token_ids"]) <= 8 and res["stats"]["steps"] >= 1
    assert main(["generate", str(out), "--prompt", "hello", "--k", "3"]) == 2
    assert "verify profiles for k in [2, 4]" in capsys.readouterr().err
    assert main(["build", "--target", str(ckpts["target"]), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def _cli_build(args: list, tty_stderr: bool) -> tuple[int, str, str]:
    """`specexport build ARGS` in a fresh process (third-party warnings that come once per process do come)
    -> (status, stdout, stderr); stderr on a 100-column terminal if tty_stderr, else a pipe."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios
    import threading
    from pathlib import Path

    cmd = [sys.executable, "-m", "specexport.cli", *args]
    env = {**os.environ, "ORT_DISABLE_TELEMETRY": "1"}
    root = Path(__file__).resolve().parents[1]
    if not tty_stderr:
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=600)
        return p.returncode, p.stdout, p.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, cwd=root, env=env)
    os.close(slave)
    chunks = []

    def read():
        while True:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the terminal's other side is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = p.stdout.read()
    p.wait(600)
    reader.join(10)
    os.close(master)
    return p.returncode, out, b"".join(chunks).decode(errors="replace")


def test_build_output_own_lines_bars_on_a_terminal_no_third_party_noise(ckpts, tmp_path):
    """stdout holds the build's own lines; stderr nothing when it is not a terminal (no transformers progress
    bar, no torch.onnx or onnxruntime warning); on a terminal, tqdm bars name each long stage, with the same
    lines on stdout; --verbose lets the third-party output through."""
    import re

    args = ["build", "--target", str(ckpts["target"]), "--draft", "self:int8", "--k", "2", "--capacity", "64",
            "--prefill-chunk", "8", "--batch", "1,2"]
    rc, out, err = _cli_build(args + ["--out", str(tmp_path / "a")], tty_stderr=False)
    assert rc == 0 and err == "", err[-2000:]
    lines = out.splitlines()
    assert lines[1:3] == ["[target] exporting 3-layer graph (B, T symbolic, S=64) ...", lines[2]]
    assert re.fullmatch(r"  \d+\.\d s", lines[2]) and any(x.startswith("built in ") for x in lines)
    rc, out_tty, err_tty = _cli_build(["--verbose"] + args + ["--out", str(tmp_path / "b")], tty_stderr=True)
    assert rc == 0
    for stage in ("[target] export", "[target] parity decode", "[target] parity batch B=2", "[target] parity verify drift",
                  "[draft] quantise", "[draft] parity prefill"):
        assert stage in err_tty, (stage, err_tty[-2000:])
    assert "Loading weights" in err_tty  # transformers' own bar: third-party output, shown with --verbose

    def shape(text):  # the lines without their measured numbers
        return [re.sub(r"\d+(\.\d+)?(e[-+]\d+)?", "N", x) for x in text.splitlines()]

    assert shape(out_tty) == shape(out)


def test_quantized_target(ckpts, tmp_path):
    import specexport

    out = build_bundle(tmp_path / "q", ckpts["target"], draft="self:layers=1", ks=(2,), target_quant="int8")
    m = bundle.read(out)
    assert m.target.kind == "int8" and m.target.graph == "target.int8.onnx"
    assert all(r["max_abs"] < 1e-4 for r in m.target.float32_graph_parity.values())
    assert m.target.speculative and m.target.verify_drift < 1e-4
    assert not (out / "target.onnx").exists()
    pipe = specexport.load(out)
    plain = pipe.generate("hello world", max_new_tokens=20, draft="none").token_ids
    assert pipe.generate("hello world", max_new_tokens=20, draft="model", k=2).token_ids == plain


def test_int8_activations_target_decodes_plainly(ckpts, tmp_path, capsys):
    """--target-activations int8: built at accuracy level 4, marked not speculative, refused with a draft."""
    import specexport

    with pytest.raises(ValueError, match="add --pad-decode, use --draft none"):
        BuildConfig(target="x", out=tmp_path / "z", draft=DraftSpec.parse("self:layers=1"), target_quant="int4",
                    target_activations="int8")
    with pytest.raises(ValueError, match="--pad-decode is for a target with int8 activations"):
        BuildConfig(target="x", out=tmp_path / "z", target_quant="int4", pad_decode=True)
    with pytest.raises(ValueError, match="--quantize-target"):
        BuildConfig(target="x", out=tmp_path / "z", target_activations="int8")
    out = build_bundle(tmp_path / "q", ckpts["target"], ks=(2,), target_quant="int4", target_activations="int8")
    m = bundle.read(out)
    assert m.target.activations == "int8" and m.target.speculative is False
    graph = onnx.load(str(out / m.target.graph), load_external_data=False)
    levels = {a.i for n in graph.graph.node if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"}
    assert levels == {4}
    pipe = specexport.load(out)
    g = pipe.generate("hello world", max_new_tokens=12)
    assert g.stats.steps == len(g.token_ids) - 1 and g.stats.proposed == 0  # default: plain (the first token: the prefill)
    for draft in ("ngram", "recycle"):
        with pytest.raises(ValueError, match="--target-activations float32"):
            pipe.generate("hello world", max_new_tokens=12, draft=draft)
    assert main(["generate", str(out), "--prompt", "hi", "--draft", "ngram"]) == 2
    assert "not be lossless" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is the target itself"):
        BuildConfig(target="x", out=tmp_path / "z", draft=DraftSpec("int8"), target_quant="int8")


def test_pad_decode_makes_int8_activation_chains_exact(ckpts, tmp_path, monkeypatch):
    """--pad-decode: every 1-token call runs with a pad token, so a verify call scores a chain exactly as one
    decode call per token does (0.0, where the same graph without the pad differs by rounding that cascades
    on a real model, tests/test_smollm2.py), and speculation with chain drafts is token-identical to plain
    decoding: prompt lookup and an early-exit draft model."""
    import dataclasses

    import specexport
    from specexport.backends.ort import OrtBackend
    from specexport.runtime.prefill import verify_drifts

    # the pad is for onnxruntime's own GroupQueryAttention kernel, whose 1-token rows sum in another order;
    # specexport's kernel scores a token alike in any call (checked at the end)
    monkeypatch.setenv("SPECEXPORT_KERNELS", "0")
    out = build_bundle(tmp_path / "q", ckpts["target"], draft="self:layers=1", ks=(2, 4), target_quant="int4",
                       target_activations="int8", pad_decode=True)
    m = bundle.read(out)
    assert m.target.pad_decode and m.target.speculative and m.target.activations == "int8"
    assert json.loads(m.to_json())["models"]["target"]["notes"]["pad_decode"] is True
    exact = cpu_has("avx512_vnni")  # else MLAS's int8 rows round apart across call sizes: within the tolerance
    for seed in (0, 1, 2):
        model = OrtBackend(out, m.target, m.buckets)
        padded = verify_drifts(model, seed)[0]
        bare = verify_drifts(OrtBackend(out, dataclasses.replace(m.target, pad_decode=False), m.buckets), seed)[0]
        if exact:
            assert padded == 0.0 and bare > 0.0, (seed, padded, bare)
        else:
            assert padded < 1e-4 and model.entry.speculative, (seed, padded)
    if not exact:
        pytest.skip(f"no avx512_vnni: onnxruntime's int8 MatMulNBits rounds a row apart across call sizes here "
                    f"(a chain {padded:.2g} from its decode calls, within the tolerance): chains do not verify exactly")
    pipe = specexport.load(out)
    accepted = 0
    for prompt in ("hello world", "one two three one two three one two", "a b c d e f g"):
        plain = pipe.generate(prompt, max_new_tokens=30, draft="none")
        assert plain.stats.steps == len(plain.token_ids) - 1
        for draft in ("ngram", "model"):
            g = pipe.generate(prompt, max_new_tokens=30, draft=draft, k=4)
            assert g.token_ids == plain.token_ids, (prompt, draft)
            accepted += g.stats.accepted
    assert accepted > 0  # drafts were accepted, so verify rows did stand in for decode calls
    # the engine pads a lone row's 1-token call too: a request alone on it is its solo run
    pipe.start_engine(max_batch=2, warm=False)
    try:
        for draft in ("none", "ngram"):
            c = pipe.submit("one two three one two three one two", max_new_tokens=30, draft=draft, k=4)
            assert c.wait().token_ids == pipe.generate("one two three one two three one two", max_new_tokens=30,
                                                       draft="none").token_ids
    finally:
        pipe.close()
    # at load the chain is measured again on this onnxruntime; were the pad to stop making it exact (here: the
    # pad taken away, against a tolerance below this small model's 5e-7 unpadded drift) drafts are refused
    import specexport.backends.ort as sx_ort

    strict = dataclasses.replace(m.target, parity_tolerance=1e-9)
    assert OrtBackend(out, strict, m.buckets).entry.speculative
    padding = sx_ort.pad_decode
    monkeypatch.setattr(sx_ort, "pad_decode", lambda ids, positions, rows: (ids, positions, None, rows, lambda o: o))
    unpadded = OrtBackend(out, strict, m.buckets).entry
    assert not unpadded.speculative and unpadded.verify_drift > 0
    monkeypatch.setattr(sx_ort, "pad_decode", padding)
    # where only chains are exact, recycle drafts its tree's best path (on this small model trees are exact too)
    assert pipe._recycler(pipe.config(draft="recycle"))().chain is (not m.target.exact_trees)
    chained = specexport.load(out)
    chained.target.entry = dataclasses.replace(chained.target.entry, exact_trees=False)
    for prompt in ("hello world", "one two three one two three one two"):
        g = chained.generate(prompt, max_new_tokens=30, draft="recycle")
        assert g.token_ids == pipe.generate(prompt, max_new_tokens=30, draft="none").token_ids
    # specexport's kernel: verify rows score chains and trees exactly as decode calls, with or without the pad
    monkeypatch.setenv("SPECEXPORT_KERNELS", "1")
    for entry in (m.target, dataclasses.replace(m.target, pad_decode=False)):
        model = OrtBackend(out, entry, m.buckets)
        assert model.kernel and verify_drifts(model, 0) == (0.0, 0.0)


def test_short_name_resolves_from_local_hf_cache(ckpts, tmp_path, monkeypatch):
    """`--draft llama-68m` finds JackFram/llama-68m in the local Hugging Face cache (no network)."""
    import shutil

    from specexport.exporter.models import resolve

    snap = tmp_path / "hub" / "models--JackFram--llama-68m" / "snapshots" / ("a" * 40)
    shutil.copytree(ckpts["small"], snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve("llama-68m") == snap
    assert resolve("JackFram/llama-68m") == snap


def test_tensorrt_engine_without_tensorrt_or_gpu_fails_first_and_leaves_nothing(ckpts, tmp_path):
    try:
        import tensorrt  # noqa: F401
        import torch
        if torch.cuda.is_available():
            pytest.skip("TensorRT and a GPU are here: the refusal cannot happen")
    except ImportError:
        pass
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match="TensorRT|GPU"):
        build_bundle(tmp_path / "b", ckpts["target"], engine="tensorrt")
    assert time.perf_counter() - t0 < 5  # refused before the export, not after it
    assert list(tmp_path.iterdir()) == []


def test_engine_built_for_another_gpu_or_version_is_refused():
    from specexport.exporter.tensorrt import mismatch

    rec = {"file": "target.plan", "tensorrt": "10.3.0", "gpu": "NVIDIA H200", "compute_capability": "9.0"}
    assert mismatch(rec, dict(rec)) is None
    assert "gpu" in mismatch(rec, {**rec, "gpu": "NVIDIA L4", "compute_capability": "8.9"})
    assert "10.3.0" in mismatch(rec, {**rec, "tensorrt": "10.7.0"})


def test_seeded_successor_table(bundle_noisy, bundle_portable):
    """The build ships the successor table its own seeding generation learnt, every pipeline starts from a copy
    of it, and drafting from it changes no token; a bundle built with seed_tokens=0 has none."""
    from specexport.exporter import seed

    pipe = specexport.load(bundle_noisy)
    info = pipe.manifest.successors
    assert info["file"] == seed.FILE and info["prompts"] > 0 and info["tokens"] > 0
    assert pipe.manifest.build["seed_tokens"] == 24 and pipe.manifest.build["timings"]["seed_s"] >= 0
    shipped = {tuple(r) for r in pipe.seed.to_array().tolist()}
    assert len(shipped) > 10
    # the file holds what the seeding learnt: the same generation from an empty table learns the same contexts
    # and successors (not bit for bit: the prefill's chunking follows measured times, and this random model's
    # lower-ranked logits lie close enough for that to reorder a few)
    pipe.successors = type(pipe.seed)(pipe.manifest.target.arch["vocab_size"])
    assert seed.learn(pipe, 24) == (info["prompts"], info["tokens"])
    a = {r[:3]: r[3:] for r in shipped}
    b = {tuple(r[:3]): tuple(r[3:]) for r in pipe.successors.to_array().tolist()}
    common = set(a) & set(b)
    assert len(common) >= 0.6 * max(len(a), len(b))  # 192-207 of 213 in runs on an idle and a busy machine
    assert sum(a[c][0] == b[c][0] for c in common) >= 0.8 * len(common)
    # a fresh table is a copy: learning in it leaves the seed as shipped
    fresh = specexport.load(bundle_noisy)
    assert {tuple(r) for r in fresh.successors.to_array().tolist()} == shipped
    prompt = [5, 9, 13, 5, 9, 17, 21]
    plain = fresh.generate(prompt, max_new_tokens=20, draft="none").token_ids
    g = fresh.generate(prompt, max_new_tokens=20, draft="recycle")
    assert g.token_ids == plain and g.stats.steps < len(plain)
    assert {tuple(r) for r in fresh.seed.to_array().tolist()} == shipped
    assert {tuple(r) for r in fresh.successors.to_array().tolist()} != shipped
    bare = specexport.load(bundle_portable)
    assert bare.manifest.successors == {} and bare.seed is None and not bare.successors.ctx
    assert f"seeded from {info['tokens']} tokens on {info['prompts']} prompts" in bundle.describe(pipe.manifest)
    assert "successor table: none shipped" in bundle.describe(bare.manifest)
