"""Where a build writes, and how its bundle reaches --out: nothing half-written is ever at --out.

A build works in one hidden directory beside the output, `.OUT.building-PID-XXXX/`, holding `bundle/` (the
new bundle), `tmp/` (TMPDIR and the torch compile cache during the build) and `.lock` (an flock held for the
build's whole life). At the end the bundle is moved to --out in one step:
- a new --out: one rename;
- --force over an existing bundle: renameat2(RENAME_EXCHANGE) swaps the two directories atomically (the old
  bundle lands in the work directory and is removed with it), so --out holds the old or the new bundle at
  every instant. A filesystem without it gets two renames with SIGINT/SIGTERM held until both are done; a
  SIGKILL there leaves the old bundle in the work directory, and the next build puts it back.
A later build removes the work directories of builds that are provably dead (their lock is free, or their
pid is gone) and says which it cannot prove. SIGTERM and SIGHUP interrupt a build like Ctrl-C does.
Disk full, read-only and permission failures become one-line BuildErrors.

Only filesystem and process plumbing lives here: no torch, no model code, nothing about the bundle's
contents (bundle.py is the contract; build.py decides what goes in).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path

from ..errors import BuildError

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # linux/fs.h
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a build: handled as Ctrl-C is (the build cleans up); args[0] is the signal."""


# ---- signals

@contextlib.contextmanager
def interrupts_as_keyboard_interrupt():
    """SIGTERM/SIGHUP raise Terminated while the block runs (main thread only: Python delivers signals there),
    unless the process ignores them (nohup); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    previous = {}
    for s in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _signals_deferred():
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends, so that two steps cannot be split by them. Python runs
    signal handlers in the main thread between bytecodes: a handler that only records the signal defers it,
    and it is raised again once the old handlers are back. (A pthread signal mask would not do: the kernel
    hands a process-directed signal to another thread, e.g. onnxruntime's, and the handler still runs.)"""
    if threading.current_thread() is not threading.main_thread():
        yield  # no Python signal handler runs in this thread, so none can split the block
        return
    pending = []
    previous = {}
    for s in INTERRUPTS:
        if signal.getsignal(s) not in (signal.SIG_IGN, None):
            previous[s] = signal.signal(s, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for s in pending:
            signal.raise_signal(s)  # handled now as it would have been during the block


# ---- the work directory and its lock

def _lock(path: Path, blocking: bool) -> int | None:
    """An flock on `path` -> its fd, or None if another process holds it. The kernel drops the lock when its
    holder dies, by any signal including SIGKILL: a free lock proves the build that took it is gone."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def workdir(out: Path):
    """-> the build's work directory beside `out` (locked while the build runs), removed at the end whatever
    happens; what was in it (a partial bundle, the replaced old one, temp files) goes with it."""
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-{os.getpid()}-", dir=out.parent))
    fd = None
    try:
        fd = _lock(work / ".lock", blocking=True)
        os.write(fd, f"pid {os.getpid()} host {socket.gethostname()}\n".encode())
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def clean_stale(out: Path, log) -> None:
    """Remove the work directories of dead builds of `out`; put back an old bundle a build killed between
    the two renames of a fallback swap left there; refuse while a live build writes the same `out`."""
    prefix = f".{out.name}.building-"
    for work in sorted(out.parent / n for n in os.listdir(out.parent) if n.startswith(prefix)):
        if not work.is_dir() or work.is_symlink():
            continue
        dead, why = _is_dead(work, prefix)
        if dead is None:
            raise BuildError(f"another build ({why}) is writing {out} now: wait for it, or choose another --out")
        if not dead:
            log(f"left {work}: {why}; remove it by hand if no build of {out} is running")
            continue
        old = work / "old"
        if old.is_dir() and not os.path.lexists(out):
            os.rename(old, out)
            log(f"restored the previous bundle at {out} from {work.name} (a build was killed while replacing it)")
        shutil.rmtree(work, ignore_errors=True)
        log(f"removed {work.name}, left by a build that was killed ({why})")


def _is_dead(work: Path, prefix: str) -> tuple[bool | None, str]:
    """(True, why) proven dead; (None, who) alive; (False, why) cannot tell."""
    if (work / ".lock").exists():
        fd = _lock(work / ".lock", blocking=False)
        if fd is None:
            return None, (work / ".lock").read_text().strip() or "lock held"
        os.close(fd)
        return True, "its lock was free"
    pid = work.name[len(prefix):].split("-")[0]
    if not pid.isdigit():
        return False, "it has no lock and no pid in its name (an older specexport made it)"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True, f"pid {pid} is gone"
    except PermissionError:  # a live process of another user
        pass
    return False, f"pid {pid} is running (it may be another program by now)"


# ---- moving the bundle into place

def _renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    AT_FDCWD = -100
    if fn(AT_FDCWD, os.fsencode(src), AT_FDCWD, os.fsencode(dst), ctypes.c_uint(flags)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), str(src), None, str(dst))


def _unsupported(e: OSError) -> bool:
    return e.errno in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP)


def move_into_place(new: Path, out: Path, work: Path) -> None:
    """Put the finished bundle `new` at `out` (see the module docstring); the old one, if any, ends in `work`."""
    if not os.path.lexists(out):
        try:
            _renameat2(new, out, RENAME_NOREPLACE)  # a --out that appeared meanwhile is not clobbered
        except OSError as e:
            if not _unsupported(e):
                raise
            os.rename(new, out)
    else:
        try:
            _renameat2(new, out, RENAME_EXCHANGE)
        except OSError as e:
            if not _unsupported(e):
                raise
            with _signals_deferred():
                os.rename(out, work / "old")
                os.rename(new, out)
    _fsync_dir(out.parent)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def settle(root: Path, umask: int) -> None:
    """Permissions that follow the umask (0755 directories, 0644 files by default: a service account can read
    the bundle), and every file and directory synced to disk before the rename makes the bundle visible."""
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o777 & ~umask)
        for f in files:
            p = os.path.join(d, f)
            os.chmod(p, 0o666 & ~umask)
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(d))


def current_umask() -> int:
    """The process umask, read without changing it (os.umask sets it, a race with other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---- the environment during a build, and write failures

@contextlib.contextmanager
def temp_env(tmp: Path):
    """TMPDIR (and tempfile's cached default) and the torch compile cache inside the build's work directory,
    so what torch and the exporter leave there goes with it; onnxruntime telemetry off unless the user set
    ORT_DISABLE_TELEMETRY (it writes under ~/.cache/Microsoft and $TMPDIR and calls Microsoft's endpoint)."""
    tmp.mkdir()
    env = {"TMPDIR": str(tmp), "TMP": str(tmp), "TEMP": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
           "ORT_DISABLE_TELEMETRY": os.environ.get("ORT_DISABLE_TELEMETRY", "1")}
    saved = {k: os.environ.get(k) for k in env}
    saved_tempdir = tempfile.tempdir
    os.environ.update(env)
    tempfile.tempdir = str(tmp)
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def write_error(e: BaseException, out: Path) -> BuildError | None:
    """A one-line BuildError for a failure to write the bundle (disk full, read-only, no permission), or None.
    Some writers (onnx's protobuf serialiser) lose the errno, so a nearly full disk also counts as full."""
    parent = out.parent
    cause, seen = e, 0
    while cause is not None and seen < 8:
        if isinstance(cause, OSError) and cause.errno is not None:
            break
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    code = cause.errno if isinstance(cause, OSError) else None
    if code in (errno.ENOSPC, errno.EDQUOT) or (code is None and _nearly_full(parent)):
        return BuildError(f"no space left on the device of {parent} while writing the bundle: free some space "
                          "or choose another --out (nothing was left behind)")
    if code == errno.EROFS:
        return BuildError(f"{parent} is on a read-only file system: choose another --out")
    if code in (errno.EACCES, errno.EPERM):
        return BuildError(f"no permission to write in {parent} ({cause.filename}): choose another --out or fix "
                          "the directory's permissions")
    return None


def _nearly_full(d: Path) -> bool:
    try:
        st = os.statvfs(d)
    except OSError:
        return False
    return min(st.f_bavail, st.f_bfree) * st.f_frsize < (1 << 20) or st.f_favail == 0
