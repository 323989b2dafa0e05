"""The eager references of the torch fill-job tests: what a module computes, and what steps of
an optimizer do, run plainly on the calling thread outside any pipeline or runtime. The tests
compare the fill jobs' outputs, losses and parameters against these."""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Sequence, Tuple

import torch
from torch import nn


def eager_outputs(module: nn.Module, samples: Iterable[torch.Tensor],
                  batch: int) -> List[torch.Tensor]:
    """``module`` over ``samples`` in batches of ``batch`` (the last one may be partial)."""
    rows = list(samples)
    with torch.no_grad():
        return [module(torch.stack(rows[k:k + batch])) for k in range(0, len(rows), batch)]


def eager_steps(module: nn.Module, optimizer: Any, data: Sequence[Tuple[torch.Tensor, torch.Tensor]],
                steps: int, keep_states: bool = False) -> Tuple[List[float], Any]:
    """``steps`` MSE training steps over ``data`` (cycled). Returns the losses and the final
    state dict, or with ``keep_states`` a copy of the state dict after each step."""
    losses: List[float] = []
    states: List[Dict[str, torch.Tensor]] = []
    for k in range(steps):
        x, y = data[k % len(data)]
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(module(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if keep_states:
            states.append({n: v.clone() for n, v in module.state_dict().items()})
    return losses, (states if keep_states else module.state_dict())
