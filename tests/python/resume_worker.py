"""One attempt of a fine-tune as a fill job, for test_training_resume.py (issue 25): a model with
dropout, a shuffling DataLoader over a map-style dataset of (x, y) samples with random noise added
per sample (an augmentation: it draws from torch's RNG, in the worker processes when
num_workers > 0), AdamW, checkpoints every EVERY steps, resume= from the checkpoint.

    resume_worker.py OUT_DIR CONFIG [KILL_AT]

KILL_AT: the process kills itself with SIGKILL inside step KILL_AT (mid-step, on the fill
thread). At the end OUT_DIR/result.pt holds the parameters, the losses and the step it resumed
from."""
from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft

STEPS, EVERY, SAMPLES, BATCH, DIM, CLASSES = 40, 5, 46, 4, 8, 4
CONFIGS = ("shuffle", "generator-workers")


class NoisyPairs(torch.utils.data.Dataset):
    """(x + noise, y): the noise is drawn from torch's RNG at each access."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(SAMPLES, DIM, generator=g)
        self.y = torch.randint(0, CLASSES, (SAMPLES,), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int):
        return self.x[i] + 0.1 * torch.randn(DIM), self.y[i]


def loader(config: str) -> torch.utils.data.DataLoader:
    if config == "shuffle":  # the sampler draws its permutation from torch's global RNG
        return torch.utils.data.DataLoader(NoisyPairs(), batch_size=BATCH, shuffle=True)
    return torch.utils.data.DataLoader(NoisyPairs(), batch_size=BATCH, shuffle=True,
                                       generator=torch.Generator().manual_seed(7), num_workers=2)


def main() -> None:
    out, config = sys.argv[1], sys.argv[2]
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, CLASSES))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    jobs: list = []

    def loss_fn(logits, target):
        if jobs and jobs[0].step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # kill -9 inside step kill_at
        return nn.functional.cross_entropy(logits, target)

    ckpt = os.path.join(out, "ckpt.pt")
    with pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0,
                    safety_margin_fraction=0.0, min_samples=1000000) as runtime:
        train = pft.training_job(runtime, model, optimizer, loss_fn, loader(config), steps=STEPS,
                                 checkpoint=ckpt, every=EVERY, resume=ckpt, name="finetune",
                                 item_cost_us=1000.0)  # fits the 3 ms bubbles on a loaded machine
        jobs.append(train)
        print(f"{config}: resumed at step {train.resumed_from}, kill at {kill_at}", flush=True)
        stream = runtime.high_priority_stream()
        while not train.progress().finished and train.error is None:
            with runtime.bubble(stream, expected_us=3000.0):
                pf.host_stream_delay(stream, 3000.0)
            pf.host_stream_delay(stream, 200.0)
            runtime.iteration_end()
            pf.host_stream_synchronize(stream)
        train.wait(timeout=60)
        torch.save({"params": model.state_dict(), "losses": train.losses,
                    "resumed_from": train.resumed_from}, os.path.join(out, "result.pt"))
        train.close()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # DataLoader workers and the fill threads are gone; skip interpreter teardown
