"""scripts/gpu_check.py is what a lent GPU machine runs, with minutes of device time and no second chance to
debug: its CPU dry run here (prepare a pack, then run it with the timing code on the CPU too) must produce a
report in which every backend's greedy output equals transformers' and every batched request its solo run."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_on_the_cpu(tmp_path):
    script = str(ROOT / "scripts" / "gpu_check.py")
    env = {**os.environ, "GPU_CHECK_CPU_TIMING": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, script, "prepare", "--pack", str(tmp_path / "pack")], check=True, env=env,
                   capture_output=True, timeout=600)
    r = subprocess.run([sys.executable, script, "run", "--pack", str(tmp_path / "pack"), "--out", str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    report = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "FAILED" not in report, report
    greedy = [line for line in report.splitlines() if line.startswith(("| onnxruntime CPU |", "| torch CPU eager |"))
              and line.count("|") == 8]
    assert len(greedy) == 10 and all(line.endswith("| yes | yes |") for line in greedy), report
    batched = [line.split(" | ") for line in report.splitlines()
               if line.startswith("| torch CPU eager |") and line.count("|") == 9]
    assert len(batched) == 5 and all(cells[-1] == "4/4 |" for cells in batched), report
    calls = {(cells[1], cells[2]): int(cells[6]) for cells in batched}  # the draft model ran batched on the device
    assert calls[("none", "-")] == 0 and calls[("model", "4")] > 0 and ("model", "auto") in calls, report
    assert "| smollm2-135m | float32 | 2 | 5 |" in report  # the batched-call timing ran
