"""Checks of a runtime's Chrome trace shared by the graph-job tests and the gloo pipeline
worker (which runs as a script from this folder, so both import it by name)."""
from __future__ import annotations

import json


def items_against_bubbles(trace_path, item_starts):
    """(items started outside every bubble, most items of one bubble started after its end)
    from the runtime's trace and a host-backend GraphJob's item start times (same clock). The
    gate allows one late start per bubble: the item claimed just before the gate closed (its
    thread may run it later on a loaded machine); a second would be a claim after the close."""
    import bisect
    with open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    bubbles = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                     if e.get("ph") == "X" and e.get("cat") == "bubble")
    begins = [b for b, _ in bubbles]
    outside, late = 0, {}
    for t in item_starts:
        i = bisect.bisect_right(begins, t + 1e-6) - 1
        if i < 0:
            outside += 1
        elif t > bubbles[i][1]:
            late[i] = late.get(i, 0) + 1
    return outside, max(late.values(), default=0)
