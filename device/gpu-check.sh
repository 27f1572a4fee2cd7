#!/usr/bin/env bash
# labkit's GPU claims in one pass (~5 min on one GPU). Run from the repo root with labkit's venv active.
# 1 GPU: NCCL only at world size 1; 2+ ranks share the GPU over gloo (labkit's design); with
# 2+ GPUs the NCCL pipeline checks run too. One PASS/FAIL line per claim; INFO lines are numbers.
# Checked: caps (labkit.runtime.cluster.hardware.check_capacity), an even share without a cap,
# the fork/fresh launcher, host copies of CUDA results, the end-of-run synchronise, C++ output
# through the pipes (c1-c7); DCP checkpoints, the GPT and the MoE GPT on CUDA (c8); with 2+
# GPUs, cp=2 trained by torch's context_parallel against labkit's ring (c9); the scripts
# python -m labkit script writes, under torchrun on CUDA over NCCL (c10).
# Then run every gpu-marked test: python -m pytest -m gpu tests/ (context_parallel's included).
set -u
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || { echo "FAIL no GPU"; exit 1; }
export PYTHONUNBUFFERED=1
timeout 570 python - <<'PY'
import os, signal, subprocess, sys, time
import torch, torch.distributed as dist
import labkit
from labkit.runtime.cluster.hardware import resolve_device
from labkit.models import sized
G, TOTAL = torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory
RANK_PIDS, FAILS = set(), []
def check(claim, ok, detail=""):
    FAILS.extend([] if ok else [claim])
    print(f"{'PASS' if ok else 'FAIL'}  {claim}  {detail}"[:400], flush=True)
def info(msg): print(f"INFO  {msg}"[:400], flush=True)
def guard(claim, fn):
    try: fn()
    except Exception as e:  # a crash is a FAIL of the claim being checked
        check(claim, False, f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
def gpu_pids():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    return {int(p) for p in out.split() if p.strip().isdigit()}
def track(c): RANK_PIDS.update(h["pid"] for h in c.ranks)
def alloc(ctx, n): return torch.empty(int(n), dtype=torch.uint8, device=ctx.device).numel()
def where(ctx):
    v = torch.ones(1, device=ctx.device)
    dist.all_reduce(v)
    cap = torch.cuda.get_per_process_memory_fraction(ctx.device) * TOTAL
    return str(ctx.device), ctx.backend, v.item(), cap
def train_ok(c, claim, strategy, **kw):
    guard(claim, lambda: check(claim, len(labkit.train(c, model="mlp", strategy=strategy, steps=2,
                                                       timeout=180, **kw).losses) == 2))
    track(c)
def c1():  # fork safety, device choice, NCCL with device_id
    with labkit.Cluster(1, device="cuda", progress=False) as c:
        track(c)
        r = c.run(where, timeout=120)
        check("forked rank uses CUDA: cuda:0 over NCCL", r[0][:3] == ("cuda:0", "nccl", 1.0), str(r))
        check("nvidia-smi lists rank pids (else pid checks are vacuous)", c.ranks[0]["pid"] in gpu_pids())
        z = c._procs.zygote.pid
        check("zygote holds no CUDA context", z not in gpu_pids())
        check("GPU ranks get a fresh launcher (OpenMP threads cannot start after a fork)", c.launcher == "fresh", c.launcher)
        info(f"libcuda mapped in zygote: {'libcuda' in open(f'/proc/{z}/maps').read()}")
        from labkit.runtime.cluster.hardware import physical_cores
        threads = c.run(lambda ctx: torch.get_num_threads(), timeout=60)
        check("GPU ranks limit their host threads", threads == [max(1, physical_cores())], str(threads))
        out = c.run(lambda ctx: {"t": torch.ones(2, device=ctx.device), "p": torch.nn.Parameter(torch.ones(2, device=ctx.device))}, timeout=60)[0]
        check("CUDA tensors come back as host copies", out["t"].device.type == "cpu" and out["p"].device.type == "cpu", str({k: v.device for k, v in out.items()}))
    with labkit.Cluster(2, device="cpu", progress=False) as c:  # CUDA is initialised here now
        check("CPU cluster after CUDA init: fresh launcher, not a fork", c.launcher == "fresh", c.launcher)
        check("  and it works", c.run(lambda ctx: ctx.rank, timeout=120) == [0, 1])
def c2():  # shared GPUs over gloo: caps, a dead rank, strategies on CUDA tensors
    n, cap = G + 1, 8 * 2**30
    with labkit.Cluster(n, device="cuda", memory_per_device=cap, progress=False) as c:
        track(c)
        check("N > GPUs with a cap: shared over gloo", c.shared_gpus and c.backend == "gloo", repr(c))
        r = c.run(where, timeout=120)
        check("gloo all_reduce of CUDA tensors", all(x[2] == n for x in r), str([x[:3] for x in r]))
        check("every sharing rank capped at memory_per_device", all(abs(x[3] - cap) < 2**21 for x in r))
        from labkit.runtime.cluster.hardware import physical_cores
        threads = c.run(lambda ctx: torch.get_num_threads(), timeout=60)
        check(f"{n} GPU ranks share the host's {physical_cores()} cores", threads == [max(1, physical_cores() // n)] * n, str(threads))
        def die(ctx):
            if ctx.rank == 1: os.kill(os.getpid(), signal.SIGKILL)
            return where(ctx)
        old = {h["pid"] for h in c.ranks}
        try:
            c.run(die, timeout=90); check("dead rank -> RankError", False, "no error")
        except labkit.RankError as e:
            check("dead rank -> RankError while its peer waits in gloo", "SIGKILL" in str(e))
        time.sleep(2)
        check("killed ranks' GPU memory released", not (old & gpu_pids()))
        check("recovers after a dead rank", [x[2] for x in c.run(where, timeout=120)] == [n] * n)
        track(c)
        for s, kw in [("ddp", {}), ("fsdp", {}), ("tp", {}), ("gpipe", {"micro_batches": 2}),
                      ("naive_pipeline", {})]:
            train_ok(c, f"train {s}, {n} ranks sharing GPUs (gloo)", s, global_batch=8 * n, **kw)
def c3():  # a cap that overfills the shared GPU is refused before any rank starts
    from labkit.runtime.cluster.hardware import check_capacity
    try: check_capacity(3 * G, "cuda", True, int(0.6 * TOTAL)); ok = False
    except ValueError: ok = True
    check("refuses caps that overfill a shared GPU", ok, "" if ok else "3 ranks x 60% of 1 GPU accepted")
    try: labkit.Cluster(3 * G, device="cuda", memory_per_device=int(0.6 * TOTAL), progress=False); ok = False
    except ValueError: ok = True
    check("Cluster refuses them before any rank starts", ok)
    with labkit.Cluster(G + 1, device="cuda", progress=False) as c:  # no cap: an even share each
        track(c)
        shares = c.run(lambda ctx: torch.cuda.get_per_process_memory_fraction(ctx.device), timeout=120)
        sharing = [r["ranks_on_gpu"] for r in c.ranks]
        check("sharing ranks without a cap get an even share", all(abs(f - 1 / n) < 1e-6 for f, n in zip(shares, sharing)), f"{shares} for {sharing}")
        r = labkit.train(c, model="mlp", strategy="ddp", global_batch=8 * (G + 1), steps=1, timeout=180)
        check("reports say when ranks share a GPU", r.extra.get("shared_gpus") is True, str(r.extra))
def c4():  # CUDA OOM -> DeviceOOM; lowering a cap after caching; notebook-size caps
    with labkit.Cluster(1, device="cuda", memory_per_device="256MiB", progress=False) as c:
        track(c)
        try:
            c.run(alloc, 512 * 2**20, timeout=60); check("CUDA OOM -> DeviceOOM", False, "no error")
        except labkit.DeviceOOM as e:
            check("CUDA OOM -> DeviceOOM with the capacity", e.capacity_bytes == 256 * 2**20)
            check("DeviceOOM keeps 'CUDA said' (test_gpu.py OOM test)", "CUDA said" in str(e))
            check("DeviceOOM gives the requested bytes", e.requested_bytes == 512 * 2**20, f"{e.requested_bytes}")
        def keep_then_oom(ctx):
            ctx.state["kept"] = torch.empty(100 * 2**20, dtype=torch.uint8, device=ctx.device)
            return torch.empty(512 * 2**20, dtype=torch.uint8, device=ctx.device).numel()
        try:
            c.run(keep_then_oom, timeout=60); check("CUDA DeviceOOM breakdown is the tracked one", False, "no error")
        except labkit.DeviceOOM as e:
            check("CUDA DeviceOOM breakdown is the tracked one", e.breakdown.get("activations", 0) >= 100 * 2**20, str(e.breakdown))
        check("usable after DeviceOOM", c.run(alloc, 64 * 2**20, timeout=60) == [64 * 2**20])
        track(c)
        c.memory_per_device = None
        c.run(alloc, 4 * 2**30, timeout=60)  # freed on return, kept in PyTorch's cache
        c.memory_per_device = "1GiB"
        try: c.run(alloc, 2 * 2**30, timeout=60); ok = False
        except labkit.DeviceOOM: ok = True
        check("lowered cap enforced despite cached blocks", ok, "" if ok else "2 GiB taken under 1 GiB")
    verdicts = {}
    for device in ("cpu", "cuda"):  # the notebooks' small model and cap (it fits a CPU rank)
        with labkit.Cluster(1, device=device, progress=False) as c:
            track(c)
            try:
                r = labkit.train(c, model=sized("gpt", 200_000), strategy="single", global_batch=16,
                                 steps=2, memory_per_device="32MiB", timeout=120)
                verdicts[device] = f"fits (tracked peak {r.peak_bytes[0] / 2**20:.1f} MiB)"
            except labkit.DeviceOOM as e:
                verdicts[device] = "OOM " + str(e).splitlines()[0][:150]
    check("32MiB cap: same verdict on CUDA as on a CPU rank",
          verdicts["cpu"].split()[0] == verdicts["cuda"].split()[0], str(verdicts))
def c5():  # same init everywhere; collective timing; tracked vs allocator memory
    with labkit.Cluster(1, device="cuda", progress=False) as c:
        track(c)
        a = labkit.train(c, model="mlp", strategy="single", global_batch=32, steps=3, timeout=120)
        b = labkit.train(c, model="mlp", strategy="fsdp", global_batch=32, steps=3, timeout=120)
        d = max(abs(x - y) for x, y in zip(a.losses, b.losses))
        check("same seed, same weights: single == fsdp on CUDA", d < 1e-4, f"max loss diff {d:.2e}")
        info(f"single on CUDA, median step split: {a.split()}")
        def meter(ctx):
            from labkit.runtime.comm.intercept import CollectiveMeter
            from labkit.runtime.comm.meter import CommMeter
            x, t = torch.randn(8192, 8192, device=ctx.device), torch.ones(2**26, device=ctx.device)
            dist.all_reduce(t); torch.cuda.synchronize()
            m, start = CommMeter(), time.perf_counter()
            for _ in range(10):
                x @ x  # GPU work queued ahead of the collective
            with CollectiveMeter(m):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            return m.busy_s, time.perf_counter() - start
        busy, wall = c.run(meter, timeout=120)[0]
        check("collective interval ends when the GPU has done it",
              busy > 0.5 * wall, f"meter {busy * 1e3:.3f} ms vs synchronized {wall * 1e3:.1f} ms")
        def mem(ctx):
            from labkit.training import TrainConfig
            from labkit.training.loop import train_on_rank
            torch.cuda.reset_peak_memory_stats(ctx.device)
            out = train_on_rank(ctx, TrainConfig(model="gpt", global_batch=32, steps=3).to_dict())
            return (out["memory"]["peak_bytes"], torch.cuda.max_memory_allocated(ctx.device),
                    torch.cuda.max_memory_reserved(ctx.device))
        t, al, rs = (v / 2**20 for v in c.run(mem, timeout=120)[0])
        info(f"gpt: tracked peak {t:.1f} MiB, CUDA max allocated {al:.1f}, reserved {rs:.1f}")
def c6():  # 2+ GPUs only: pipelines over NCCL; a run's NCCL errors belong to it
    with labkit.Cluster(2, device="cuda", progress=False) as c:
        track(c)
        train_ok(c, "train gpipe, 2 NCCL ranks", "gpipe", global_batch=16, micro_batches=2)
        train_ok(c, "train naive_pipeline, 2 NCCL ranks", "naive_pipeline", global_batch=16)
        def only_rank_0(ctx):
            if ctx.rank == 0: dist.all_reduce(torch.ones(1, device=ctx.device))
        try: c.run(only_rank_0, timeout=30); ok, why = False, "the run 'succeeded'"
        except (labkit.RunTimeout, labkit.RankError) as e: ok, why = True, type(e).__name__
        check("mismatched NCCL collectives fail in their own run (end-of-run synchronise)", ok, why)
        check("  and the next run works", c.run(lambda ctx: ctx.rank, timeout=120) == [0, 1])
    os.environ["NCCL_DEBUG"] = "WARN"
    import io, contextlib
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf):
        with labkit.Cluster(2, device="cuda", progress=False, collective_timeout=10) as c:
            track(c)
            def alone(ctx):
                if ctx.rank == 0:
                    dist.all_reduce(torch.ones(1, device=ctx.device)); torch.cuda.synchronize(ctx.device)
            t0 = time.time()
            try: c.run(alone, timeout=120); ok = False
            except labkit.RankError as e: ok = e.rank == 0
    check("collective_timeout=10 from Cluster: the watchdog ends the run", ok and time.time() - t0 < 90, f"{time.time() - t0:.0f} s")
    text = buf.getvalue()
    check("C++ output (NCCL, the watchdog) reaches the notebook with its rank", "[rank 0]" in text and ("NCCL" in text or "Watchdog" in text or "timeout" in text.lower()), text[-300:].replace("\n", " | "))
    del os.environ["NCCL_DEBUG"]
def c7():  # the doctor on this machine (1 GPU: 1 NCCL rank and 2 ranks sharing it)
    r = subprocess.run([sys.executable, "-m", "labkit", "doctor"], capture_output=True, text=True, timeout=300)
    check("doctor checks the GPU(s) and passes", r.returncode == 0 and "all_reduce on cuda" in r.stdout, r.stdout[-300:].replace("\n", " | "))
def c8():  # on CUDA: checkpoints resume exactly, cp and the MoE, the planner
    import tempfile
    from labkit.models import GPTConfig, MoEGPTConfig
    with labkit.Cluster(1, device="cuda", progress=False) as c, tempfile.TemporaryDirectory() as d:
        track(c)
        whole = labkit.train(c, model="mlp", steps=6, timeout=180).losses
        first = labkit.train(c, model="mlp", steps=3, checkpoint_dir=d, checkpoint_every=3, timeout=180)
        again = labkit.train(c, model="mlp", steps=6, checkpoint_dir=d, checkpoint_every=3, timeout=180)
        check("a CUDA run resumed from its DCP checkpoint equals the whole run", again.losses == whole and first.losses == whole[:3], f"{again.losses} vs {whole}")
        gpt = GPTConfig(vocab_size=64, seq_len=64, d_model=64, n_heads=2, n_layers=2)
        r = labkit.train(c, model=gpt, global_batch=8, steps=2, timeout=180)
        check("GPT on CUDA: the estimate within 10% of the tracked peak", r.estimate_error() < 0.1, f"tracked {r.peak_bytes}, estimated {r.estimate['peak_bytes']}")
        moe = labkit.train(c, model=MoEGPTConfig(), global_batch=8, steps=2, timeout=180)
        check("the MoE GPT trains on CUDA", len(moe.losses) == 2, str(moe.losses))
        import labkit.plan
        info(f"planner calibration of one CUDA rank: {labkit.plan.calibrate(c, repeats=2)}")
def c9():  # 2+ GPUs only: cp=2 trained by PyTorch's context_parallel equals labkit's ring
    from labkit.models import GPTConfig
    gpt, kw = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2), dict(global_batch=4, steps=3, optimizer="sgd", lr=0.1, timeout=180)
    with labkit.Cluster(2, device="cuda", progress=False) as c:
        track(c)
        runs = {e: labkit.train(c, model=gpt, layout=labkit.Layout(cp=2), cp_engine=e, **kw) for e in ("auto", "ring")}
        gap = max(abs(x - y) for x, y in zip(runs["auto"].losses, runs["ring"].losses))
        check("cp=2 on 2 GPUs: torch context_parallel ran and trains as labkit's ring", runs["auto"].extra.get("cp_engine") == "torch context_parallel" and gap < 1e-4, f"{runs['auto'].extra.get('cp_engine')}, loss gap {gap:.2e}")
def c10():  # the written scripts (python -m labkit script) on CUDA over NCCL: labkit's losses
    import json, shutil, tempfile
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    n, env = 2 if G >= 2 else 1, {**os.environ, "PYTHONPATH": os.getcwd()}  # the repo root
    names = ["ddp", "fsdp"] + (["tp", "1f1b"] if G >= 2 else [])
    args = ["--model", "gpt", "--params", "30000", "--global-batch", "8", "--steps", "3", "--micro-batches", "2"]
    with tempfile.TemporaryDirectory() as d:
        def launch(*cmd):
            r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(n), *cmd], cwd=d, env=env, capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, (r.stdout + r.stderr)[-400:]
        launch("-m", "labkit", "train", *args, "--strategy", *names, "--out", f"{d}/r.json")
        for name in names:
            path = f"{d}/{name}.py"
            r = subprocess.run([sys.executable, "-m", "labkit", "script", *args, "--strategy", name, "--world-size", str(n), "--out-script", path], env=env, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr[-400:]
            launch(path, "--out", f"{d}/{name}.json")
            ours = json.load(open(f"{d}/{name}.json"))["losses"]
            theirs = labkit.TrainReport.load(f"{d}/r.{name}.json" if len(names) > 1 else f"{d}/r.json").losses
            gap = max(abs(x - y) / abs(y) for x, y in zip(ours, theirs))
            check(f"the written {name} script on {n} GPU(s) over NCCL gives labkit train's losses", len(ours) == 3 and gap < 1e-4, f"relative gap {gap:.1e}")
steps = [("1 NCCL rank", c1), ("shared GPUs", c2), ("cap check", c3), ("memory", c4),
         ("init/timing", c5), ("doctor", c7), ("checkpoints, cp/MoE, planner", c8),
         ("written scripts", c10)] + ([("NCCL pipelines", c6), ("cp engines", c9)] if G >= 2 else [])
for name, fn in steps:
    t0 = time.time()
    guard(name, fn)
    info(f"{name}: {time.time() - t0:.0f} s")
time.sleep(2); check("no rank process left on the GPU after close", not (RANK_PIDS & gpu_pids()))
print(f"\n{len(FAILS)} FAIL: {FAILS}")
PY
