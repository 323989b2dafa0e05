#!/usr/bin/env python3
"""Independent reference figures for the real traces in this folder.

Run once: python3 tests/data/hta/reference.py > tests/data/hta/reference.json
tests/analysis_io/real_traces_test.cpp compares pipefill-analyze's library with this output.

Method (written from the definitions in docs/analysis.md, sharing no code with the analyser):
  * Device activity: complete events ("ph": "X"). cat (comma-separated, any case) holds
    "kernel" -> a kernel, a communication kernel when its name contains nccl, rccl, msccl,
    nvshmem or userbuffers (any case), else a compute kernel; "gpu_memcpy"/"memcpy" or
    "gpu_memset"/"memset" -> a copy. Device = args.device, else pid.
  * Per device: the compute kernels' union (sorted sweep); span = first start .. last end;
    bubbles = gaps between consecutive union pieces of >= 50 us.
  * Each bubble is cut at every start/end of a copy or communication kernel inside it into
    elementary segments; a segment is "copy" if a copy covers it, else "comm-only" if a
    communication kernel does, else "idle". The bubble's label is the largest of the three sums
    (ties: idle, then comm-only).
  * Start delay: for bubbles labelled comm-only or copy, end - (the latest instant in
    (start, end] at which the union of copies and communication kernels stops being busy),
    when there is such an instant.
  * Iterations from ProfilerStep markers: GPU-side ones (cat gpu_user_annotation on the
    device) unless one of them ends before a compute kernel that was launched (a cuda_runtime
    event with the kernel's correlation id) during the host-side step of the same name; then,
    and when there are none, the host-side ones (cat user_annotation, or any cat when the name
    starts with ProfilerStep). Same-name markers that overlap are one step. Step i lasts from
    its start to the next step's start; the last one to its end, or for host markers to the
    later of its end and the device's last kernel. Steps not overlapping the span are dropped.
    (This uses launch correlation, the analyser a time-overlap rule: two ways to the same
    answer.)
"""
import bisect
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = [
    "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "nccl_data.json.gz",
    "test.json.gz",
    "sampled_ranks/sampled_rank-0.json.gz",
    "sampled_ranks/sampled_rank-1.json.gz",
]
COMM = ("nccl", "rccl", "msccl", "nvshmem", "userbuffers")
MIN_GAP = 50.0
PREFIX = "ProfilerStep"


def categories(event):
    return {c.strip().lower() for c in str(event.get("cat", "")).split(",")}


def union(intervals):
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def device_of(event):
    args = event.get("args") or {}
    return int(args["device"]) if "device" in args else int(event.get("pid", 0))


def steps(markers):
    """(name, start, end) -> merged same-name overlapping steps, sorted by start."""
    by_name = {}
    for name, s, e in markers:
        by_name.setdefault(name, []).append((s, max(s, e)))
    out = []
    for name, spans in by_name.items():
        spans.sort()
        merged = []
        for s, e in spans:
            if merged and s < merged[-1][2]:
                merged[-1][2] = max(merged[-1][2], e)
            else:
                merged.append([name, s, e])
        out.extend(merged)
    out.sort(key=lambda x: (x[1], x[0]))
    return out


def iterations(step_list, host, span_start, span_end):
    out = []
    for i, (name, s, e) in enumerate(step_list):
        if i + 1 < len(step_list):
            end = step_list[i + 1][1]
        else:
            end = max(e, span_end) if (host or e <= s) else e
        if end > s and end > span_start and s < span_end:
            out.append((name, s, end))
    return out


def analyse(path):
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    launch_ts = {}
    host_markers = []
    per_device = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        cats = categories(e)
        name = str(e.get("name", ""))
        args = e.get("args") or {}
        if "cuda_runtime" in cats and "correlation" in args:
            launch_ts[args["correlation"]] = float(e["ts"])
        kind = None
        if "kernel" in cats:
            kind = "comm" if any(p in name.lower() for p in COMM) else "compute"
        elif cats & {"gpu_memcpy", "memcpy", "gpu_memset", "memset"}:
            kind = "copy"
        elif "gpu_user_annotation" in cats and name.startswith(PREFIX):
            kind = "gpu_step"
        elif ("user_annotation" in cats or name.startswith(PREFIX)) and name.startswith(PREFIX):
            host_markers.append((name, float(e["ts"]), float(e["ts"]) + float(e["dur"])))
            continue
        if kind is None:
            continue
        d = per_device.setdefault(device_of(e), {"compute": [], "comm": [], "copy": [],
                                                "gpu_step": [], "launch": []})
        s, t = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        d[kind].append((name, s, t) if kind == "gpu_step" else (s, t))
        if kind == "compute":
            d["launch"].append((args.get("correlation"), s, t))
    host_steps = steps(host_markers)
    results = []
    for device in sorted(per_device):
        d = per_device[device]
        if not d["compute"]:
            continue
        compute = union(d["compute"])
        span_start, span_end = compute[0][0], compute[-1][1]
        busy = sum(e - s for s, e in compute)
        transfers = union(d["comm"] + d["copy"])
        transfer_ends = [e for _, e in transfers]
        bubbles = []
        for (_, gap_start), (gap_end, _) in zip(compute, compute[1:]):
            if gap_end - gap_start < MIN_GAP:
                continue
            cuts = {gap_start, gap_end}
            for s, e in d["comm"] + d["copy"]:
                if e > gap_start and s < gap_end:
                    cuts.update(x for x in (s, e) if gap_start < x < gap_end)
            cuts = sorted(cuts)
            idle = comm_only = copy = 0.0
            for a, b in zip(cuts, cuts[1:]):
                mid = (a + b) / 2
                if any(s <= mid < e for s, e in d["copy"]):
                    copy += b - a
                elif any(s <= mid < e for s, e in d["comm"]):
                    comm_only += b - a
                else:
                    idle += b - a
            label = "idle" if idle >= comm_only and idle >= copy else (
                "comm-only" if comm_only >= copy else "copy")
            delay = None
            if label != "idle":
                k = bisect.bisect_right(transfer_ends, gap_end) - 1
                if k >= 0 and transfer_ends[k] > gap_start:
                    delay = gap_end - transfer_ends[k]
            bubbles.append({"duration": gap_end - gap_start, "idle": idle,
                            "comm_only": comm_only, "copy": copy, "label": label,
                            "delay": delay})
        gpu_steps = steps(d["gpu_step"])
        use_gpu = bool(gpu_steps)
        host_by_name = {name: (s, e) for name, s, e in host_steps}
        for name, g_start, g_end in gpu_steps:
            if name not in host_by_name:
                continue
            h_start, h_end = host_by_name[name]
            for correlation, s, e in d["launch"]:
                ts = launch_ts.get(correlation)
                if ts is not None and h_start <= ts <= h_end and e > g_end:
                    use_gpu = False
        if use_gpu:
            its, source = iterations(gpu_steps, False, span_start, span_end), "gpu"
        else:
            its, source = iterations(host_steps, True, span_start, span_end), "host"
        if not its:
            its, source = [("trace", span_start, span_end)], "whole-trace"
        delays = [b["delay"] for b in bubbles if b["delay"] is not None]
        results.append({
            "trace": os.path.relpath(path, HERE),
            "events": len(events),
            "rank": (trace.get("distributedInfo") or {}).get("rank", -1)
            if isinstance(trace, dict) else -1,
            "device": device,
            "compute_kernels": len(d["compute"]),
            "comm_kernels": len(d["comm"]),
            "span_us": span_end - span_start,
            "compute_busy_us": busy,
            "bubbles": len(bubbles),
            "bubble_us": sum(b["duration"] for b in bubbles),
            "idle_us": sum(b["idle"] for b in bubbles),
            "comm_only_us": sum(b["comm_only"] for b in bubbles),
            "copy_us": sum(b["copy"] for b in bubbles),
            "labelled_idle": sum(b["label"] == "idle" for b in bubbles),
            "labelled_comm_only": sum(b["label"] == "comm-only" for b in bubbles),
            "labelled_copy": sum(b["label"] == "copy" for b in bubbles),
            "start_delays": len(delays),
            "start_delay_max_us": max(delays) if delays else 0.0,
            "iteration_source": source,
            "iterations": len(its),
            "mean_iteration_us": sum(e - s for _, s, e in its) / len(its),
        })
    return results


def main():
    out = []
    for name in TRACES:
        out.extend(analyse(os.path.join(HERE, name)))
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
