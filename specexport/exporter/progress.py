"""The build's terminal output besides its own lines: progress bars over the long stages, and third-party
warnings kept out.

- Bars (tqdm, on stderr, gone when their stage ends) are drawn only when the caller asks (the CLI: stderr
  is a terminal and no --quiet); the build's lines are written around them (tqdm.external_write_mode), so
  they read as without bars.
- While the build runs, the libraries it drives (torch.onnx, transformers, onnxruntime, onnx) say nothing
  below an error unless this logger shows debug records (--verbose: then they speak as they would). All is
  put back afterwards.

Nothing here decides what a build does (build.py) or where it writes (output.py).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings

log = logging.getLogger("specexport.build")

THIRD_PARTY = ("torch", "transformers", "onnx", "onnxscript", "onnx_ir", "onnxruntime", "huggingface_hub",
               "accelerate")


class Bars:
    """One tqdm bar at a time over a stage's steps (`start`, then `step` as each begins), or nothing when
    disabled."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.running = enabled, None, False

    def start(self, desc: str, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        self.close()
        self.bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                        bar_format="{desc} {bar} {n_fmt}/{total_fmt} [{elapsed}]")

    def step(self, desc: str) -> None:
        """The next step begins (the one before it is done): `desc` names it."""
        if self.bar is None:
            return
        if self.running:
            self.bar.update(1)
        self.running = True
        self.bar.set_description_str(desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.bar, self.running = None, False

    def writer(self, write):
        """`write` (a line callback) that clears the bar around each line while one is drawn."""
        if not self.enabled:
            return write

        def wrapped(line: str) -> None:
            from tqdm import tqdm

            with tqdm.external_write_mode():
                write(line)
        return wrapped


@contextlib.contextmanager
def third_party_quiet():
    """Third-party warnings out of the build's output while the block runs, unless this logger shows debug
    records (--verbose): Python warnings ignored, third-party loggers (and those below them that set a level
    of their own) at ERROR, onnxruntime's log at errors, transformers' progress bars off."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    import onnxruntime
    import torch  # noqa: F401  (imported first: its logging setup must not undo the levels set below)
    import transformers

    names = set(THIRD_PARTY) | {n for n in list(logging.Logger.manager.loggerDict) if n.split(".")[0] in THIRD_PARTY}
    loggers = {lg: lg.level for lg in map(logging.getLogger, names) if lg.name in THIRD_PARTY or lg.level}
    bars = transformers.utils.logging.is_progress_bar_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(max(lg.level, logging.ERROR))
        onnxruntime.set_default_logger_severity(3)
        transformers.utils.logging.disable_progress_bar()
        try:
            yield
        finally:
            for lg, level in loggers.items():
                lg.setLevel(level)
            onnxruntime.set_default_logger_severity(2)  # its default (there is no getter)
            if bars:
                transformers.utils.logging.enable_progress_bar()
