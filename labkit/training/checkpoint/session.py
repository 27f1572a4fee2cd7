"""Checkpoints on the ranks of a run: resume from the newest good one, save every k steps.

Every rank calls the same methods in the same order (each one is collective). A save is
DCP's ``dcp.save`` of this rank's shards into ``step-N.tmp``; each rank writes its records
beside its shard; then rank 0 commits the folder (``store.commit``: marker last, then the
rename).
The time of ``dcp.save`` and the bytes of this rank's file are added to the step's record
(``checkpoint_s``, ``checkpoint_bytes``).

With ``config.checkpoint_async`` the save is DCP's ``dcp.async_save``: the state is copied
to host memory, then a background thread plans and writes it over a gloo group of its own
(so its collectives never interleave with training's), while training goes on. The step's
``checkpoint_s`` is then the time training was held up (the copy), ``checkpoint_write_s`` the
time until the files were written; rank 0 commits from DCP's thread once they are. The
records saved with it stop before that save's own times. The next save, and the end of the
run, wait for it. Batches are made from (seed, step), so the step
is the data position: a resumed run sees exactly the batches the lost one would have.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import threading
import time
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from labkit.training.checkpoint.state import ModelAndOptimizer, RandomState, rng_key
from labkit.training.checkpoint.store import (
    Found,
    commit,
    prune,
    records_file,
    scan,
    step_dir,
    tmp_dir,
    write_json,
)
from labkit.training.step.record import StepRecord


class Checkpointer:
    """One rank's side of a run's checkpoints (``config.checkpoint_dir``)."""

    def __init__(self, run, built, config):
        self.run, self.config = run, config
        self.root = Path(config.checkpoint_dir)
        self.config_dict = config.to_dict()
        self.model = ModelAndOptimizer(built.parts, built.names, built.optimizer)
        self.rng = RandomState(run.device)
        self.resumed_from: str | None = None
        # DCP's background thread needs a group of its own (collective on every rank).
        self.async_group = dist.new_group(backend="gloo") if config.checkpoint_async else None
        self.pending = None  # (future, written, failed, done, record) of an async save

    # ----- resuming ------------------------------------------------------------------
    def resume(self) -> tuple[int, list[StepRecord]]:
        """Load the newest good checkpoint of this run; return the steps it had done and
        the records of those steps (marked ``from_checkpoint``). ``(0, [])`` when there is
        none. A checkpoint that DCP cannot read is passed over, on every rank alike (DCP
        raises on all ranks when one fails), and the one before it is tried."""
        found, _ = scan(self.root, self.config_dict, self.config.steps)
        for candidate in found:
            try:
                self._load(candidate)
            except (CheckpointException, RuntimeError, OSError, ValueError) as exc:
                if self.run.rank == 0:
                    print(f"checkpoint {candidate.path.name} could not be loaded, passed "
                          f"over: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
                continue
            self.resumed_from = candidate.path.name
            return candidate.step, self._records(candidate)
        return 0, []

    def _load(self, found: Found) -> None:
        state = {"train": self.model}
        if found.marker["world_size"] == self.run.world_size:
            state[rng_key(self.run.rank)] = self.rng  # else: no generator of this rank saved
        dcp.load(state, checkpoint_id=found.path)

    def _records(self, found: Found) -> list[StepRecord]:
        """This rank's records of the steps done, from the checkpoint. Saved on another rank
        count, a rank gets a saved rank's records with the loss of the whole batch (the
        mean over the saved ranks' slices), so the report's losses stay the run's."""
        saved = [json.loads((found.path / records_file(r)).read_text())
                 for r in range(found.marker["world_size"])]
        rank = self.run.rank
        if len(saved) == self.run.world_size:
            mine = [dict(r) for r in saved[rank]]
        else:
            mine = [dict(r) for r in saved[min(rank, len(saved) - 1)]]
            for step, record in enumerate(mine):
                losses = [s[step]["loss"] for s in saved if not math.isnan(s[step]["loss"])]
                record["loss"] = statistics.fmean(losses) if losses else math.nan
                record["saved_on_ranks"] = len(saved)
        for record in mine:
            record["from_checkpoint"] = True
        return [StepRecord.from_dict(r) for r in mine]

    # ----- saving --------------------------------------------------------------------
    def due(self, done: int) -> bool:
        every = self.config.checkpoint_every
        return done == self.config.steps or bool(every and done % every == 0)

    def save(self, done: int, records: list[StepRecord]) -> None:
        """Save after ``done`` steps; ``records`` are this rank's so far (the last one gets
        the save's time and bytes)."""
        self.finish()  # an async save still under way is committed first
        tmp, rank = tmp_dir(self.root, done), self.run.rank
        if rank == 0:
            if tmp.exists():  # a save killed before it finished
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        dist.barrier()
        state = {"train": self.model, rng_key(rank): self.rng}
        if self.async_group is not None:
            return self._save_async(done, records, state)
        start = time.perf_counter()
        dcp.save(state, checkpoint_id=tmp)
        records[-1].extras["checkpoint_s"] = time.perf_counter() - start
        records[-1].extras["checkpoint_bytes"] = _shard_bytes(tmp, rank)
        write_json(tmp / records_file(rank), [r.to_dict() for r in records])
        dist.barrier()  # every rank's shard and records are written
        if rank == 0:
            self._commit(done)
        dist.barrier()  # nobody reads or saves again before the checkpoint is visible

    def _save_async(self, done: int, records: list[StepRecord], state: dict) -> None:
        """Start ``dcp.async_save``; rank 0 commits from DCP's thread once it is written
        (DCP's last collective has every rank's writes done by then)."""
        tmp = tmp_dir(self.root, done)
        write_json(tmp / records_file(self.run.rank), [r.to_dict() for r in records])
        start = time.perf_counter()
        future = dcp.async_save(state, checkpoint_id=tmp, process_group=self.async_group)
        record = records[-1]  # this step's (the list grows while the thread writes)
        record.extras["checkpoint_s"] = time.perf_counter() - start  # training held up
        written, failed = threading.Event(), []

        def on_written(result) -> None:
            # runs on DCP's thread, whose executor logs and drops what a callback raises:
            # a failed commit (a full disk, a refused rename) is kept for finish() to raise,
            # and the event is set whatever happens (finish() waits on it)
            try:
                record.extras["checkpoint_write_s"] = time.perf_counter() - start
                if result.exception() is None and self.run.rank == 0:
                    self._commit(done)
            except BaseException as error:  # noqa: BLE001 - re-raised by finish()
                failed.append(error)
            finally:
                written.set()

        future.add_done_callback(on_written)
        self.pending = (future, written, failed, done, record)
        if done == self.config.steps:
            self.finish()  # the run's last checkpoint is on disk before it returns

    def finish(self) -> None:
        """Wait until an async save under way is written and committed."""
        if self.pending is None:
            return
        future, written, failed, done, record = self.pending
        self.pending = None
        future.result()  # raises what the save raised
        written.wait()
        if failed:  # rank 0's commit failed on DCP's thread
            raise failed[0]
        dist.barrier()  # rank 0 has committed
        record.extras["checkpoint_bytes"] = _shard_bytes(step_dir(self.root, done),
                                                         self.run.rank)

    def close(self) -> None:
        """At the end of the run (every rank): let go of the async save's gloo group, whose
        sockets and threads would otherwise stay open on ranks that outlive the run."""
        self.finish()
        if self.async_group is not None:
            dist.destroy_process_group(self.async_group)
            self.async_group = None

    def _commit(self, done: int) -> None:
        commit(tmp_dir(self.root, done), step_dir(self.root, done), done, self.config_dict,
               self.run.world_size, str(self.run.layout))
        prune(self.root, self.config_dict, done, self.config.checkpoint_keep)


def _shard_bytes(folder: Path, rank: int) -> int:
    return sum(f.stat().st_size for f in folder.glob(f"__{rank}_*.distcp"))
