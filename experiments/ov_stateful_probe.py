"""Can OpenVINO's own stateful LLM graph (the cache kept inside the plugin, attention fused into its SDPA
kernel) verify drafts: what a T-token call costs against a 1-token call, whether its rows score as 1-token
calls do, and whether rejected tokens can be rolled back by masking them out of `attention_mask` (no copy).

    python experiments/ov_stateful_probe.py OV_IR_DIR [--precision bf16] [--rounds 20]

OV_IR_DIR: `optimum-cli export openvino --task text-generation-with-past` of the checkpoint (the graph OpenVINO
GenAI runs). Greedy reference: prefill a 120-token prompt, then 24 one-token calls. Then (1) the same prompt,
then one call of the reference's 8 next tokens: its rows against the reference's logits (max difference and
argmax agreement); (2) rollback by mask: after the prompt a 5-token call whose last 3 tokens are wrong, then the
mask hides them and greedy decoding goes on: identical to the reference? (3) medians of T = 1, 3, 5, 9 calls at
~150 cached tokens, interleaved.
"""
import argparse
import time
from pathlib import Path

import numpy as np
import openvino as ov


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("ir")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--kv", default=None, help="KV_CACHE_PRECISION (default: the plugin's)")
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    props = {"INFERENCE_PRECISION_HINT": a.precision, "INFERENCE_NUM_THREADS": "2", "PERFORMANCE_HINT": "LATENCY"}
    if a.kv:
        props["KV_CACHE_PRECISION"] = a.kv
    core = ov.Core()
    req = core.compile_model(str(Path(a.ir) / "openvino_model.xml"), "CPU", props).create_infer_request()
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, 120)

    class Seq:  # one sequence: `mask` has one entry per cache slot the plugin holds
        def __init__(self):
            req.reset_state()
            self.mask, self.pos = [], 0

        def call(self, toks, keep=None):
            t = len(toks)
            self.mask += [1] * t
            feed = {"input_ids": np.array([toks], np.int64), "attention_mask": np.array([self.mask], np.int64),
                    "position_ids": np.arange(self.pos, self.pos + t, dtype=np.int64)[None],
                    "beam_idx": np.zeros(1, np.int32)}
            req.infer(feed)
            self.pos += t
            return req.get_tensor("logits").data[0].copy()

        def reject(self, n):  # hide the last n slots; their positions are free again
            for i in range(1, n + 1):
                self.mask[-i] = 0
            self.pos -= n

    s = Seq()
    lg = s.call(list(prompt))[-1]
    ref, ref_logits = [], []
    for _ in range(24):
        t = int(lg.argmax())
        ref.append(t)
        lg = s.call([t])[-1]
        ref_logits.append(lg)
    s = Seq()
    s.call(list(prompt))
    v = s.call(ref[:9])  # rows 0..7 score ref[1..8]
    diff = max(float(np.abs(v[i] - ref_logits[i]).max()) for i in range(8))
    agree = sum(int(v[i].argmax() == ref_logits[i].argmax()) for i in range(8))
    print(f"chain of 9 vs one-token calls: max |logit diff| {diff:.3g}, argmax agree {agree}/8")
    s = Seq()  # the same reference with every decode call padded to two tokens (the pad rolled back)
    lg = s.call(list(prompt))[-1]
    pad_logits = []
    for i in range(24):
        lg = s.call([ref[i], 0])[0]
        s.reject(1)
        pad_logits.append(lg)
    pdiff = max(float(np.abs(v[i] - pad_logits[i]).max()) for i in range(8))
    same = sum(int(pad_logits[i].argmax() == ref[i + 1]) for i in range(23))
    print(f"chain of 9 vs padded two-token calls: max |logit diff| {pdiff:.3g}; padded greedy agrees {same}/23")
    s = Seq()
    lg = s.call(list(prompt))[-1]
    out = [int(lg.argmax())]
    v = s.call([out[0], ref[1], 7, 8, 9])  # rows 0-1 score ref[1], ref[2]; the last three are wrong
    s.reject(3)
    out += [ref[1], int(v[1].argmax())]
    while len(out) < 24:
        out.append(int(s.call([out[-1]])[-1].argmax()))
    print("greedy after a masked rollback identical to the reference:", out == ref,
          f"({sum(x == y for x, y in zip(out, ref))}/24)")
    times = {t: [] for t in (1, 3, 5, 9)}
    s = Seq()
    s.call(list(prompt) + list(rng.integers(100, 40000, 30)))
    for _ in range(a.rounds):
        for t in times:
            t0 = time.perf_counter()
            s.call(list(rng.integers(100, 40000, t)))
            times[t].append(time.perf_counter() - t0)
            s.reject(t)
    base = np.median(times[1])
    print(f"precision {a.precision}, kv {a.kv or 'default'}: " + ", ".join(
        f"T={t} {1e3 * np.median(x):.2f} ms ({np.median(x) / base:.2f}x)" for t, x in times.items()))


if __name__ == "__main__":
    main()
