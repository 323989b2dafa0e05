#!/usr/bin/env python3
"""Writes the seed corpus of the trace fuzzer (tests/fuzz/corpus/), small inputs of every shape
the importer and the analysis handle. Run from the repository root:

    python3 tests/fuzz/make_corpus.py

Seeds: the PyTorch-like test traces (minified), the ROCm trace from HolisticTraceAnalysis (MIT,
see tests/data/hta/README.md) as shared (.json.gz), PipeFill's own trace format (bubble markers,
fill slices, calibration records, memory), host markers of two processes, memory events with
and without absolute levels, the bare-array form, gzip of a small trace, and the malformed
traces of tests/data/bad/. Inputs the fuzzer found (regression_*) are kept as found; this script
leaves them alone.
"""
import gzip
import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def dump(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def kernel(name, ts, dur, pid=0, tid=7, cat="kernel", **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in ("torch_stage_baseline.json", "torch_stage_filled.json"):
        with open(os.path.join(DATA, name)) as f:
            write(name.replace(".json", ".min.json"), dump(json.load(f)))
    shutil.copy(os.path.join(DATA, "hta", "mi250_minitoy_train_ROCm6_2_kineto.json.gz"),
                os.path.join(OUT, "rocm_mi250.json.gz"))
    for name in sorted(os.listdir(os.path.join(DATA, "bad"))):
        if name.endswith(".json"):
            shutil.copy(os.path.join(DATA, "bad", name), os.path.join(OUT, "bad_" + name))

    # PipeFill's pfTraceWrite format: bubble markers and fill slices, no main-job kernels.
    events = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "PipeFill stage 1"}}]
    for i, (ts, dur, key) in enumerate([(100, 300, "fwd#0"), (900, 250, "bwd#1"), (1600, 310, "fwd#0")]):
        events.append({"name": "bubble " + key, "cat": "bubble", "ph": "X", "pid": 1, "tid": 1, "ts": ts,
                       "dur": dur, "args": {"id": i, "iteration": i // 2, "kind": "idle", "predicted_us": 280.0,
                                            "slices": 1}})
        events.append({"name": "predicted bubble us", "ph": "C", "pid": 1, "tid": 1, "ts": ts, "args": {key: 280.0}})
        events.append({"name": "resnet", "cat": "fill", "ph": "X", "pid": 1, "tid": 2, "ts": ts + 10,
                       "dur": dur - 40, "args": {"bubble": i, "items": 3, "config": 0}})
    events.append({"name": "[memory]", "ph": "i", "s": "t", "pid": 1, "tid": 1000007, "ts": 120,
                   "args": {"Device Type": 1, "Device Id": 1, "Bytes": 1048576}})
    write("pipefill_trace.json", dump({"traceEvents": events}))

    # Two processes' host step markers, kernels tied to them by correlation ids; NCCL receive
    # kernels in the gaps; copies; "[memory]" with and without "Total Allocated".
    events = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    for proc, device in ((100, 0), (200, 1)):
        for step in range(2):
            base = 1000 * step
            events.append(kernel(f"ProfilerStep#{step}", base, 950, pid=proc, tid=proc, cat="user_annotation"))
            for k in range(3):
                corr = proc * 10 + step * 3 + k
                events.append(kernel("cudaLaunchKernel", base + 10 * k, 5, pid=proc, tid=proc,
                                     cat="cuda_runtime", correlation=corr))
                events.append(kernel("sm90_gemm", base + 50 + 300 * k, 100, pid=device, device=device,
                                     stream=7, correlation=corr, grid=[8, 4, 1]))
            events.append(kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", base + 160, 180,
                                 pid=device, tid=20, device=device, stream=20))
            events.append(kernel("Memcpy DtoD (Device -> Device)", base + 700, 30, pid=device, tid=21,
                                 cat="gpu_memcpy", device=device, stream=21, bytes=4096))
            events.append({"ph": "i", "name": "[memory]", "pid": proc, "tid": proc, "ts": base + 60,
                           "args": {"Device Type": 1, "Device Id": device, "Bytes": 2048,
                                    "Total Allocated": 1 << 30}})
            events.append({"ph": "i", "name": "[memory]", "pid": proc, "tid": proc, "ts": base + 900,
                           "args": {"Device Type": 1, "Device Id": device, "Bytes": -2048}})
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "totalGlobalMem": 85899345920},
                                                      {"id": 1, "totalGlobalMem": 85899345920}],
             "distributedInfo": {"rank": 3}, "traceEvents": events}
    write("two_processes.json", dump(trace))
    write("two_processes.json.gz", gzip.compress(dump(trace), mtime=0))

    # The bare-array form, with loosely typed fields (strings for numbers, "stream 7").
    events = [kernel("a", "10", "5.5", pid="GPU 2", tid="stream 7"), kernel("b", 100, 20, pid=2, tid=7),
              kernel("c", 400, 20, pid=2, tid=7, cat="Kernel,graph"),
              kernel("Memset (Device)", 150, 10, pid=2, tid=9, cat="Memset", bytes="64")]
    write("bare_array.json", dump(events))
    # ROCm/RCCL-named and NVSHMEM/userbuffers kernels.
    events = [kernel("Cijk_Alik_Bljk_HHS", 0, 100), kernel("rcclGenericKernel", 100, 400),
              kernel("Cijk_Alik_Bljk_HHS", 500, 100), kernel("nvshmemi_transfer_kernel", 600, 200),
              kernel("kuserbuffers_pullrecv", 800, 100), kernel("Cijk_Alik_Bljk_HHS", 1000, 100)]
    write("comm_names.json", dump({"traceEvents": events}))
    # Repeated keys: the last one counts in both importers.
    write("repeated_keys.json",
          b'{"distributedInfo":{"rank":1,"rank":"x"},"traceEvents":[{"ph":"X","cat":"cpu_op","name":"a",'
          b'"args":{"bytes":5},"cat":"gpu_memcpy","pid":0,"ts":1,"dur":2},'
          b'{"ph":"X","cat":"kernel","name":"k","pid":0,"ts":5,"dur":1,"args":{"device":1},"args":{"stream":3}}],'
          b'"deviceProperties":[{"id":0,"totalGlobalMem":10}],"deviceProperties":[{"id":1,"totalGlobalMem":20}]}')


if __name__ == "__main__":
    main()
