#!/usr/bin/env python3
"""Writes the small PyTorch-profiler-like traces the analysis tests read (run from this folder).

They mimic torch.profiler's Chrome export (Kineto): GPU events with pid = device and tid =
stream, args "device"/"stream"/"correlation"/"grid"; host events (cuda_runtime, cpu_op,
user_annotation ProfilerStep#N) on the process pid; "[memory]" instant events; metadata and flow
events. One pipeline stage, two iterations; the expected answers are worked out in
tests/analysis/chrome_trace_test.cpp and analyzer_files_test.cpp.
"""
import json

PID_HOST = 4242
GPU, COMPUTE, NCCL, FILL, OTHER_JOB = 0, 7, 20, 30, 31
NCCL_NAME = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
MiB = 1 << 20


def kernel(name, ts, dur, stream=COMPUTE, corr=0, grid=(108, 1, 1)):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": GPU, "tid": stream, "ts": ts,
            "dur": dur, "args": {"External id": corr, "device": GPU, "context": 1,
                                 "stream": stream, "correlation": corr,
                                 "registers per thread": 128, "shared memory": 0,
                                 "grid": list(grid), "block": [256, 1, 1],
                                 "est. achieved occupancy %": 25}}


def memory(ts, delta, total, device_type=1, device_id=GPU):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": PID_HOST, "tid": PID_HOST, "ts": ts,
            "args": {"Total Reserved": 64 * MiB, "Total Allocated": total, "Bytes": delta,
                     "Addr": 139872000000000 + ts, "Device Type": device_type,
                     "Device Id": device_id}}


def host_noise(ts, corr):
    # What a real trace has around every kernel: an op and its launch, plus a flow arrow.
    return [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID_HOST, "tid": PID_HOST,
         "ts": ts - 30, "dur": 12, "args": {"External id": corr}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": PID_HOST,
         "tid": PID_HOST, "ts": ts - 25, "dur": 5, "args": {"correlation": corr}},
        {"ph": "s", "id": corr, "pid": PID_HOST, "tid": PID_HOST, "ts": ts - 25,
         "cat": "ac2g", "name": "ac2g"},
    ]


def stage_trace(filled):
    # (name, start, duration); baseline answers: bubbles [1100,1405) comm-only, [1600,1800)
    # idle, [1950,2010) idle, [2110,2460) comm-only, [2660,2900) copy.
    second_fwd = (1410, 100) if filled else (1405, 95)
    bwd_start = 1510 if filled else 1500
    compute = [("gemm_fwd", 1000, 100), ("gemm_fwd", *second_fwd), ("gemm_bwd", bwd_start, 100),
               ("gemm_bwd", 1800, 150),
               ("gemm_fwd", 2010, 100), ("gemm_fwd", 2460, 100), ("gemm_bwd", 2560, 100),
               ("gemm_bwd", 2900, 100)]
    events = [
        {"ph": "M", "name": "process_name", "pid": GPU, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "pid": GPU, "tid": COMPUTE,
         "args": {"name": "stream 7"}},
        # Host steps start before the GPU work (the CPU runs ahead).
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": PID_HOST,
         "tid": PID_HOST, "ts": 950, "dur": 900, "args": {"External id": 1}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": PID_HOST,
         "tid": PID_HOST, "ts": 1850, "dur": 900, "args": {"External id": 2}},
        # GPU-side steps, no "device" arg: the device comes from pid.
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": GPU,
         "tid": COMPUTE, "ts": 1000, "dur": 1000, "args": {"External id": 1}},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#2", "pid": GPU,
         "tid": COMPUTE, "ts": 2000, "dur": 1000, "args": {"External id": 2}},
    ]
    corr = 100
    for name, ts, dur in compute:
        events += host_noise(ts, corr)
        events.append(kernel(name, ts, dur, corr=corr, grid=(4, 2, 1) if corr == 100 else (108, 1, 1)))
        corr += 1
    events.append(kernel(NCCL_NAME, 1090, 310, stream=NCCL, corr=200, grid=(2, 1, 1)))
    events.append(kernel(NCCL_NAME, 2100, 350, stream=NCCL, corr=201, grid=(2, 1, 1)))
    events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)",
                   "pid": GPU, "tid": COMPUTE, "ts": 2700, "dur": 20,
                   "args": {"device": GPU, "context": 1, "stream": COMPUTE, "correlation": 300,
                            "bytes": MiB, "memory bandwidth (GB/s)": 52.4}})
    events += [memory(1000, MiB, 10 * MiB), memory(1200, 2 * MiB, 12 * MiB),
               memory(1300, -2 * MiB, 10 * MiB), memory(2200, 4 * MiB, 14 * MiB),
               memory(2700, -4 * MiB, 10 * MiB),
               memory(1250, 64, 64, device_type=0, device_id=-1)]  # a host allocation
    if filled:
        events.append(kernel("void pipefill::ticket_kernel<InferenceItem>(pfSliceArgs)", 1110, 280,
                             stream=FILL, corr=400))
        events.append(kernel("inference_gemm", 1620, 170, stream=OTHER_JOB, corr=401))
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200",
                                                      "totalGlobalMem": 150754820096}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
            "traceEvents": events, "traceName": "stage0.pt.trace.json",
            "displayTimeUnit": "ms", "baseTimeNanoseconds": 1700000000000000000}


for filled, path in ((False, "torch_stage_baseline.json"), (True, "torch_stage_filled.json")):
    with open(path, "w") as f:
        json.dump(stage_trace(filled), f, indent=1)
        f.write("\n")
