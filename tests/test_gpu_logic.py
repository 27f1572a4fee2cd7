"""The GPU path's logic, proven on CPU with stand-ins for CUDA (tests/test_gpu.py runs the real
thing where there is a GPU): DeviceOOM keeps CUDA's words and size across the rank boundary,
caps of ranks sharing a GPU are checked before any rank starts and lowering one empties the
cache, a run ends by waiting for the device and meeting the other ranks, GPU ranks share the
host's cores, the doctor checks a lone GPU, and tensors come back from a GPU as host copies."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

import labkit
from labkit.runtime.cluster import hardware, messages
from labkit.runtime.memory import DeviceOOM, MemoryTracker
from labkit.runtime.memory.capacity import apply_capacity, as_device_oom, cuda_requested_bytes
from tests.conftest import descendants

GPU = 80 * 2**30
CUDA_SAYS = ("CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
             "79.19 GiB of which 20.00 MiB is free.")


def test_the_requested_size_is_read_from_cudas_message():
    assert cuda_requested_bytes(CUDA_SAYS) == 512 * 2**20
    assert cuda_requested_bytes("Tried to allocate 2.50 GiB") == int(2.5 * 2**30)
    assert cuda_requested_bytes("Tried to allocate 20 bytes") == 20
    assert cuda_requested_bytes("something else") == 0


def test_device_oom_travels_whole():
    oom = DeviceOOM(1, "cuda:0", 512, 1024, 900, {"activations": 900, "total": 900},
                    detail=f"CUDA said: {CUDA_SAYS}", category="activations")
    copy = pickle.loads(pickle.dumps(oom))
    assert str(copy) == str(oom) and "CUDA said" in str(copy)
    assert (copy.requested_bytes, copy.detail, copy.category) == (512, oom.detail, "activations")


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's memory calls, recorded, for a device of 80 GiB."""
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=GPU))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: calls.append(("fraction", fraction)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 7 * 2**20)
    return calls


def test_lowering_a_cap_empties_the_cache(fake_cuda):
    tracker, device = MemoryTracker(), torch.device("cuda", 0)
    apply_capacity(tracker, device, None)
    apply_capacity(tracker, device, 40 * 2**30)  # lowered: cached blocks must go
    apply_capacity(tracker, device, 60 * 2**30)  # raised: nothing to give back
    assert fake_cuda == [("fraction", 1.0), ("empty_cache",), ("fraction", 0.5),
                         ("fraction", 0.75)]
    assert tracker.capacity_bytes is None and tracker.device_capacity == 60 * 2**30


def test_ranks_sharing_a_gpu_without_a_cap_get_an_even_share(fake_cuda):
    tracker = MemoryTracker()
    apply_capacity(tracker, torch.device("cuda", 0), None, ranks_on_gpu=4)
    assert fake_cuda[-1] == ("fraction", 0.25) and tracker.device_capacity == GPU // 4


def test_cuda_oom_carries_the_tracked_breakdown(fake_cuda):
    tracker = MemoryTracker(rank=2)
    with tracker:
        kept = torch.empty(3000, dtype=torch.uint8)
    tracker.device_capacity = 2**30
    oom = as_device_oom(torch.OutOfMemoryError(CUDA_SAYS), tracker, torch.device("cuda", 0))
    assert oom.requested_bytes == 512 * 2**20 and oom.capacity_bytes == 2**30
    assert oom.breakdown["activations"] == kept.numel() and oom.in_use_bytes == 7 * 2**20
    assert "CUDA said: CUDA out of memory" in str(pickle.loads(pickle.dumps(oom)))


def test_a_cuda_oom_raised_on_a_rank_reaches_the_notebook_whole(one):
    def out_of_memory(ctx):
        raise torch.OutOfMemoryError(CUDA_SAYS)

    with pytest.raises(DeviceOOM) as info:
        one.run(out_of_memory)
    assert info.value.requested_bytes == 512 * 2**20 and "CUDA said" in str(info.value)


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(hardware, "gpu_count", lambda: 1)
    monkeypatch.setattr(hardware, "gpu_memory_bytes", lambda: GPU)


def test_caps_of_ranks_sharing_a_gpu_must_fit_it(one_gpu):
    assert hardware.resolve_device(3, "cuda", None) == ("cuda", True)  # an even share each
    hardware.check_capacity(3, "cuda", True, GPU // 3)
    with pytest.raises(ValueError, match="3 ranks share one GPU of 80 GiB.*at most 26.7 GiB"):
        hardware.check_capacity(3, "cuda", True, int(0.6 * GPU))
    with pytest.raises(ValueError, match="a GPU here holds 80 GiB"):
        hardware.check_capacity(1, "cuda", False, 2 * GPU)
    before = descendants()
    with pytest.raises(ValueError, match="share one GPU"):
        labkit.Cluster(3, device="cuda", memory_per_device=int(0.6 * GPU))
    assert descendants() == before


def test_gpu_ranks_share_the_hosts_cores(monkeypatch):
    monkeypatch.setattr(hardware, "physical_cores", lambda: 64)
    assert hardware.host_threads("cuda", 8) == 8
    assert hardware.host_threads("cuda", 128) == 1
    assert hardware.host_threads("cpu", 2) == 1


def test_a_run_ends_by_waiting_for_the_device_and_meeting_the_ranks(monkeypatch):
    from labkit.runtime.cluster import rank

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(rank.dist, "barrier",
                        lambda group=None, device_ids=None: calls.append(("barrier", device_ids)))
    rank.settle(SimpleNamespace(device=torch.device("cuda", 1), backend="nccl", group=None))
    assert calls == ["sync", ("barrier", [1]), "sync"]
    calls.clear()
    rank.settle(SimpleNamespace(device=torch.device("cpu"), backend="gloo", group=None))
    assert calls == []  # gloo's collectives are over when they return


def test_every_run_settles_after_the_function(two):
    def record_settling(ctx):
        from labkit.runtime.cluster import rank

        real = rank.settle

        def spy(ctx_):
            ctx_.state.setdefault("settled", []).append(ctx_._job_id)
            real(ctx_)

        rank.settle = spy
        return ctx._job_id

    jobs = two.run(record_settling)
    # the second run's own settling happens after its function returned the (same) list
    # and before the result was sent back
    assert two.run(lambda ctx: ctx.state["settled"]) == [[jobs[0], jobs[0] + 1]] * 2


def test_the_collective_timeout_is_set_from_the_cluster():
    import time

    import torch.distributed as dist

    def rank_1_never_joins(ctx):
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(30)

    with labkit.Cluster(2, device="cpu", progress=False, collective_timeout=1.5) as cluster:
        start = time.monotonic()
        with pytest.raises(labkit.RankError) as info:
            cluster.run(rank_1_never_joins, timeout=25)
        assert time.monotonic() - start < 15 and info.value.rank == 0
    with pytest.raises(ValueError, match="collective_timeout"):
        labkit.Cluster(1, device="cpu", collective_timeout=0)


def test_the_doctor_checks_a_lone_gpu(monkeypatch):
    from labkit.runtime.cluster import doctor

    smoked = []
    monkeypatch.setattr(doctor, "gpu_count", lambda: 1)
    monkeypatch.setattr(doctor.torch.cuda, "get_device_name", lambda i: "Stand-in GPU")
    monkeypatch.setattr(doctor.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(doctor, "_smoke", lambda device, ranks=2: smoked.append((device, ranks))
                        or True)
    assert doctor.main() == 0
    assert ("cuda", 1) in smoked and ("cpu", 2) in smoked


def test_tensors_on_a_gpu_come_back_as_host_copies(monkeypatch):
    copies = []
    real_copy = messages.host_copy

    def to_host(tensor):  # stand-in: float64 plays "on the GPU", float32 "on the host"
        copies.append(tensor)
        return real_copy(tensor.detach().float() if not isinstance(tensor, torch.nn.Parameter)
                         else torch.nn.Parameter(tensor.detach().float()))

    monkeypatch.setattr(messages, "on_device", lambda t: t.dtype == torch.float64)
    monkeypatch.setattr(messages, "host_copy", to_host)
    param = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    value = {"a": [torch.zeros(3, dtype=torch.float64)], "p": param, "cpu": torch.ones(1)}
    back = pickle.loads(messages.dumps_result(value))
    assert len(copies) == 2 and back["a"][0].dtype == torch.float32  # nothing left "on GPU"
    assert isinstance(back["p"], torch.nn.Parameter) and back["p"].requires_grad
    assert torch.equal(back["cpu"], value["cpu"])
    copy = real_copy(param)
    assert isinstance(copy, torch.nn.Parameter) and copy.device.type == "cpu"
    assert copy.untyped_storage().data_ptr() != param.untyped_storage().data_ptr()


def test_reports_say_when_ranks_share_a_gpu(one):
    one.shared_gpus = True  # a stand-in: the flag the cluster sets when ranks share GPUs
    try:
        report = labkit.train(one, model="mlp", steps=1, global_batch=8)
    finally:
        one.shared_gpus = False
    assert report.extra["shared_gpus"] is True
