import faulthandler, tempfile
import labkit, os
LAUNCHER = os.environ.get("LAUNCHER", "auto")
from labkit.train import loop

def test_prior():
    with labkit.Cluster(2, device="cpu", progress=False, launcher="fork") as c:
        c.run(lambda ctx: ctx.rank)

def _arm(ctx):
    f = open(f"/tmp/hangt/dump{ctx.rank}.txt", "w")
    faulthandler.dump_traceback_later(30, file=f, exit=False)
    ctx.state["f"] = f

def test_ckpt():
    with labkit.Cluster(2, device="cpu", progress=False, launcher=LAUNCHER) as c:
        c.run(_arm)
        d = tempfile.mkdtemp()
        labkit.train(c, model="mlp", strategy="ddp", global_batch=16, steps=2, checkpoint_dir=d, checkpoint_every=1, timeout=40, estimate=False)
