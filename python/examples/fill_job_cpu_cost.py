#!/usr/bin/env python3
# CPU cost of the example MLP inference job's real results on the simulator: one simulated
# pipeline step (4 bubbles of 1 ms + 750 us compute each = 7 ms), default shapes, with
# keep_every default (no CPU result) and keep_every=1 (every filled item computed on the CPU).
import time
import pipefill as pf

def run(keep_every):
    with pf.SimWorld(1) as world:
        rt = pf.Runtime(backend="sim", sim_world=world, device=0, min_samples=0)
        job = rt.create_job(pf.MlpInference(items=1_000_000, keep_every=keep_every))
        stream = world.stream(0, -1)
        start = time.perf_counter()
        for _ in range(4):
            with rt.bubble(stream, expected_us=1000.0):
                stream.delay(1000.0)
            stream.launch_kernel(750.0, 132)
        rt.iteration_end()
        world.run_until_idle()
        rt.synchronize()
        wall = time.perf_counter() - start
        items = rt.stats().items_completed
        cost = job.item_cost_us
        job.close(); rt.close()
    return wall, items, cost

for keep in (None, 1):
    wall, items, cost = run(keep)
    print(f"MlpInference keep_every={keep}: one simulated 7 ms step, {items} items filled "
          f"(modelled {cost:.2f} us each on one SM), wall {wall:.3f} s = "
          f"{1e6 * wall / max(items, 1):.1f} us of CPU per item", flush=True)
