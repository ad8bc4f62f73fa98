"""Ring buffer with sentinel integers, manifest round-trip and refusals, sampler warps vs transformers."""
import json
import shutil

import numpy as np
import pytest
import torch

from specexport import bundle
from specexport.runtime.kv import RingKV
from specexport.runtime.sampling import SamplingParams, gumbel_argmax, gumbel_noise, kept, warp


def kv_rows(T, start, L=2, H=1, D=2):
    """new_kv [L,2,1,H,T,D] whose value at row t is the sentinel start + t."""
    return np.broadcast_to((start + np.arange(T, dtype=np.float32))[None, None, None, None, :, None],
                           (L, 2, 1, H, T, D)).copy()


def test_ring_commit_rollback_and_growth():
    c = RingKV(2, 1, [4, 8], 2)
    assert c.S == 4
    c.commit(kv_rows(3, 100), [0, 1, 2])
    assert c.n == 3 and c.data[0, 0, 0, 0, :3, 0].tolist() == [100, 101, 102]
    assert c.mask()[0].tolist() == [True, True, True, False]
    c.commit(kv_rows(4, 200), [0, 2], count=1)  # accept row 0 only: rollback writes nothing else
    assert c.n == 4 and c.data[1, 1, 0, 0, 3, 1] == 200
    c.commit(kv_rows(2, 300), [0, 1])  # outgrows bucket 4 -> 8, old slots kept
    assert c.S == 8 and c.data[0, 0, 0, 0, :6, 0].tolist() == [100, 101, 102, 200, 300, 301]
    c.truncate(2)
    assert c.mask()[0].tolist() == [True, True] + [False] * 6
    c.commit(kv_rows(1, 400), [0])
    assert c.data[0, 0, 0, 0, 2, 0] == 400 and c.n == 3
    with pytest.raises(ValueError):
        c.truncate(5)


def test_commit_of_rows_written_in_place():
    """A fused graph writes a step's T rows at slots n..n+T-1 itself (new_kv None): commit moves the accepted
    ones down to n, n+1, ... (a tree's path skips nodes) and leaves the rest as free slots."""
    from specexport.runtime.kv import KVPool

    c = RingKV(2, 1, [16], 2)
    c.commit(kv_rows(3, 100), [0, 1, 2])
    c.data[..., 3:9, :] = (200 + np.arange(6, dtype=np.float32))[:, None]  # the step's 6 nodes, in place
    c.commit(None, [0, 2, 5])  # the accepted path: nodes 0, 2, 5
    assert c.n == 6 and c.data[1, 1, 0, 0, :6, 0].tolist() == [100, 101, 102, 200, 202, 205]
    c.commit(None, [0, 1])  # a chain's accepted prefix: already in its slots
    assert c.n == 8 and c.data[0, 0, 0, 0, 6:8, 1].tolist() == [203, 204]
    pool = KVPool(2, 1, [16], 2, rows=3, fixed=True)
    pool.n[:] = [4, 2, 0]
    pool.data[:, :, 1, :, 2:6] = (300 + np.arange(4, dtype=np.float32))[:, None]
    before = pool.data.copy()
    pool.commit(1, None, 1, [0, 3])
    assert pool.n.tolist() == [4, 4, 0] and pool.data[0, 1, 1, 0, 2:4, 0].tolist() == [300, 303]
    assert np.array_equal(pool.data[:, :, [0, 2]], before[:, :, [0, 2]])  # other rows untouched


def test_ring_wraps_at_capacity():
    c = RingKV(1, 1, [4], 1)
    c.commit(kv_rows(4, 0, L=1, D=1), range(4))
    c.commit(kv_rows(2, 10, L=1, D=1), range(2))  # positions 4, 5 -> slots 0, 1 (a sliding window)
    assert c.data[0, 0, 0, 0, :, 0].tolist() == [10, 11, 2, 3] and c.mask().all()


def test_manifest_round_trip_and_refusals(bundle_noisy, tmp_path):
    m = bundle.read(bundle_noisy)
    assert bundle.Manifest.from_dict(json.loads(m.to_json())) == m
    bad = tmp_path / "bad"
    shutil.copytree(bundle_noisy, bad)
    d = json.loads((bad / "manifest.json").read_text())
    (bad / "manifest.json").write_text(json.dumps({**d, "format_version": 99}))
    with pytest.raises(bundle.BundleError, match="rebuild"):
        bundle.read(bad)
    (bad / "manifest.json").write_text(json.dumps(d))
    with open(bad / "target.onnx.data", "r+b") as f:  # one flipped byte
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(bundle.BundleError, match="target.onnx.data does not match its sha256"):
        bundle.read(bad)
    (bad / "target.onnx.data").unlink()
    with pytest.raises(bundle.BundleError, match="missing"):
        bundle.read(bad)
    with pytest.raises(bundle.BundleError, match="no manifest.json"):
        bundle.read(tmp_path)


def test_bad_bundle_refused_at_load(bundle_noisy, tmp_path):
    import specexport

    bad = tmp_path / "bad"
    shutil.copytree(bundle_noisy, bad)
    (bad / "tokenizer" / "tokenizer.json").write_text("{}")
    with pytest.raises(bundle.BundleError, match="tokenizer"):
        specexport.load(bad)


@pytest.mark.parametrize("t,k,p", [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.3, 0, 0.8), (0.9, 20, 0.9)])
def test_warp_matches_transformers(t, k, p):
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    logits = np.random.default_rng(0).normal(size=128).astype(np.float32) * 3
    procs = LogitsProcessorList([TemperatureLogitsWarper(t)] + ([TopKLogitsWarper(k)] if k else []) +
                                ([TopPLogitsWarper(p)] if p < 1 else []))
    want = torch.log_softmax(procs(None, torch.tensor(logits)[None].double())[0], -1).numpy()
    got = warp(logits, SamplingParams(temperature=t, top_k=k, top_p=p))
    assert np.array_equal(np.isinf(got), np.isinf(want))
    keep = np.isfinite(want)
    assert np.allclose(got[keep], want[keep], atol=1e-9)


def test_top_p_partial_sort_equals_full_sort_with_ties():
    """top-p sorts only the most likely tokens: same kept set as a full stable sort, also with many ties and
    with a flat distribution (where the candidate set must grow to the whole vocabulary)."""
    def full_sort(logits, sp):
        x = logits.astype(np.float64) / sp.temperature
        x = x - np.log(np.exp(x - x.max()).sum()) - x.max()
        order = np.argsort(x, kind="stable")
        drop = np.cumsum(np.exp(x[order])) <= 1.0 - sp.top_p
        drop[-1] = False
        return np.setdiff1d(np.arange(len(x)), order[drop])

    rng = np.random.default_rng(0)
    for i in range(60):
        v = [rng.integers(0, 6, 3000), rng.normal(size=3000) * 4, np.zeros(3000)][i % 3].astype(np.float32)
        sp = SamplingParams(temperature=float(rng.uniform(0.3, 2.0)), top_p=float(rng.uniform(0.05, 0.99)))
        assert np.array_equal(np.flatnonzero(np.isfinite(warp(v, sp))), full_sort(v, sp)), (i, sp)


def test_gumbel_noise_depends_on_seed_position_and_token_only():
    a = gumbel_noise(3, 10, 50)
    assert np.array_equal(a, gumbel_noise(3, 10, 50))
    assert not np.array_equal(a, gumbel_noise(3, 11, 50)) and not np.array_equal(a, gumbel_noise(4, 10, 50))
    ids = np.array([49, 0, 7, 7])
    assert np.array_equal(gumbel_noise(3, 10, ids), a[ids])  # a subset costs only itself, same values


def test_gumbel_noise_is_standard_gumbel_and_independent():
    from scipy.stats import gumbel_r, kstest, pearsonr

    g = np.concatenate([gumbel_noise(seed, pos, 2000) for seed in (0, 1, 2 ** 62) for pos in range(0, 60, 3)])
    assert kstest(g, gumbel_r.cdf).pvalue > 1e-3  # fails with probability 0.001 for true Gumbel noise
    a, b = gumbel_noise(5, 100, 20000), gumbel_noise(5, 101, 20000)  # neighbouring positions
    assert abs(pearsonr(a, b)[0]) < 4 / np.sqrt(20000)


@pytest.mark.parametrize("vocab,top_p", [(50, 1.0), (49152, 1.0), (49152, 0.9), (3000, 0.5)])
def test_gumbel_argmax_equals_the_full_pass(vocab, top_p):
    """The pruned Gumbel-max picks the token a full pass over every token's noise picks (gap 0.1: the winner is
    often outside the near set, so the threshold path decides)."""
    rng = np.random.default_rng(vocab)
    for pos in range(40):
        logits = (rng.standard_normal(vocab) * rng.uniform(0.5, 6)).astype(np.float32)
        sp = SamplingParams(temperature=float(rng.uniform(0.3, 1.5)), top_p=top_p)
        want = int(np.argmax(warp(logits, sp) + gumbel_noise(7, pos, vocab)))
        assert gumbel_argmax(*kept(logits, sp), 7, pos) == want and gumbel_argmax(*kept(logits, sp), 7, pos, gap=0.1) == want


@pytest.mark.parametrize("kw,match", [(dict(temperature=-1), "temperature"), (dict(temperature=float("nan")), "temperature"),
                                      (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"),
                                      (dict(sampler="beam"), "sampler"), (dict(seed=-1), "seed")])
def test_bad_sampling_params(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_tree_inputs_and_walk_follow_the_branch_the_target_picks():
    from specexport.runtime.accept import Picker
    from specexport.runtime.sampling import SamplingParams
    from specexport.runtime.accept import accept_tree
    from specexport.runtime.drafters import Tree

    # root 5 -> children 1 (node 1) and 2 (node 2); node 2 -> 3 (node 3)
    t = Tree(tokens=[5, 1, 2, 3], parent=[-1, 0, 0, 2], depth=[0, 1, 1, 2], score=[1.0, 0.5, 0.4, 0.2],
             ctx=[(5,), (5, 1), (5, 2), (5, 2, 3)])
    ids, pos, mask = t.inputs(5, N=10)
    assert ids == [5, 1, 2, 3, 0]
    assert pos.tolist() == [9, 10, 10, 11, 9]
    want = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 0, 1]], bool)
    assert (mask[0] == want).all()
    logits = np.zeros((5, 6), np.float32)
    logits[0, 2] = logits[2, 3] = logits[3, 4] = logits[1, 0] = 1.0  # the target walks root -> 2 -> 3, then says 4
    emitted, rows = accept_tree(logits, t, 5, 10, Picker(SamplingParams()))
    assert emitted == [2, 3, 4] and rows == [0, 2, 3]
    emitted, rows = accept_tree(logits, t, 2, 10, Picker(SamplingParams()))  # only node 1 was verified
    assert emitted == [2] and rows == [0]


def test_successor_table_keeps_top_w_in_order_longest_context_first():
    from specexport.runtime.drafters import SuccessorTable

    tab = SuccessorTable(vocab=10, width=3)
    logits = np.array([[0, 5, 1, 9, 2, 0, 0, 7, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 3]], np.float32)
    tab.observe([(4,), (2, 8, 6)], logits)
    assert tab.succ[4].tolist() == [3, 7, 1] and tab.succ[6].tolist() == [9, 0, 1]
    assert (tab.succ[0] == -1).all()
    tab.observe([(1, 6)], np.eye(10, dtype=np.float32)[[5]])  # after (1, 6): 5 first, then ties in index order
    w = 3
    assert tab.succ[6].tolist() == [5, 0, 1]  # order 1 keeps the latest
    # order 3 first, then what order 1 adds
    assert tab.candidates((2, 8, 6)) == [(2 * w, 9), (2 * w + 1, 0), (2 * w + 2, 1), (0, 5)]
    assert tab.candidates((0, 1, 6)) == [(w, 5), (w + 1, 0), (w + 2, 1)]  # (0, 1, 6) unseen: order 2
    # ids ranked by the graph (a fused bundle's top_ids) are taken as they are, cut to the table's width
    tab.observe([(4,)], logits[:1], top=np.array([[8, 2, 5, 1]]))
    assert tab.succ[4].tolist() == [8, 2, 5]
    assert tab.candidates((3,)) == []


def test_recycle_chain_is_the_trees_best_path():
    """chain=True (targets where only a chain's verify rows are exact): the draft is a path from the root,
    each node the highest-scored child of the one before in the tree the same drafter would build, with the
    node's contexts and candidate lists kept (the drafter learns from them after the call)."""
    from specexport.runtime.drafters import RecycleDrafter, SuccessorTable

    rng = np.random.default_rng(0)
    tab = SuccessorTable(vocab=50, width=4)
    seq = rng.integers(0, 50, 400).tolist()
    for i in range(3, len(seq)):
        tab.observe([tuple(seq[i - 3:i])], rng.normal(size=(1, 50)).astype(np.float32))
    tokens = seq[:200] + seq[100:120]  # a repeat, so prompt lookup proposes too
    tree = RecycleDrafter(tab).draft(tokens, 32, 8)
    for nodes in (1, 4, 8):
        chain = RecycleDrafter(tab, chain=True).draft(tokens, nodes, 8)
        assert 2 <= len(chain) <= nodes + 1 and chain.parent == list(range(-1, len(chain) - 1))
        assert chain.depth == list(range(len(chain)))
        i = 0  # walk the full tree by best child: the chain's tokens, scores and contexts
        for j in range(1, len(chain)):
            kids = [c for c in range(len(tree)) if tree.parent[c] == i]
            i = max(kids, key=lambda c: tree.score[c])
            assert (chain.tokens[j], chain.score[j], chain.ctx[j]) == (tree.tokens[i], tree.score[i], tree.ctx[i])
            assert chain.cands[j] == tree.cands[i]
        assert all(a >= b for a, b in zip(chain.score, chain.score[1:]))


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    from specexport.runtime.drafters import NgramDrafter

    def brute(seq, max_n, k):  # the definition, one window at a time
        L = len(seq)
        for n in range(min(max_n, L - 1), 0, -1):
            for e in range(L - 2, n - 2, -1):  # match ending at e, latest first
                if seq[e - n + 1:e + 1] == seq[L - n:]:
                    return seq[e + 1:e + 1 + k]
        return []

    rng = np.random.default_rng(0)
    hits = 0
    for trial in range(400):
        seq = rng.integers(0, 4 if trial % 2 else 12, size=rng.integers(1, 40)).tolist()
        max_n, k = int(rng.integers(1, 5)), int(rng.integers(1, 6))
        props, qs, _ = NgramDrafter(max_n).propose(seq, k)
        assert props == brute(seq, max_n, k), (seq, max_n, k)
        assert qs == [None] * len(props)
        hits += bool(props)
    assert 100 < hits < 400  # both outcomes were exercised
    assert NgramDrafter(3).propose([5, 6, 7, 5, 6, 9, 5, 6], 2, None)[0] == [9, 5]  # latest match wins
    assert NgramDrafter(3).propose([1, 2, 3, 9, 2, 3, 4, 1, 2, 3], 3, None)[0] == [9, 2, 3]  # longest wins


def test_step_costs_prices_unmeasured_calls_from_measured_ones():
    from specexport.runtime.costs import StepCosts

    c = StepCosts()
    assert c.cost(1, 5) > c.cost(1, 1)  # the prior before anything is measured: more rows cost more
    c.update(1, 1, 0.030)
    assert abs(c.cost(1, 5) - 0.030 * 1.2) < 1e-9  # one size measured: 5% per extra row
    c.update(8, 1, 0.044)  # 8 rows: 2 ms per extra row, a line through both
    assert abs(c.cost(8, 5) - (0.030 + 0.002 * 39)) < 1e-6 and c.cost(8, 1) == 0.044
    # the batch's expected tokens per second decide T: 8 rows each expecting 1.6 tokens from T=5 lose to T=1
    assert c.best(8, [1, 5], lambda T: 8 * (1.6 if T == 5 else 1.0)) == 1
    assert c.best(1, [1, 5], lambda T: 1.6 if T == 5 else 1.0) == 5
    # a B between two measured ones of its T: the line in B between them, whatever the fit through all says
    d = StepCosts()
    for B, ms in ((1, 4.2), (4, 8.8), (8, 20.0), (16, 70.0)):  # faster than a line: the fit's intercept < 0
        d.update(B, 1, ms / 1000)
    assert abs(d.cost(7, 1) - (8.8 + (20.0 - 8.8) * 3 / 4) / 1000) < 1e-9
    assert abs(d.cost(12, 1) - 0.045) < 1e-9
    assert d.cost(32, 1) == 0.070  # above every measured B: the scaled one-row call (11 ms), but never below 16 rows'


def test_option_literals_have_one_home():
    """draft and sampler values: the Literal types of DecodeConfig and SamplingParams are the tuples the
    configs and the API's argument checks refuse others by."""
    import typing

    from specexport.runtime import validate
    from specexport.runtime.decoder import DRAFTS, DecodeConfig
    from specexport.runtime.sampling import SAMPLERS

    assert typing.get_args(typing.get_type_hints(DecodeConfig)["draft"]) == DRAFTS == validate.DRAFTS
    assert DRAFTS == ("model", "ngram", "recycle", "none")
    assert typing.get_args(typing.get_type_hints(SamplingParams)["sampler"]) == SAMPLERS == validate.SAMPLERS
    with pytest.raises(ValueError, match="draft must be one of model, ngram, recycle, none, got 'tree'"):
        DecodeConfig(draft="tree")
    with pytest.raises(ValueError, match="sampler must be one of gumbel, rejection"):
        SamplingParams(sampler="typical")


@pytest.mark.parametrize("r", [0.0, 0.3, 0.8, 0.99])
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_chain_law_and_its_slope(r, n):
    """chain_tokens is 1 + r + ... + r^(n-1); chain_slope its derivative in r (central difference)."""
    from specexport.runtime.costs import chain_slope, chain_tokens

    assert chain_tokens(r, n) == pytest.approx(sum(r ** j for j in range(n)))
    h = 1e-6
    want = (chain_tokens(r + h, n) - chain_tokens(max(r - h, 0.0), n)) / (r + h - max(r - h, 0.0))
    assert chain_slope(r, n) == pytest.approx(want, rel=1e-4, abs=1e-6)


def test_doubt_cell_is_the_softmax_bins():
    """drafters.model.Doubt.cell (float32, one pass) puts a proposal in the bins of its float64 softmax
    probability and margin over the runner-up, at the argmax and elsewhere (the first and last token too, where
    one of the runner-up's slices is empty), and does not overflow on large logits."""
    from specexport.runtime.drafters.model import Doubt

    rng = np.random.default_rng(0)
    d = Doubt()
    for scale, shift in ((1.0, 0.0), (8.0, 0.0), (3.0, 500.0), (20.0, 0.0)):
        logits = (rng.standard_normal(49152) * scale + shift).astype(np.float32)
        x = logits.astype(np.float64)
        p = np.exp(x - x.max()) / np.exp(x - x.max()).sum()
        for t in (int(np.argmax(logits)), 0, 1234, len(logits) - 1):
            margin = p[t] - np.delete(p, t).max()
            assert d.cell(logits, t) == (np.searchsorted(d.P_EDGES, p[t], side="right"),
                                         np.searchsorted(d.M_EDGES, margin, side="right"))
