"""pipefill.torch._training_state: the state a training_job checkpoint holds besides the model and
the optimizer - the data position (``_Batches``: epoch, batches drawn, RNG states before the
epoch's ``iter()``), host copies of a state (``_to_host``), and the ``Snapshot`` record of when a
checkpoint's state was copied.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional

import torch

@dataclass(frozen=True)
class Snapshot:
    """When a checkpoint's state was copied: the step, whether a bubble of the runtime was open
    then (``Runtime.in_bubble``), and who took it ("iteration_end", "fallback" or "wait")."""
    step: int
    in_bubble: bool
    taken_at: str


def _to_host(value: Any) -> Any:
    """A copy of a (nested) state whose tensors are host tensors: on CUDA enqueued on the current
    stream into pinned memory (non_blocking), on CPU cloned."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value.detach().clone()
        return value.detach().to("cpu", non_blocking=True)
    if isinstance(value, dict):
        return type(value)((k, _to_host(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_host(v) for v in value)
    return copy.deepcopy(value)


# ---- the data position a checkpoint holds -------------------------------------------------

def _generators(data: Any) -> List["torch.Generator"]:
    """The torch.Generators that decide the order of ``data`` (a DataLoader's, its sampler's, its
    batch sampler's sampler's), each once, in a fixed order."""
    found: List[torch.Generator] = []
    candidates = [data, getattr(data, "sampler", None), getattr(data, "batch_sampler", None),
                  getattr(getattr(data, "batch_sampler", None), "sampler", None)]
    for owner in candidates:
        generator = getattr(owner, "generator", None)
        if isinstance(generator, torch.Generator) and all(generator is not g for g in found):
            found.append(generator)
    return found


def _skips_by_index(data: Any, iterator: Any) -> bool:
    """A single-process DataLoader over a map-style dataset: skipping a batch is advancing its
    sampler (no sample is loaded). Any other data is skipped by drawing the batches (worker
    processes' RNGs advance as in the run that drew them)."""
    loader = torch.utils.data.DataLoader
    return (isinstance(data, loader) and data.num_workers == 0
            and not isinstance(data.dataset, torch.utils.data.IterableDataset)
            and hasattr(iterator, "_sampler_iter") and hasattr(iterator, "_num_yielded"))


class _Batches:
    """The training data, iterated again each time it ends, with a position a checkpoint can
    hold: the epoch, the batches drawn in it, and the RNG states right before its ``iter()``
    (torch's CPU RNG and every generator of :func:`_generators`). Restoring sets those states,
    calls ``iter()`` again (the sampler draws the same order) and skips the drawn batches without
    drawing anything new, so the next batch is the one the uninterrupted run drew."""

    def __init__(self, data: Iterable[Any], name: str) -> None:
        self.data, self.name = data, name
        self.epoch, self.in_epoch = 0, 0
        self.epoch_start: Optional[dict] = None
        self._iterator: Optional[Iterator[Any]] = None

    def _rng_states(self) -> dict:
        return {"torch": torch.get_rng_state(),
                "generators": [g.get_state() for g in _generators(self.data)]}

    def _set_rng_states(self, states: dict) -> None:
        generators = _generators(self.data)
        if len(generators) != len(states["generators"]):
            raise ValueError(f"training_job '{self.name}': the checkpoint's data had "
                             f"{len(states['generators'])} torch.Generator(s) (DataLoader / "
                             f"sampler), this job's data has {len(generators)}: resume with the "
                             "same kind of data")
        torch.set_rng_state(states["torch"])
        for generator, state in zip(generators, states["generators"]):
            generator.set_state(state)

    def state(self) -> dict:
        """The position after the batches drawn so far."""
        return {"epoch": self.epoch, "in_epoch": self.in_epoch, "epoch_start": self.epoch_start}

    def __iter__(self) -> "_Batches":
        return self

    def __next__(self) -> Any:
        while True:
            if self._iterator is None:
                self.epoch_start = self._rng_states()
                self._iterator = iter(self.data)
                self.in_epoch = 0
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self.in_epoch == 0:
                    raise ValueError(f"training_job '{self.name}': the data yielded no batch") \
                        from None
                self._iterator = None
                self.epoch += 1
                continue
            self.in_epoch += 1
            return batch

    def restore(self, position: dict) -> None:
        """Back to ``position`` (from :meth:`state` of the run that wrote the checkpoint); the
        caller then sets torch's RNG to the checkpoint's state."""
        self._set_rng_states(position["epoch_start"])
        self.epoch_start = position["epoch_start"]
        self.epoch = int(position["epoch"])
        iterator = iter(self.data)
        count = int(position["in_epoch"])
        if _skips_by_index(self.data, iterator):
            sampler = iterator._sampler_iter  # type: ignore[attr-defined]
            for drawn in range(count):
                if next(sampler, None) is None:
                    raise self._shorter(drawn, count)
            iterator._num_yielded += count  # type: ignore[attr-defined]
        else:
            for drawn in range(count):
                if next(iterator, _END) is _END:
                    raise self._shorter(drawn, count)
        self._iterator, self.in_epoch = iterator, count

    def _shorter(self, drawn: int, count: int) -> ValueError:
        return ValueError(f"training_job '{self.name}': the checkpoint is {count} batches into "
                          f"epoch {self.epoch}, but this data's epoch has only {drawn}: resume "
                          "with the same data")


_END = object()
