"""Batched requests on the OpenVINO bf16 backend against solo runs on the same pipeline (issue 14's identity):
4 chat prompts, 48 new tokens, generate_batch with plain and recycle, then each prompt alone with plain
decoding after the engine has started (start_engine drops the fixed-shape models: OvBackend.drop_fixed).
With SPECEXPORT_OV_FIXED=0 the same holds trivially (every call on the dynamic model).

    python experiments/ov_engine_identity.py        (bundles/smol-slots, from the repository root)
"""
import specexport
qs = ["Write a short story about a robot learning to paint.", "Explain how a hash map works, with an example in Python.",
      "Summarize the causes of the French revolution in five bullet points.", "What are the health benefits of green tea?"]
p = specexport.load("bundles/smol-slots", threads=2, backend="openvino-bf16")
print("fixed", sorted(p.target.fixed))
got = {d: [g.token_ids for g in p.generate_batch(qs, max_new_tokens=48, draft=d, chat=True)] for d in ("none", "recycle")}
print("fixed after the engine started:", sorted(p.target.fixed), "drift", p.target.entry.verify_drift, "speculative", p.target.entry.speculative)
solo = [p.generate(q, max_new_tokens=48, draft="none", chat=True).token_ids for q in qs]
for d in got:
    print(d, "batch == solo:", [a == b for a, b in zip(got[d], solo)])
