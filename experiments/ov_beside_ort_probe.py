"""Our bf16 decode call on the OpenVINO backend alone, then beside an onnxruntime pipeline (right after its
generation and 0.5 s later): does sharing a process with onnxruntime slow it, or is it the machine?

    python experiments/ov_beside_ort_probe.py        (bundles/smol-slots and bundles/smol-fused, from the root)
"""
import time, numpy as np, specexport
ovp = specexport.load("bundles/smol-slots", threads=2, backend="openvino-bf16")
q = "Explain how a hash map works, with an example in Python."
def ms(p):
    g = p.generate(q, max_new_tokens=48, draft="none", chat=True); return 1e3 * g.stats.verify_s / g.stats.steps
print("OV bf16 alone: %.1f %.1f %.1f ms/step" % tuple(ms(ovp) for _ in range(3)))
ort = specexport.load("bundles/smol-fused", threads=2)
print("after loading ORT: %.1f %.1f ms/step" % tuple(ms(ovp) for _ in range(2)))
for r in range(3):
    o = ms(ort); a = ms(ovp); time.sleep(0.5); b = ms(ovp)
    print(f"round {r}: ORT {o:.1f} ms/step, then OV right after {a:.1f}, after 0.5 s {b:.1f}")
