"""Which prompts the load bench's solo reference should run: Pipeline.generate, plain, on the first 16 of the
default selection's 52 Spec-Bench prompts (what `--requests 16` runs at every level) and on all 52, and the
batching engine at max_batch=1 on the 16, in turn, two rounds.

    python experiments/solo_prompts_probe.py BUNDLE
"""
import sys, time
import specexport
from specexport.bench.config import find_questions, questions
pipe = specexport.load(sys.argv[1], threads=2)
qs = questions(find_questions(None), 4)
prompts = [pipe.encode(q["turns"][0], chat=True) for q in qs]
print(len(prompts), "prompts; mean prompt tokens: the first 16", sum(map(len, prompts[:16])) / 16,
      "all", sum(map(len, prompts)) / len(prompts))
pipe.start_engine(max_batch=1)
pipe.generate(prompts[0][:16], max_new_tokens=2, draft="none")
def solo(ps):
    t = time.perf_counter(); n = 0; pre = 0.0
    for p in ps:
        g = pipe.generate(p, max_new_tokens=128, draft="none"); n += len(g.token_ids); pre += g.stats.prefill_s
    w = time.perf_counter() - t
    return n / w, pre / w
def engine(ps):
    t = time.perf_counter()
    cs = [pipe.submit(p, max_new_tokens=128, draft="none") for p in ps]
    n = sum(len(c.wait(900).token_ids) for c in cs)
    return n / (time.perf_counter() - t)
for r in range(2):
    a, pa = solo(prompts[:16]); e = engine(prompts[:16]); b, pb = solo(prompts)
    print(f"round {r}: solo first 16 {a:.1f} tok/s (prefill {pa:.0%} of wall), engine max_batch=1 first 16 {e:.1f}, "
          f"solo all 52 {b:.1f} (prefill {pb:.0%})", flush=True)
