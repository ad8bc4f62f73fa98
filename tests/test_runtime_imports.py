"""The runtime is torch-free: importing it (and loading nothing else) must not pull torch or transformers."""
import subprocess
import sys


def test_runtime_imports_neither_torch_nor_transformers():
    code = ("import sys, specexport.runtime, specexport; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
