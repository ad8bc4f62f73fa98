import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from checkpoints import make_checkpoint, perturbed_copy  # noqa: E402


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory):
    """Tiny random checkpoints: a 3-layer GQA target (peaky, so it repeats itself and drafts get accepted),
    a noisy copy of it as draft, and a 1-layer unrelated draft."""
    root = tmp_path_factory.mktemp("ckpt")
    target = make_checkpoint(root / "target", layers=3, seed=0, logit_scale=4.0)
    return {
        "target": target,
        "noisy": perturbed_copy(target, root / "noisy", noise=0.3),
        "small": make_checkpoint(root / "small", layers=1, seed=5),
    }


def build_bundle(out, target, draft="none", ks=(1, 2, 4), capacity=96, chunk=8, seed_tokens=0, **kw):
    """A bundle of the tiny checkpoints; no seeded successor table unless asked (the bundle_noisy fixture has one)."""
    from specexport.exporter.build import BuildConfig, DraftSpec, build

    cfg = BuildConfig(target=str(target), out=Path(out), draft=DraftSpec.parse(str(draft)), ks=tuple(ks),
                      capacity=capacity, prefill_chunk=chunk, seed_tokens=seed_tokens, **kw)
    build(cfg, log=lambda s: None)
    return Path(out)


@pytest.fixture(scope="session")
def bundle_noisy(ckpts, tmp_path_factory):
    return build_bundle(tmp_path_factory.mktemp("b") / "noisy", ckpts["target"], ckpts["noisy"], seed_tokens=24)


@pytest.fixture(scope="session")
def bundle_portable(ckpts, tmp_path_factory):
    """bundle_noisy with standard-ONNX attention (the device backends and TensorRT need it)."""
    return build_bundle(tmp_path_factory.mktemp("b") / "portable", ckpts["target"], ckpts["noisy"],
                        attention="portable")


def cpu_has(flag: str) -> bool:
    """Whether this CPU has `flag` (/proc/cpuinfo's name). Some numerics are exact only on some CPUs, as measured:
    onnxruntime's int8-activation MatMulNBits (MLAS) and OpenVINO's CPU kernels give a row the same bits in calls of
    any size on the AVX-512 machines (which all had avx512_vnni), not on an AVX2-only AMD EPYC (2026-12-06: a chain's
    verify rows 4.8e-07 from its decode calls on the tiny checkpoint, within the tolerance)."""
    from specexport import kernels

    return flag in kernels.cpu_flags().split()
