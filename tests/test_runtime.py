"""Runtime refusals, torch-free import, and the exact distribution of speculative sampling."""
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.generation.logits_process import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

import specexport
from checkpoints import make_checkpoint, perturbed_copy
from conftest import build_bundle


def test_runtime_never_imports_torch_or_transformers(bundle_noisy):
    code = ("import sys, specexport, specexport.runtime\n"
            f"p = specexport.load({str(bundle_noisy)!r})\n"
            "g = p.generate('hello', max_new_tokens=8, draft='model', k=2, temperature=0.8, seed=1)\n"
            "p.generate('hello', max_new_tokens=8, draft='ngram', k=2)\n"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not bad, bad\n"
            "print(len(g.token_ids))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.strip()) >= 1


def test_refusals_before_any_work_and_pipeline_still_usable(bundle_noisy):
    pipe = specexport.load(bundle_noisy)
    with pytest.raises(ValueError, match="exceeds the bundle's capacity of 96"):
        pipe.generate("hello", max_new_tokens=95)
    with pytest.raises(ValueError, match="verify profiles for k in"):
        pipe.generate("hello", k=3)
    with pytest.raises(ValueError, match="temperature"):
        pipe.generate("hello", temperature=-1)
    with pytest.raises(ValueError, match="empty"):
        pipe.generate("", chat=False) if pipe.encode("") == [] else pipe.generate([])
    with pytest.raises(ValueError, match="draft must be one of"):
        pipe.generate("hello", draft="magic")
    assert len(pipe.generate("hello", max_new_tokens=5).token_ids) == 5


def test_nan_logits_are_refused(ckpts, tmp_path):
    import onnx
    from onnx import numpy_helper

    out = build_bundle(tmp_path / "b", ckpts["target"], ks=(2,))
    m = onnx.load(str(out / "target.onnx"))
    norm = max((i for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT), key=lambda i: i.ByteSize())
    w = numpy_helper.to_array(norm).copy()
    w[0] = np.nan
    norm.CopyFrom(numpy_helper.from_array(w, norm.name))
    onnx.save_model(m, str(out / "target.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="target.onnx.data", size_threshold=1024)
    pipe = specexport.load(out, verify=False)  # the sha256 check would refuse the edited bundle first
    with pytest.raises(FloatingPointError, match="NaN"):
        pipe.generate("hello", max_new_tokens=4, draft="ngram", k=2)
    with pytest.raises(Exception, match="sha256"):
        specexport.load(out)


# ---- the sampling distribution: small vocabulary, joint law of the first two tokens, chi-square

@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("sv")
    target = make_checkpoint(root / "t", layers=2, vocab=8, chars="abcde", seed=11, logit_scale=3.0)
    draft = perturbed_copy(target, root / "d", noise=0.8, seed=4)
    return target, build_bundle(root / "b", target, draft, ks=(1, 2), capacity=32, chunk=4)


def exact_joint(ckpt, prompt, temperature, top_p, eos=2):
    """P(x1, x2 | prompt) under the target with the same warping, from transformers' own warpers.
    An EOS first token ends the generation: its mass goes to cell (eos, 0)."""
    m = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    warp = LogitsProcessorList([TemperatureLogitsWarper(temperature), TopPLogitsWarper(top_p)])

    def dist(ids):
        with torch.no_grad():
            z = m(torch.tensor([ids])).logits[0, -1:].double()
        return torch.softmax(warp(None, z)[0], -1).numpy()

    p1 = dist(prompt)
    P = np.zeros((len(p1), len(p1)))
    for a in np.flatnonzero(p1 > 0):
        if a == eos:
            P[a, 0] = p1[a]
        else:
            P[a] = p1[a] * dist(prompt + [int(a)])
    return P


@pytest.mark.parametrize("sampler,draft,k", [("gumbel", "model", 2), ("rejection", "model", 2),
                                              ("rejection", "model", 1), ("rejection", "ngram", 2),
                                              ("rejection", "recycle", 2), ("gumbel", "recycle", 2)])
def test_speculative_sampling_distribution_is_the_targets(small_vocab, sampler, draft, k):
    """Chi-square goodness of fit of 3000 speculative samples of (x1, x2) against the target's exact joint
    law (temperature 0.9, top-p 0.9). Fails with probability 0.001 when the sampler is exact."""
    from scipy.stats import chisquare

    target, b = small_vocab
    pipe = specexport.load(b)
    prompt = [1, 3, 4, 3, 4, 3]  # repetitive, so the ngram drafter proposes too
    P = exact_joint(target, prompt, 0.9, 0.9)
    N = 3000
    counts = np.zeros_like(P)
    proposed = accepted = 0
    for seed in range(N):
        # x1 comes from the prefill; x2 from a verify call of k drafts (room for them: 2 + k new tokens)
        g = pipe.generate(prompt, max_new_tokens=2 + k, draft=draft, k=k, temperature=0.9, top_p=0.9,
                          seed=seed, sampler=sampler)
        ids = g.token_ids
        counts[ids[0], ids[1] if len(ids) > 1 else 0] += 1
        proposed, accepted = proposed + g.stats.proposed, accepted + g.stats.accepted
    assert 0 < accepted < proposed  # both branches of the acceptance rule ran
    assert counts[P == 0].sum() == 0  # nothing outside the warped support
    exp = P.ravel() * N
    big = exp >= 5  # pool the rare cells so the chi-square approximation holds
    f_obs = np.append(counts.ravel()[big], counts.ravel()[~big].sum())
    f_exp = np.append(exp[big], exp[~big].sum())
    keep = f_exp > 0
    p_value = chisquare(f_obs[keep], f_exp[keep] * f_obs[keep].sum() / f_exp[keep].sum()).pvalue
    assert p_value > 1e-3, (p_value, f_obs, f_exp)


def test_first_token_comes_from_the_prefill(small_vocab):
    """The first token is the last prompt row's argmax (transformers' eager model on the whole prompt) and costs
    no target call after the prefill, alone and on the engine; prompts of 1 token to several prefill chunks."""
    target, b = small_vocab
    pipe = specexport.load(b)
    m = AutoModelForCausalLM.from_pretrained(target).eval()
    for prompt in ([5], [1, 3, 4], [1, 3, 4, 3, 4, 3, 5, 6, 7, 3, 4]):
        with torch.no_grad():
            want = int(m(torch.tensor([prompt])).logits[0, -1].argmax())
        g = pipe.generate(prompt, max_new_tokens=1, draft="none")
        assert g.token_ids == [want] and g.stats.steps == 0 and g.stats.new_tokens == 1
        e = pipe.submit(prompt, max_new_tokens=1, draft="none").wait(60)
        assert e.token_ids == [want] and e.stats.steps == 0 and e.finish_reason == "length"
        two = pipe.generate(prompt, max_new_tokens=2, draft="none")
        assert two.token_ids[0] == want and two.stats.steps == 1
