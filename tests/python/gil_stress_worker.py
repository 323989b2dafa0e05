"""The user-thread stress of test_gil_stress.py, run in its own process (so a deadlock ends in a
timeout with every thread's stack, not a hung suite).

A host-backend runtime runs a pipefill.torch inference job whose items run a torch module on the
fill stream's thread (each item needs the GIL). While those items run - the trainer thread has
enqueued a bubble and not yet synchronized - the main thread does what users do between steps:
creates a native job (the README's MlpInference), reads its info and the runtime's stats, waits on
it with a timeout, destroys it; every few rounds it also creates, waits on and closes a second
torch job. Before issue 25 the very first create_job hung: pfJobCreate synchronized the fill
streams holding the GIL while the fill thread's item waited for the GIL.

argv: rounds, out (a JSON file with the counts).
"""
from __future__ import annotations

import faulthandler
import json
import sys
import threading

import torch
from torch import nn

import pipefill as pf
import pipefill.torch as pft

ROUNDS = int(sys.argv[1])
OUT = sys.argv[2]
faulthandler.dump_traceback_later(float(sys.argv[3]) if len(sys.argv) > 3 else 240.0, exit=True)

torch.manual_seed(0)
torch.set_num_threads(1)
module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).eval()


def samples(count: int):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(64, generator=g) for _ in range(count)]


rt = pf.Runtime(backend="host", reserved_sms=0, safety_margin_us=0.0, safety_margin_fraction=0.0,
                min_samples=1000000)
stream = rt.high_priority_stream()
outputs = {}
lock = threading.Lock()


def sink(index, output):
    with lock:
        outputs[index] = output


# Many items, each a few hundred microseconds: one is nearly always running on the fill thread.
big = pft.inference_job(rt, module, samples(4096), batch_size=16, sink=sink, name="torch-main",
                        item_cost_us=200.0)
counts = dict(rounds=0, native_created=0, native_waits_timed_out=0, torch_jobs_created=0,
              items_seen_running=0)
for round_ in range(ROUNDS):
    # The trainer's bubble: enqueued, not waited for, so fill items run from here on.
    with rt.bubble(stream, expected_us=20000.0):
        pf.host_stream_delay(stream, 20000.0)
    before = big.progress().items_done
    native = rt.create_job(pf.MlpInference(items=4, rows=8))
    counts["native_created"] += 1
    native.info()
    rt.stats()
    try:
        native.wait(timeout=0.001)
    except pf.PipeFillError as error:
        if error.code != pf.Result.TIMEOUT:
            raise
        counts["native_waits_timed_out"] += 1
    native.close()
    if round_ % 10 == 0:
        small = pft.inference_job(rt, module, samples(8), batch_size=4, sink=lambda i, o: None,
                                  name=f"torch-small-{round_}", item_cost_us=200.0)
        counts["torch_jobs_created"] += 1
        small.close()
    if big.progress().items_done > before:
        counts["items_seen_running"] += 1
    pf.host_stream_synchronize(stream)
    rt.iteration_end()
    counts["rounds"] += 1

big.close()
rt.close()
counts["outputs"] = len(outputs)
with open(OUT, "w") as f:
    json.dump(counts, f)
faulthandler.cancel_dump_traceback_later()
