"""Forgeries of notebook 10's checks (``training_state``, ``dcp_resume``), from the ranks: each
answer keeps the run's state in the rank's memory instead of in the checkpoint (or next to
it) and, where labkit's check once asked the ranks, makes the rank's own comparisons agree.
Every one fails: the check reads the checkpoint the ranks saved itself, compares its weights
and Adam's moments with one device's, and has the answer resume from a checkpoint of its own
(another state, at another step) that no rank trained to. The checkpoint's ``.metadata`` is a
pickle the ranks wrote: the check reads it with an unpickler that builds DCP's own records and
nothing else. Each forgery runs on a cluster of its own: its patches outlive the check.
"""

from __future__ import annotations

import io
import os
import pickle
import sys

import cloudpickle
import pytest
import torch

import labkit
import tests.forgery
from tests.exercises import solution
from tests.forgery import failed

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the answers go by value
cloudpickle.register_pickle_by_value(tests.forgery)

NOTEBOOK = "10_when_a_gpu_dies"
STATE = solution(NOTEBOOK, "training_state_answer", "TrainingState")
SAVE = solution(NOTEBOOK, "dcp_resume_answer", "save_checkpoint")
LOAD = solution(NOTEBOOK, "dcp_resume_answer", "load_checkpoint")




def _memory() -> dict:
    """A store on the rank that outlives a check's job (torch's module lives as long)."""
    if not hasattr(torch, "_kept_by_the_answer"):
        torch._kept_by_the_answer = {}
    return torch._kept_by_the_answer


def _keep(optimizer, model=None) -> None:
    """At a save (a trained optimizer; dcp.load also asks a fresh one for its state dict)."""
    import copy

    if optimizer.state:
        _memory()["optimizer"] = copy.deepcopy(optimizer.state_dict())
        if model is not None:
            _memory()["model"] = copy.deepcopy(model.state_dict())


def _put_back(optimizer) -> None:
    optimizer.load_state_dict(_memory()["optimizer"])


# ----- training_state: Adam's state kept in the rank's memory, not in the checkpoint ---------
def _adam_in_memory():
    from torch.distributed.checkpoint.stateful import Stateful

    class AdamInMemory(Stateful):
        """Saves the weights and the step; Adam's state stays in the rank's memory, and is
        put back from there."""

        def __init__(self, model, optimizer, step):
            self.model, self.optimizer, self.step = model, optimizer, step

        def state_dict(self):
            _keep(self.optimizer)
            return {"model": self.model.state_dict(), "step": self.step}

        def load_state_dict(self, state_dict):
            self.model.load_state_dict(state_dict["model"])
            self.step = state_dict["step"]
            _put_back(self.optimizer)

    return AdamInMemory


def _loads_from_memory():
    from torch.distributed.checkpoint.state_dict import get_state_dict

    class LoadsFromMemory(_adam_in_memory()):
        """Saves everything (the checkpoint is right), and on load takes the step from the
        checkpoint, the weights and Adam's state from the rank's memory."""

        def state_dict(self):
            _keep(self.optimizer, self.model)
            model, optimizer = get_state_dict(self.model, self.optimizer)
            return {"model": model, "optimizer": optimizer, "step": self.step}

        def load_state_dict(self, state_dict):
            self.model.load_state_dict(_memory()["model"])
            _put_back(self.optimizer)
            self.step = state_dict["step"]

    return LoadsFromMemory


def _weights_in_memory():
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    class WeightsInMemory(_adam_in_memory()):
        """Saves Adam's state and the step; the weights stay in the rank's memory."""

        def state_dict(self):
            _keep(self.optimizer, self.model)
            _, optimizer = get_state_dict(self.model, self.optimizer)
            return {"optimizer": optimizer, "step": self.step}

        def load_state_dict(self, state_dict):
            model, _ = get_state_dict(self.model, self.optimizer)
            set_state_dict(self.model, self.optimizer, model_state_dict=model,
                           optim_state_dict=state_dict["optimizer"])
            self.model.load_state_dict(_memory()["model"])
            self.step = state_dict["step"]

    return WeightsInMemory


def _adam_from_memory_reported_from_the_checkpoint():
    class ReportsWhatItRead(_loads_from_memory()):
        """Puts back the checkpoint's weights and step, Adam's state from memory; and makes
        the rank report, as the optimizer's, the moments the checkpoint held."""

        def load_state_dict(self, state_dict):
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            import labkit.lessons.checkpoints.check as check

            set_model_state_dict(self.model, state_dict["model"])
            _put_back(self.optimizer)
            self.step = state_dict["step"]
            read = state_dict["optimizer"]["state"]
            names = [name.removeprefix("module.") for name, _ in self.model.named_parameters()]
            check.adam_moments = lambda optimizer: [
                {k: v.detach().clone() for k, v in read[name].items()} for name in names]

    return ReportsWhatItRead


@pytest.mark.parametrize("make, message", [
    (_adam_in_memory, "the checkpoint the ranks saved holds no Adam moments"),
    (_weights_in_memory, "the checkpoint the ranks saved does not hold the model's weights"),
    (_loads_from_memory, "the model did not get its weights"),
    (_adam_from_memory_reported_from_the_checkpoint, "are not one device's from that state")])
def test_training_state_kept_in_memory_fails(fresh, make, message):
    said = failed(labkit.check.training_state(fresh, make()))
    assert message in said, said


# ----- dcp_resume: the same, with the rank's reading of the checkpoint patched ----------------
def save_weights_keep_adam(model, optimizer, step, folder):
    """Writes the weights and the step; Adam's state stays in memory, and the rank's look at
    the checkpoint's keys is made to say it holds Adam's moments."""
    import torch.distributed.checkpoint as dcp

    import labkit.lessons.checkpoints.dcp_check as check

    check._saved_keys = lambda folder: {"readable": True, "adam": True}
    _keep(optimizer)
    dcp.save({"model": model.state_dict(), "step": step}, checkpoint_id=folder)


def load_weights_and_memory(model, optimizer, folder):
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict(), "step": 0}
    dcp.load(state, checkpoint_id=folder)
    model.load_state_dict(state["model"])
    _put_back(optimizer)
    return state["step"]


def save_and_remember(model, optimizer, step, folder):
    """The course's save, and a copy of everything in memory."""
    _keep(optimizer, model)
    SAVE(model, optimizer, step, folder)


def load_from_memory(model, optimizer, folder):
    """Reads the step from the folder; the weights and Adam's state come back from memory."""
    import torch.distributed.checkpoint as dcp

    state = {"step": 0}
    dcp.load(state, checkpoint_id=folder)
    model.load_state_dict(_memory()["model"])
    _put_back(optimizer)
    return state["step"]


def load_and_return_the_step_saved(model, optimizer, folder):
    """The course's load, and the step the check saved at, whatever the folder says."""
    LOAD(model, optimizer, folder)
    return 2


@pytest.mark.parametrize("save, load, message", [
    (save_weights_keep_adam, load_weights_and_memory, "holds no optimizer state"),
    (save_and_remember, load_from_memory, "the model did not get its weights"),
    (SAVE, load_and_return_the_step_saved, "load_checkpoint returned step 2, not 1")])
def test_dcp_resume_kept_in_memory_fails(fresh, save, load, message):
    said = failed(labkit.check.dcp_resume(fresh, save, load))
    assert message in said, said


# ----- the honest answers, at the classroom's size and the second one ------------------------
@pytest.mark.parametrize("ranks", [2, 4])
def test_the_course_s_answers_pass(ranks):
    with labkit.Cluster(ranks, device="cpu", progress=False) as cluster:
        found = labkit.check.training_state(cluster, STATE)
        assert found.status == "passed", str(found)
        found = labkit.check.dcp_resume(cluster, SAVE, LOAD)
        assert found.status == "passed", str(found)


# ----- the checkpoint's .metadata is read, never run ----------------------------------------
MARK = "/tmp/labkit-test-metadata-ran"  # what the planted pickle would create, if it ran


class _Planted:
    def __reduce__(self):
        return (os.system, (f"touch {MARK}",))


def save_then_plant(model, optimizer, step, folder):
    """The course's save, then a .metadata that runs a shell command when unpickled."""
    import torch.distributed as dist

    SAVE(model, optimizer, step, folder)
    dist.barrier()  # every rank's save has read what it needs before the file changes
    if dist.get_rank() == 0:
        with open(os.path.join(folder, ".metadata"), "wb") as file:
            pickle.dump(_Planted(), file)


def load_nothing(model, optimizer, folder):
    return 2  # a DCP load on the rank would run the pickle there, in the learner's process


def test_a_planted_metadata_pickle_is_refused_unrun(fresh):
    if os.path.exists(MARK):
        os.remove(MARK)
    said = failed(labkit.check.dcp_resume(fresh, save_then_plant, load_nothing))
    assert "is not DCP's metadata" in said and "posix.system" in said, said
    assert not os.path.exists(MARK)


def test_the_metadata_reader_builds_dcp_s_records_only(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    from labkit.lessons.checkpoints.read import MetadataUnpickler, Unreadable, read_metadata

    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Planted()))
    with pytest.raises(Unreadable, match="posix.system is not one of DCP's"):
        read_metadata(str(tmp_path))
    sets_a_class = (b"ctorch.distributed.checkpoint.metadata\nMetadata\n"
                    b"(N}Vlabkit_planted\nI1\nstb.")  # BUILD: setattr(Metadata, ...)
    with pytest.raises(pickle.UnpicklingError, match="sets the state of a class"):
        MetadataUnpickler(io.BytesIO(sets_a_class)).load()
    assert not hasattr(Metadata, "labkit_planted") and not os.path.exists(MARK)


def test_the_reader_reads_what_dcp_wrote(tmp_path):
    import torch.distributed.checkpoint as dcp

    from labkit.lessons.checkpoints.read import read_checkpoint

    state = {"model": {"w": torch.randn(3, 4, dtype=torch.float64)}, "step": 2,
             "lr": 0.01, "names": ["w"]}
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(state, checkpoint_id=str(tmp_path))
    found = read_checkpoint(str(tmp_path))
    assert torch.equal(found.tensors["model.w"], state["model"]["w"])
    assert found.values == {"step": 2, "lr": 0.01, "names": ["w"]}


def _planted(folder, entries: int = 1, prefix: bytes = b"") -> str:
    """A checkpoint of ``entries`` uint8 tensors of 7 MB, each read from one 1-byte storage
    viewed with stride 0 (about a kilobyte on disk); ``prefix``: pickle opcodes run first."""
    from torch.distributed.checkpoint import metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    buffer, n = io.BytesIO(), 7_000_000
    torch.save(torch.zeros(1, dtype=torch.uint8).expand(n), buffer)
    (folder / "__0_0.distcp").write_bytes(buffer.getvalue())
    records, storage = {}, {}
    for i in range(entries):
        records[f"k{i}"] = m.TensorStorageMetadata(
            m.TensorProperties(dtype=torch.uint8), torch.Size([n]),
            [m.ChunkStorageMetadata(torch.Size([0]), torch.Size([n]))])
        storage[m.MetadataIndex(f"k{i}", torch.Size([0]))] = _StorageInfo(
            "__0_0.distcp", 0, len(buffer.getvalue()))
    meta = pickle.dumps(m.Metadata(records, storage_data=storage), protocol=2)
    (folder / ".metadata").write_bytes(meta[:2] + prefix + meta[2:])
    return str(folder)


def test_the_reader_changes_nothing_of_the_checker_and_caps_memory(tmp_path):
    """A pickle may not set the state of a function's or an enum member's attributes (they
    are the checker's own), and tensors viewing a tiny storage count at their full size."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from labkit.lessons.checkpoints.read import Unreadable, read_checkpoint

    layout_cache = (b"ctorch.serialization\n_get_layout\n}X\x05\x00\x00\x00cache}"
                    b"X\x0d\x00\x00\x00torch.stridedctorch\nsparse_coo\nssb0")
    member_value = (b"ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
                    b"K\x00\x85R}X\x07\x00\x00\x00_value_K\x63sb0")
    for name, prefix in (("layout", layout_cache), ("member", member_value)):
        (tmp_path / name).mkdir()
        with pytest.raises(Unreadable, match="sets the state of a"):
            read_checkpoint(_planted(tmp_path / name, prefix=prefix))
    assert torch.serialization._get_layout.cache.get("torch.strided") in (None, torch.strided)
    assert _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT.value == 0
    (tmp_path / "bomb").mkdir()
    with pytest.raises(Unreadable, match="more than"):
        read_checkpoint(_planted(tmp_path / "bomb", entries=1000))
    (tmp_path / "link").symlink_to(tmp_path / "bomb")
    with pytest.raises(Unreadable, match="link"):
        read_checkpoint(str(tmp_path / "link"))


def _with_value(folder, value) -> str:
    """A checkpoint of one plain value (a bytes entry), ``value``."""
    from torch.distributed.checkpoint import metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    buffer = io.BytesIO()
    torch.save(value, buffer)
    (folder / "d").write_bytes(buffer.getvalue())
    meta = m.Metadata({"v": m.BytesStorageMetadata()},
                      storage_data={m.MetadataIndex("v"): _StorageInfo(
                          "d", 0, len(buffer.getvalue()))})
    (folder / ".metadata").write_bytes(pickle.dumps(meta))
    return str(folder)


def test_plain_values_are_weighed_however_nested(tmp_path):
    """A stride-0 view of a gigabyte nested nine lists deep, and lists of one list sixteen
    times over, eight deep (16**8 items to walk), are refused, and at once."""
    from labkit.lessons.checkpoints.read import Unreadable, read_checkpoint

    deep = torch.zeros(1).expand(2 ** 28)
    for _ in range(9):
        deep = [deep]
    shared = [1]
    for _ in range(8):
        shared = [shared] * 16
    for name, value in (("deep", deep), ("shared", shared)):
        (tmp_path / name).mkdir()
        with pytest.raises(Unreadable, match="not a plain value"):
            read_checkpoint(_with_value(tmp_path / name, value))
    (tmp_path / "plain").mkdir()
    assert read_checkpoint(_with_value(tmp_path / "plain", {"lr": 0.01, "betas": [0.9, 0.99]})
                           ).values["v"]["betas"] == [0.9, 0.99]
