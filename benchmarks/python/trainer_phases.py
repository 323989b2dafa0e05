"""The trainer's step, phase by phase, while streaming_bench's job fills its bubbles (issue 32):

  python benchmarks/python/trainer_phases.py [ITEM_COST_US | ""] [SWITCH_INTERVAL_S]

One process: the job (streaming_bench's model, 400 items, 64 slots; ITEM_COST_US given and kept,
"" = timed and learned) and a trainer loop of 4000 us bubbles followed by its matmuls; prints the
median bubble phase (bubble begin, the 4000 us wait, bubble end, the stream synchronize - the time
the trainer's thread spends from entering the bubble to getting the GIL back after it), the
median compute phase against the same compute without the job, and the items run per bubble and
during the compute. SWITCH_INTERVAL_S sets sys.setswitchinterval before the job (the job then
keeps a lower one, see pipefill/torch/_job_common.py).
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "examples"))
import pipefill as pf  # noqa: E402
import pipefill.torch as pft  # noqa: E402
import streaming_bench as b  # noqa: E402

torch.set_num_threads(1)
cost = float(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] else None
if len(sys.argv) > 2:
    sys.setswitchinterval(float(sys.argv[2]))
reps = b.calibrate(4000.0)
rt = b.host_runtime()
job = pft.inference_job(rt, b.model(), b.samples(400 * b.BATCH), batch_size=b.BATCH, slots=64,
                        sink=lambda i, y: None, item_cost_us=cost)
stream = rt.high_priority_stream()
native = job.job._native
rows = []
while not job.progress().finished and len(rows) < 2000:
    t0 = time.perf_counter()
    r0 = native.items_run()
    with rt.bubble(stream, expected_us=4000.0):
        pf.host_stream_delay(stream, 4000.0)
    pf.host_stream_synchronize(stream)
    t1 = time.perf_counter()
    r1 = native.items_run()
    b.cpu_compute(reps)
    t2 = time.perf_counter()
    r2 = native.items_run()
    rt.iteration_end()
    rows.append((t1 - t0, t2 - t1, r1 - r0, r2 - r1))
job.wait(timeout=60)
job.close()
rt.close()
plain = []
for _ in range(40):
    t1 = time.perf_counter()
    b.cpu_compute(reps)
    plain.append(time.perf_counter() - t1)
print(f"item cost {cost} (switch interval now {sys.getswitchinterval()}): bubble phase "
      f"{statistics.median(r[0] for r in rows) * 1e3:.2f} ms, compute phase "
      f"{statistics.median(r[1] for r in rows) * 1e3:.2f} ms (without the job "
      f"{statistics.median(plain) * 1e3:.2f} ms), items per bubble "
      f"{statistics.mean(r[2] for r in rows):.1f}, items during the compute "
      f"{statistics.mean(r[3] for r in rows):.2f}")
