"""The cluster in a real Jupyter kernel, as a learner drives it: a cluster starts about as
fast as a fork of the kernel, the kernel is interrupted in the middle of a run that sends a
large argument, then shut down; the next run works and nothing is left behind."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import wait_gone

jupyter_client = pytest.importorskip("jupyter_client")

SETUP = """
import json, os, time, warnings
import torch, torch.distributed as dist
import labkit
warnings.simplefilter("ignore")
"""

# A bare fork launcher (what accelerate's notebook_launcher does): fork N children of the
# kernel, each joins a gloo group and all-reduces; the parent waits for all of them.
FORK_BASELINE = """
def fork_all_reduce(n):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    read, write = os.pipe()
    start = time.perf_counter()
    pids = []
    for rank in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                torch.set_num_threads(1)
                dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                        rank=rank, world_size=n)
                t = torch.ones(1); dist.all_reduce(t)
                os.write(write, bytes([int(t.item())]))
            finally:
                os._exit(0)
        pids.append(pid)
    got = b"".join(os.read(read, 1) for _ in range(n))
    elapsed = time.perf_counter() - start
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(read); os.close(write)
    assert got == bytes([n] * n), got
    return elapsed

def labkit_all_reduce(n):
    start = time.perf_counter()
    cluster = labkit.Cluster(n, device="cpu", progress=False)
    def total(ctx):
        t = torch.ones(1); dist.all_reduce(t); return t.item()
    assert cluster.run(total) == [float(n)] * n
    elapsed = time.perf_counter() - start
    launcher = cluster.launcher
    cluster.close()
    return elapsed, launcher
"""


def _execute(client, code: str, timeout: float = 120) -> str:
    """Run ``code`` in the kernel; return what it printed; fail on an error."""
    out: list[str] = []

    def hook(message):
        content = message["content"]
        if message["msg_type"] == "stream":
            out.append(content["text"])
        elif message["msg_type"] == "error":
            out.append("\n".join(content["traceback"]))

    for _ in range(3):
        reply = client.execute_interactive(code, timeout=timeout, output_hook=hook)
        # "aborted": the kernel never ran it. ipykernel aborts an execute request that
        # reaches it while it is still clearing its queue after an error (here the
        # KeyboardInterrupt just before); CI on a loaded host once got that once
        if reply["content"]["status"] != "aborted":
            break
        time.sleep(0.5)
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    return text


@pytest.fixture
def kernel():
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        _execute(client, SETUP)
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_cluster_starts_about_as_fast_as_forking_the_kernel(kernel):
    _, client = kernel
    _execute(client, FORK_BASELINE)
    _execute(client, "fork_all_reduce(4); labkit_all_reduce(4)")  # warm both paths once
    code = ("pairs = [(fork_all_reduce(4), *labkit_all_reduce(4)) for _ in range(5)]\n"
            "print(json.dumps(pairs))")
    pairs = json.loads(_execute(client, code).strip().splitlines()[-1])
    fork_s = sorted(p[0] for p in pairs)[2]  # medians, measured side by side
    labkit_s = sorted(p[1] for p in pairs)[2]
    assert all(p[2] == "fork" for p in pairs)
    assert labkit_s < 2 * fork_s + 0.05, pairs  # (+50 ms of slack for a loaded machine)


def test_interrupting_a_run_that_sends_a_large_argument(kernel):
    manager, client = kernel
    _execute(client, "cluster = labkit.Cluster(4, device='cpu', progress=False)\n"
                     "big = torch.ones(16 * 2**20)  # 64 MiB to each of 4 ranks\n"
                     "pids = [cluster._procs.zygote.pid, *cluster.run(lambda ctx: os.getpid())]")
    for delay in (0.05, 0.3, 1.0):  # lands in the send, the run, or between runs
        client.execute("while True: cluster.run(lambda ctx, t: t.numel(), big)")
        time.sleep(delay)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        text = _execute(client, "print(cluster.run(lambda ctx, t: t.numel(), big, timeout=60))",
                        timeout=90)
        assert text.strip().endswith(str([16 * 2**20] * 4)), text
    pids = json.loads(_execute(client, "print(json.dumps([cluster._procs.zygote.pid, "
                                       "*cluster.run(lambda ctx: os.getpid())]))"))
    manager.shutdown_kernel(now=True)  # SIGKILL: no exit handler runs
    assert wait_gone(pids, timeout=10) == set()
