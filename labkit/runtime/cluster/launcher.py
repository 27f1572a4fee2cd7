"""How the zygote (``zygote.py``) comes to life: forked from this process, or a fresh Python.

* ``"fork"``: ``os.fork()`` of the notebook's own process. torch is already imported here, so
  the zygote is ready at once (like accelerate's ``notebook_launcher``, which forks the
  kernel). Safe only while CUDA is not initialised here, with no process group here, and for
  CPU ranks: they run one thread each, and OpenMP cannot start threads in a child forked from
  a process that already used them (it hangs), so GPU ranks, which use several host threads,
  get a fresh launcher. The zygote is forked once; every later restart forks from it, so
  CUDA initialised in the notebook afterwards does not matter.
* ``"fresh"``: a new Python that imports torch itself (2-3 s), always safe.
* ``"auto"``: fork when safe, else fresh.

While ranks are distrusted (a grader's checker, ``untrusted.distrust_ranks``) every zygote is
a fresh Python, started isolated (``-I``: no working folder on its path, no ``PYTHON*``
variables) and guarded (non-dumpable from its first statement: ``zygote.py``). A forked one
would hold a copy of this process's memory, and a rank that ended it would have the next one
forked from wherever the checker then is, such as inside a check, after it drew data meant for
another rank. In a sandbox of its own (``untrusted.distrust_ranks(contained=True)``), every
other process is stopped or killed while a zygote starts (``others_held``): learner code could
attach to the new zygote between its start and its first statement.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import socket
import subprocess
import sys
import time
import warnings

LAUNCHERS = ("auto", "fork", "fresh")
# Imported once by the zygote so that every forked rank has them for free; the layers above
# add what their jobs run (``preload_in_ranks``), so that a rank does not import it itself.
ZYGOTE_PRELOAD = ["torch", "torch.distributed", "cloudpickle", "psutil",
                  "labkit.runtime.cluster.rank", "labkit.runtime.memory"]


def preload_in_ranks(*modules: str) -> None:
    """Have every zygote started from now on import ``modules`` before it forks a rank."""
    ZYGOTE_PRELOAD.extend(m for m in modules if m not in ZYGOTE_PRELOAD)


def fork_unsafe_reason(device: str) -> str | None:
    """Why the zygote cannot be forked from this process (None: it can)."""
    if sys.platform != "linux":
        return "forking a launcher is done on Linux only"
    if "torch" not in sys.modules:
        return "torch is not imported in this process"
    if device != "cpu":
        return "GPU ranks use several host threads, which OpenMP cannot start after a fork"
    import torch

    if torch.cuda.is_initialized():
        return "CUDA is initialised in this process, and CUDA does not survive a fork"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "a process group is initialised in this process"
    return None


def choose_launcher(launcher: str, device: str) -> str:
    """"fork" or "fresh" for ``launcher`` ("auto", "fork", "fresh"), or a clear error."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}: choose one of {', '.join(LAUNCHERS)}")
    reason = None if launcher == "fresh" else fork_unsafe_reason(device)
    if launcher == "fork" and reason:
        raise ValueError(f"cannot fork the rank launcher from this process: {reason}; use "
                         "launcher='fresh' (or 'auto')")
    from labkit.runtime.cluster.untrusted import distrusted

    if distrusted():
        return "fresh"  # the ranks must never hold a copy of this process (module docstring)
    return "fresh" if launcher == "fresh" or reason else "fork"


class ForkedZygote:
    """The parts of ``subprocess.Popen`` the cluster uses, for a zygote made by ``os.fork``."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass


def _retire_inherited_fds(keep: set[int]) -> None:
    """Let go of every inherited file descriptor but ``keep`` (the notebook's sockets, zmq...)
    while keeping its *number* taken: each one is pointed at /dev/null instead of closed.

    Python objects copied from the notebook still hold those numbers (a ``logging``
    FileHandler, pytest's log file, a file the user opened). Were the numbers freed, a rank
    would hand them to the next socket it opens (gloo's, for one), and a log record written
    through such a stale object would land inside the collective's byte stream and hang it.
    Pointed at /dev/null, a stale write is lost harmlessly and a stale read sees end of file.
    """
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 4096))
    null = os.open(os.devnull, os.O_RDWR)
    for fd in fds:
        if fd in keep or fd == null:
            continue
        try:
            os.fstat(fd)  # open? (the listing's own descriptor is closed by now)
            os.dup2(null, fd, inheritable=False)
        except OSError:
            pass
    os.close(null)


def _forget_the_notebooks_torch() -> None:
    """Give the forked zygote the torch a fresh Python would have: the notebook's global
    settings back to their defaults, and none of its DTensor meshes (its caches would hand
    a rank the meshes of another world, the estimator's fake one included)."""
    import torch

    from labkit.runtime.meshes import forget_meshes

    forget_meshes()
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(None)
    torch.set_grad_enabled(True)


def _fork(theirs: socket.socket) -> ForkedZygote:
    with warnings.catch_warnings():  # Python 3.12+ warns that this process has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return ForkedZygote(pid)
    try:  # the zygote: a copy of the notebook's process, which it must never disturb
        gc.freeze()  # the notebook's objects are never collected here (no finalizer runs)
        os.setsid()  # out of the kernel's process group: Jupyter's interrupts are not ours
        _retire_inherited_fds({0, 1, 2, theirs.fileno()})
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        _forget_the_notebooks_torch()
        from labkit.runtime.cluster.zygote import serve

        serve(theirs.fileno(), [])
    finally:
        os._exit(0)  # never the notebook's exit handlers


# A guarded zygote's first statement: non-dumpable before it imports anything.
GUARD = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE, 0


def in_sandbox_namespace() -> bool:
    """Whether this process runs directly under bubblewrap's init in a pid namespace of its own
    (the grader's sandbox: its checker is pid 2, child of ``bwrap`` at pid 1)."""
    try:
        with open("/proc/1/comm") as f:
            return f.read().strip() == "bwrap" and os.getppid() == 1
    except OSError:
        return False


@contextlib.contextmanager
def others_held():
    """While a guarded zygote starts (``with others_held(): ...`` until its hello), in a sandbox
    of its own (``untrusted.distrust_ranks(contained=True)``): every other process there is
    learner code that could attach to the new zygote before its first statement makes it
    non-dumpable. All of them are stopped at once (``kill(-1, SIGSTOP)``: every process this
    one may signal, which in its pid namespace is every one but init and itself; the kernel
    lets no fork slip past it), whatever state they report (a process whose main thread
    has exited shows as a zombie while its other threads run). Then those that are neither
    this process's ancestors nor its descendants (what ranks of an ended zygote left,
    reparented to the sandbox's init) are killed; the rest (another cluster's zygote, its
    ranks and what they started) are continued afterwards. Elsewhere it does nothing."""
    from labkit.runtime.cluster.untrusted import contained, distrusted

    if not (distrusted() and contained()):
        yield
        return
    if not in_sandbox_namespace():  # kill(-1) here would stop every process of this user
        raise RuntimeError("ranks are marked contained, but this process is not in a "
                           "sandbox's pid namespace (pid 1 is not bwrap, or is not its parent)")
    import psutil

    with contextlib.suppress(ProcessLookupError):  # no other process: nothing to stop
        os.kill(-1, signal.SIGSTOP)
    try:
        me = psutil.Process()
        keep = {me.pid, *(p.pid for p in me.parents())}
        keep |= {p.pid for p in me.children(recursive=True)}
        for pid in psutil.pids():
            if pid not in keep:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGCONT)


def start_zygote(kind: str) -> tuple[object, socket.socket]:
    """Start a zygote of ``kind`` ("fork" or "fresh"); return (process, our socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if kind == "fork":
        for name in ZYGOTE_PRELOAD:  # light once torch is here; then every rank has them
            __import__(name)
        process = _fork(theirs)
    else:
        from labkit.runtime.cluster.untrusted import distrusted

        guarded = distrusted()
        code = ((GUARD if guarded else "") + f"import sys; sys.path[:0] = {sys.path!r}; "
                f"from labkit.runtime.cluster.zygote import serve; "
                f"serve({theirs.fileno()}, {list(ZYGOTE_PRELOAD)!r}, guarded={guarded})")
        # A session of its own: Jupyter's interrupt signals the kernel's whole process group,
        # and the ranks must be stopped by us, in order, not by a stray SIGINT.
        isolated = ["-I"] if guarded else []
        process = subprocess.Popen([sys.executable, *isolated, "-c", code],
                                   pass_fds=[theirs.fileno()], start_new_session=True)
    theirs.close()
    return process, ours
