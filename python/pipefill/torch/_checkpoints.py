"""pipefill.torch._checkpoints: training_job's checkpoints (the ``_Checkpoints`` mixin of
``TrainingJob``). A checkpoint is due every ``every`` steps and after the last; the job's
available bound is held at the due step, the state is copied at the trainer's next
``iteration_end`` (or by the writer thread after FALLBACK_BUBBLES bubbles without one, or by
``wait()``), and the writer thread writes it atomically; ``_load`` resumes from one.
"""
from __future__ import annotations

import os
import pathlib
import warnings
from typing import Optional

import torch

from ._job_common import FillJobError, _skip, _write_atomically
from ._training_state import Snapshot, _to_host

FALLBACK_BUBBLES = 256
"""Bubbles a runtime that never saw ``iteration_end`` begins while a checkpoint is due before the
job's writer thread takes the checkpoint itself (more than any pipeline iteration has, so a
trainer that does call ``iteration_end`` never gets there before its first call)."""



class _Checkpoints:
    """Checkpoint methods of TrainingJob (its fields: checkpoint, every, steps, step, _due,
    _snapped, _pending, _positions, _batches, _rng, runtime, cuda, losses, snapshots)."""

    def _next_due(self, step: int) -> int:
        """The step the next checkpoint is taken at (multiples of ``every``, and the last)."""
        if self.checkpoint is None:
            return self.steps
        return min(self.steps, (step // self.every + 1) * self.every)


    # -- checkpoints --
    def _claim_snapshot(self) -> Optional[int]:
        """The due step when its state should be copied now (and by the caller), else None."""
        with self._cv:
            if (self.checkpoint is None or self._error is not None or self._closing
                    or self.step != self._due or self._snapped == self.step
                    or self._pending is not None):
                return None
            self._snapped = self.step
            return self.step

    def _take_snapshot(self, taken_at: str) -> None:
        step = self._claim_snapshot()
        if step is None:
            return
        in_bubble = self.runtime.in_bubble
        event = None
        if self.cuda:
            # The state was last written by the fill stream, whose items are complete
            # (harvested): the copies need no stream dependency, so the trainer's queued work
            # does not delay them.
            stream = self._snapshot_stream
            with torch.cuda.stream(stream):
                model = _to_host(self.module.state_dict())
                optimizer = _to_host(self.optimizer.state_dict())
                event = torch.cuda.Event()
                event.record(stream)
        else:
            model = _to_host(self.module.state_dict())
            optimizer = _to_host(self.optimizer.state_dict())
        with self._cv:
            position = self._positions.pop(step, None)
            for older in [s for s in self._positions if s < step]:
                del self._positions[older]
        if position is None:  # CPU: nothing was drawn past the due step
            position = self._batches.state()
        rng = torch.get_rng_state() if self.cuda else self._rng.clone()
        state = dict(self._identity(), step=step, model=model, optimizer=optimizer,
                     rng=rng, data=position, losses=list(self.losses))
        with self._cv:
            self.snapshots.append(Snapshot(step, in_bubble, taken_at))
            self._pending = (step, state, event)
            self._cv.notify_all()
        if event is None:
            self._release_bound(step)  # the clone is complete: the job may run on

    def _release_bound(self, step: int) -> None:
        """Raises the available bound to the next due step (after the copy of ``step``)."""
        due = self._next_due(step)
        with self._cv:
            self._due = due
            self._cv.notify_all()
        if due > step and not self.cuda:  # on CUDA the feeder raises it batch by batch
            self.job._native.set_available(self._claims_bound(due))

    def _on_iteration_end(self) -> None:
        """Runtime.iteration_end's hook (the trainer thread; never raises)."""
        try:
            self._take_snapshot("iteration_end")
        except Exception as error:
            self._fail(f"training_job '{self.name}': checkpoint at step {self.step}: "
                       f"{type(error).__name__}: {error}")

    def _fallback_due(self) -> bool:
        rt = self.runtime
        with self._cv:
            dry = self.step == self._due and self._snapped != self.step and self._pending is None
            since = self._dry_at_bubble
        return (dry and getattr(rt, "_iteration_ends", 0) == 0
                and rt._bubble_index - since >= FALLBACK_BUBBLES)

    def _write_loop(self) -> None:
        try:
            while True:
                with self._cv:
                    while self._pending is None and not self._stopping():
                        if self._fallback_due():
                            break
                        self._cv.wait(0.05)
                    if self._stopping():
                        return
                    pending = self._pending
                if pending is None:  # the trainer never calls iteration_end
                    if not self._warned_fallback:
                        self._warned_fallback = True
                        warnings.warn(f"pipefill.torch.training_job '{self.name}': the runtime "
                                      f"has seen no iteration_end call in {FALLBACK_BUBBLES} "
                                      "bubbles, so checkpoints are taken by the job's writer "
                                      "thread (possibly while a bubble is open); call "
                                      "runtime.iteration_end() after each step to take them "
                                      "outside bubbles", RuntimeWarning, stacklevel=2)
                    self._take_snapshot("fallback")
                    continue
                step, state, event = pending
                if event is not None:
                    event.synchronize()  # this thread only; the job is dry meanwhile
                    self._release_bound(step)
                self._save(step, state)
                with self._cv:
                    self._pending = None
                    if step == self.steps:
                        self._finished = True
                    self._cv.notify_all()
        except Exception as error:
            self._fail(error.message if isinstance(error, FillJobError)
                       else f"training_job '{self.name}': checkpoint writer: "
                            f"{type(error).__name__}: {error}")

    def _stopping(self) -> bool:
        return self._error is not None or self._closing

    def _identity(self) -> dict:
        return {"kind": "pipefill.training_job", "name": self.name, "steps": self.steps}

    def _save(self, step: int, state: dict) -> None:
        assert self.checkpoint is not None
        try:
            _write_atomically(self.checkpoint, lambda f: torch.save(state, f), True)
        except OSError as error:
            raise FillJobError(f"training_job '{self.name}': checkpoint "
                               f"{os.fspath(self.checkpoint)!r} at step {step} could not be "
                               f"written: {error}") from None

    def _load(self, path: pathlib.Path) -> None:
        if not path.exists():
            return  # a first attempt
        try:
            state = torch.load(path, weights_only=False)
        except Exception as error:
            raise ValueError(f"resume checkpoint {os.fspath(path)!r} cannot be read: "
                             f"{error}") from None
        for key, value in self._identity().items():
            if not isinstance(state, dict) or state.get(key) != value:
                got = state.get(key) if isinstance(state, dict) else type(state).__name__
                raise ValueError(f"resume checkpoint {os.fspath(path)!r} belongs to another job: "
                                 f"its {key} is {got!r}, this job's is {value!r}")
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.losses = list(state["losses"])
        self.step = int(state["step"])
        rng, position = state["rng"], state.get("data")

        def restore() -> None:
            if position is not None:
                self._batches.restore(position)
            else:  # a checkpoint without a data position (before issue 25): re-iterate
                torch.set_rng_state(rng)
                _skip(self._batches, self.step)
            torch.set_rng_state(rng)

        self._rng = rng
        self._in_job_rng(restore)
