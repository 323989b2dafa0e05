// pipeline_engine: a Megatron-style pipeline-parallel engine that marks its bubbles with
// PipeFill's bubble instructions and fills them with a fill job. Runs the same iterations with
// filling off and on (and optionally the naive baseline) and prints them side by side. Each
// run's own results are printed (and flushed) as soon as it finishes, so a run that fails or
// hangs later - the GPU check bounds this program with a timeout - cannot hide the ones before.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "engine.hpp"
#include "host_report.hpp"
#include "host_transport.hpp"
#include "peers.hpp"
#include "schedule/pytorch_csv.hpp"

using namespace engine;

namespace {

double mean_from(const std::vector<double>& v, size_t first) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = first; i < v.size(); ++i, ++n) sum += v[i];
  return n ? sum / n : 0.0;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * v.size()));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string delays(const RunResult& r) {
  return fmt::format("p50 {:.2f} us, p99 {:.2f} us, max {:.2f} us over {} bubbles",
                     percentile(r.resume_delays_us, 0.5), percentile(r.resume_delays_us, 0.99),
                     percentile(r.resume_delays_us, 1.0), r.resume_delays_us.size());
}

int fail(const Status& status) {
  std::fflush(stdout);
  std::fprintf(stderr, "pipeline_engine: error %d (%s): %s\n", static_cast<int>(status.code),
               pfGetErrorString(status.code), status.message.c_str());
  return 1;
}

// One line per run, printed the moment the run ends: its iteration times and fill totals.
void print_run(int index, int runs, const RunResult& r, size_t warm) {
  std::vector<double> ms;
  uint64_t items = 0;
  for (const IterationResult& it : r.iterations) {
    ms.push_back(it.time_us / 1e3);
    items += it.items;
  }
  std::string times;
  for (double t : ms) times += fmt::format(" {:.3f}", t);
  std::printf("run %d/%d (%s) on %s: iteration ms%s; mean from iteration %zu: %.3f ms; fill items %llu\n",
              index, runs, fill_mode_name(r.mode), r.transport.c_str(), times.c_str(), warm + 1,
              mean_from(ms, warm), static_cast<unsigned long long>(items));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  EngineOptions o;
  PipelineSpec& p = o.pipeline;
  std::string schedule = "1f1b", fill_exec = "default";
  bool naive = false, peers = false;
  int print_program = -1;

  CLI::App app{"PipeFill example pipeline engine (Megatron-style 1F1B / interleaved 1F1B)"};
  // A flag given twice takes its last value (scripts pass defaults, users append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--stages", p.stages, "Pipeline stages")->capture_default_str();
  app.add_option("--microbatches", p.microbatches, "Micro-batches per iteration")->capture_default_str();
  app.add_option("--schedule", schedule, pipefill::schedule::schedule_kind_choices())->capture_default_str();
  std::string schedule_csv;
  app.add_option("--schedule-csv", schedule_csv, "PyTorch CSV schedule (one row of actions per rank); sets --stages and --microbatches");
  app.add_option("--microbatch-group-size", p.microbatch_group_size, "Interleaved kinds: Megatron's micro-batch group (0: PyTorch's rounds)");
  auto* chunks = app.add_option("--chunks", p.chunks, "Model chunks per stage (interleaved; default 2)");
  app.add_option("--iterations", o.iterations, "Training iterations")->capture_default_str();
  app.add_option("--transport", o.transport, "sim | emulated | nccl | host | auto")->capture_default_str();
  app.add_option("--fill", o.fill, "none | mlp | encoder | train")->capture_default_str();
  app.add_option("--fill-exec", fill_exec, "ticket | opaque | default (the job kind's)")->capture_default_str();
  app.add_option("--fill-items", o.fill_items, "Items of each stage's fill job (0: kind default)")->capture_default_str();
  app.add_option("--fill-item-us", o.fill_item_cost_us, "Cost of one fill item in us (0: the kind's; host: each item takes this long on an SM thread)")->capture_default_str();
  double host_min_factor = 10.0;
  std::string host_timeline_csv;
  app.add_option("--host-timeline", host_timeline_csv, "Host: write every bubble's moments (begin, launch, slice start, items, end) of the filled run as CSV");
  app.add_option("--host-min-factor", host_min_factor, "Host: the per-stage table counts bubble classes at least this many item costs long")->capture_default_str();
  app.add_option("--keep-every", o.keep_every, "Sim: compute and keep every Nth inference output on the CPU")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed (simulation jitter, fill-job data)")->capture_default_str();
  app.add_option("--hidden", p.model.hidden, "Hidden size")->capture_default_str();
  app.add_option("--seq", p.model.seq, "Sequence length")->capture_default_str();
  app.add_option("--micro-batch", p.model.micro_batch, "Micro-batch size")->capture_default_str();
  app.add_option("--layers-per-stage", p.model.layers_per_stage, "Transformer layers per stage")->capture_default_str();
  app.add_option("--tflops", p.model.tflops, "Achieved TFLOP/s of the main job per GPU")->capture_default_str();
  app.add_option("--p2p-latency-us", p.model.p2p_latency_us, "Point-to-point latency")->capture_default_str();
  app.add_option("--p2p-gbps", p.model.p2p_gbps, "Point-to-point bandwidth, GB/s")->capture_default_str();
  app.add_option("--allreduce-us", p.model.allreduce_us, "Data-parallel all-reduce time")->capture_default_str();
  app.add_option("--sms", p.sm_count, "SMs per (simulated) GPU")->capture_default_str();
  app.add_option("--comm-sms", p.comm_sms, "SMs a communication kernel holds (reserved from fill)")->capture_default_str();
  app.add_option("--min-bubble-us", p.min_bubble_us, "Shortest idle gap marked as a bubble")->capture_default_str();
  app.add_option("--jitter", o.jitter, "Sim: relative std-dev of kernel durations")->capture_default_str();
  app.add_option("--notice-lead", o.notice_lead_us,
                 "Sim, pipefill mode: the sending stage notices the receiver this many us before "
                 "its send and the receiver closes that bubble's fill (pfBubbleCloseFill); < 0 off")
      ->capture_default_str();
  app.add_option("--interference", o.interference, "Sim: beta, main-kernel slowdown per unit of fill memory load (docs/simulated-device.md)")->capture_default_str();
  app.add_option("--fill-slowdown", o.fill_slowdown, "Sim: beta_f, fill-item slowdown per unit of main load")->capture_default_str();
  app.add_option("--comm-slowdown", o.comm_slowdown, "Sim: gamma, p2p transfer slowdown per unit of fill load")->capture_default_str();
  app.add_option("--margin-us", o.margin_us, "Runtime safety margin before each bubble end (< 0: the receive's p2p time, at least 20 us)")->capture_default_str();
  app.add_flag("--hint-durations", o.hint_durations, "Pass the schedule's expected bubble durations as hints (fills from iteration 1)");
  app.add_flag("--naive", naive, "Also run the naive baseline (ungated fill at the main job's priority, no SM reservation)");
  app.add_flag("--peers", peers, "Sim: then run every fill mode side by side (no fill, PipeFill, naive, FreeRide-, Tally-, PipeFill-paper-style) and print their table");
  app.add_option("--trace", o.trace_prefix, "Write Chrome traces <prefix>.stage<N>.json of the filled run");
  app.add_option("--print-program", print_program, "Print this stage's instruction list and exit");
  CLI11_PARSE(app, argc, argv);

  if (!schedule_csv.empty()) {  // issue 12 (sched): a PyTorch CSV op order
    auto custom = std::make_shared<pipefill::schedule::CustomSchedule>();
    std::string csv_error;
    if (!pipefill::schedule::load_pytorch_csv(schedule_csv, custom.get(), &csv_error))
      return fail(Status{pfErrorInvalidArgument, "--schedule-csv: " + csv_error});
    p.kind = pipefill::schedule::ScheduleKind::Custom;
    p.stages = custom->stages;
    p.microbatches = custom->microbatches;
    p.chunks = custom->chunks;
    p.custom = std::move(custom);
  } else if (!pipefill::schedule::parse_schedule_kind(schedule, &p.kind)) {
    return fail(Status{pfErrorInvalidArgument, fmt::format("--schedule must be {}, got '{}'",
                                                           pipefill::schedule::schedule_kind_choices(), schedule)});
  }
  if (p.kind != pipefill::schedule::ScheduleKind::Custom && chunks->count() == 0 &&
      pipefill::schedule::chunks_for(p.kind, 2) == 2)
    p.chunks = 2;  // the multi-chunk kinds default to 2 chunks per stage
  if (fill_exec == "ticket") o.fill_execution = fjExecTicket;
  else if (fill_exec == "opaque") o.fill_execution = fjExecOpaque;
  else if (fill_exec != "default")
    return fail(Status{pfErrorInvalidArgument,
                       fmt::format("--fill-exec must be ticket, opaque or default, got '{}'", fill_exec)});
  if (o.iterations < 1)
    return fail(Status{pfErrorInvalidArgument, fmt::format("--iterations must be >= 1, got {}", o.iterations)});
  if (parse_fill_kind(o.fill) == -2)
    return fail(Status{pfErrorInvalidArgument,
                       fmt::format("--fill must be none, mlp, encoder or train, got '{}'", o.fill)});

  if (print_program >= 0) {
    Programs programs;
    std::string error;
    if (!build_programs(p, &programs, &error)) return fail(Status{pfErrorInvalidArgument, error});
    if (print_program >= p.stages)
      return fail(Status{pfErrorInvalidArgument,
                         fmt::format("--print-program {} is not a stage (0..{})", print_program, p.stages - 1)});
    for (const Instruction& in : programs.stages[static_cast<size_t>(print_program)])
      std::printf("%s\n", to_string(in).c_str());
    return 0;
  }

  const StageCosts costs = derive_costs(p);
  RunResult base, filled, naive_run;
  const bool fill_on = o.fill != "none";
  const int runs = fill_on ? (naive ? 3 : 2) : 1;
  // The predictor needs min_samples iterations of history before it fills (unless hinted).
  const size_t warm = o.hint_durations ? 0 : std::min<size_t>(2, static_cast<size_t>(o.iterations) - 1);
  o.warm_iterations = static_cast<int>(warm);  // per-stage statistics count from there
  std::printf("pipeline_engine: %d stages, %s, %d micro-batches, %d iterations, fill %s, transport %s: "
              "%d run(s): no fill%s%s\n",
              p.stages, schedule.c_str(), p.microbatches, o.iterations, o.fill.c_str(), o.transport.c_str(),
              runs, fill_on ? ", PipeFill" : "", fill_on && naive ? ", naive" : "");
  std::fflush(stdout);
  Status status = run_engine(o, FillMode::None, &base);
  if (!status.ok()) return fail(status);
  print_run(1, runs, base, warm);
  // On the host transport the filled run keeps its transport: its timeline breaks the bubbles down.
  std::unique_ptr<HostTransportBase> host_transport;
  if (fill_on) {
    if (o.transport == "host") {
      host_transport = make_host_transport_concrete();
      status = run_engine_on(*host_transport, o, FillMode::PipeFill, &filled);
    } else {
      status = run_engine(o, FillMode::PipeFill, &filled);
    }
    if (!status.ok()) return fail(status);
    print_run(2, runs, filled, warm);
  }
  // A failing naive baseline does not hide the filled run's table; the exit code reports it.
  Status naive_status;
  if (fill_on && naive) {
    naive_status = run_engine(o, FillMode::Naive, &naive_run);
    if (naive_status.ok()) {
      print_run(3, runs, naive_run, warm);
    } else {
      std::printf("run 3/3 (naive) failed: %s\n", naive_status.message.c_str());
      std::fflush(stdout);
      naive = false;
    }
  }

  std::printf("PipeFill pipeline engine: %d stages, %s%s, %d micro-batches, transport %s\n",
              p.stages, schedule.c_str(),
              p.chunks > 1 ? fmt::format(" (v={})", p.chunks).c_str() : "", p.microbatches,
              base.transport.c_str());
  std::printf("model: hidden %d, seq %d, micro-batch %d, %d layers/stage: forward %.1f us, "
              "backward %.1f us per layer; p2p %.1f us\n",
              p.model.hidden, p.model.seq, p.model.micro_batch, p.model.layers_per_stage,
              costs.forward_layer_us, costs.backward_layer_us, costs.p2p_us);
  const double margin = engine_margin_us(o, costs);
  std::printf("fill: %s%s; safety margin %s before each bubble end%s\n", o.fill.c_str(),
              fill_on ? "" : " (bubbles measured, nothing filled)",
              margin >= 0 ? fmt::format("{:.1f} us", margin).c_str() : "the runtime's default",
              o.margin_us >= 0 ? ""
              : margin < 0 ? " (on the host a receive is a wait fill does not slow; PIPEFILL_SAFETY_MARGIN_US sets it)"
                           : " (the receive's p2p time: fill stops before the peer sends)");
  if (base.transport == "sim")
    std::printf("simulated interference: beta %.2f, beta_f %.2f, gamma %.2f%s\n\n", o.interference,
                o.fill_slowdown, o.comm_slowdown,
                o.interference == 0.6 && o.fill_slowdown == 0.6 && o.comm_slowdown == 0.5
                    ? " (calibrated from arXiv 2604.22430, NVIDIA/nccl#1428 and #1433; "
                      "docs/simulated-device.md)"
                    : "");
  else
    std::printf("\n");
  std::printf("%4s | %12s | %12s | %9s | %7s | %7s | %14s%s\n", "iter", "no-fill ms",
              "PipeFill ms", "slowdown", "bubble", "filled", "fill items/s",
              naive ? " | naive ms | naive slowdown" : "");
  std::vector<double> slowdowns, filled_shares, bubble_shares, rates, naive_slowdowns;
  for (size_t i = 0; i < base.iterations.size(); ++i) {
    const IterationResult& b = base.iterations[i];
    const IterationResult& f = fill_on ? filled.iterations[i] : b;
    const double slowdown = f.time_us / b.time_us - 1.0;
    const double bubble_share = b.bubble_us / (p.stages * b.time_us);
    const double filled_share = f.bubble_us > 0 ? f.filled_us / f.bubble_us : 0.0;
    const double rate = f.items / (f.time_us * 1e-6);
    slowdowns.push_back(slowdown);
    bubble_shares.push_back(bubble_share);
    filled_shares.push_back(filled_share);
    rates.push_back(rate);
    std::string naive_cols;
    if (naive) {
      const IterationResult& n = naive_run.iterations[i];
      naive_slowdowns.push_back(n.time_us / b.time_us - 1.0);
      naive_cols = fmt::format(" | {:8.3f} | {:+13.2f}%", n.time_us / 1e3,
                               100.0 * naive_slowdowns.back());
    }
    std::printf("%4zu | %12.3f | %12.3f | %+8.2f%% | %6.1f%% | %6.1f%% | %14.0f%s\n", i + 1,
                b.time_us / 1e3, f.time_us / 1e3, 100.0 * slowdown, 100.0 * bubble_share,
                100.0 * filled_share, rate, naive_cols.c_str());
  }
  std::printf("mean from iteration %zu: slowdown %+.3f%%, bubble %.1f%%, filled %.1f%% of bubble "
              "time, %.0f fill items/s%s\n",
              warm + 1, 100.0 * mean_from(slowdowns, warm), 100.0 * mean_from(bubble_shares, warm),
              100.0 * mean_from(filled_shares, warm), mean_from(rates, warm),
              naive ? fmt::format("; naive slowdown {:+.2f}%", 100.0 * mean_from(naive_slowdowns, warm)).c_str() : "");
  if (fill_on) {
    std::printf("max overrun past a bubble end: %.1f us; host cost of BubbleBegin+End: %.0f ns\n",
                filled.max_overrun_us, filled.host_begin_end_ns);
    // Kernel end - its nominal duration - bubble end: the kernel's start without interference;
    // with it, also the time the kernel was slowed by fill beside it (what the main job waits).
    if (!filled.resume_delays_us.empty() && o.jitter == 0.0) {
      const char* what = o.interference == 0.0 ? "next main kernel start"
                                               : "next main kernel end - its nominal duration";
      std::printf("bubble end -> %s, no fill: %s\n", what, delays(base).c_str());
      std::printf("bubble end -> %s, PipeFill: %s\n", what, delays(filled).c_str());
      if (naive)
        std::printf("bubble end -> %s, naive: %s\n", what, delays(naive_run).c_str());
    }
    uint64_t runtime_items = 0, job_items = 0, duplicates = 0, out_of_order = 0;
    for (const StageFillSummary& s : filled.stages) {
      runtime_items += s.items_completed;
      job_items += s.progress.items_done;
      duplicates += s.progress.duplicate_items;
      out_of_order += s.progress.out_of_order;
    }
    std::printf("fill check: %llu items completed (runtime), %llu computed (job), %llu "
                "duplicates, %llu out of order\n",
                static_cast<unsigned long long>(runtime_items),
                static_cast<unsigned long long>(job_items),
                static_cast<unsigned long long>(duplicates),
                static_cast<unsigned long long>(out_of_order));
    // A job that completed left its stage's later bubbles with nothing to fill: the filled
    // column then measures the job's size, not the fill. Said, not left to be guessed.
    for (size_t s = 0; s < filled.stages.size(); ++s)
      if (filled.stages[s].job_status == pfJobCompleted)
        std::printf("stage %zu's fill job completed all its %llu items during the run: its later "
                    "bubbles had nothing to fill (--fill-items sets the count)\n",
                    s, static_cast<unsigned long long>(filled.stages[s].items_completed));
    if (o.fill == "train") {
      for (size_t s = 0; s < filled.stages.size(); ++s)
        std::printf("stage %zu training job: held-out loss %.5f -> %.5f after %llu steps\n", s,
                    filled.stages[s].eval_loss_before, filled.stages[s].eval_loss_after,
                    static_cast<unsigned long long>(filled.stages[s].items_completed));
    }
    if ((filled.transport == "sim" || filled.transport == "host") &&
        (duplicates != 0 || out_of_order != 0 || job_items != runtime_items))
      return fail(Status{pfErrorInternal, "fill-job accounting mismatch (see the fill check line)"});
    if (host_transport) {
      // The job alone on one host device, then every stage's bubbles against it.
      AloneRate alone, alone_single;
      const double item_us = filled.item_cost_us;
      const uint64_t alone_items = host_alone_items(item_us);
      status = measure_alone(o, alone_items, p.stages, &alone);
      if (status.ok()) status = measure_alone(o, alone_items, 1, &alone_single);
      if (!status.ok()) return fail(status);
      const auto rows = host_stage_rows(filled, *host_transport->timeline(), static_cast<int>(warm),
                                        item_us, host_min_factor, alone, alone_single);
      std::printf("\n%s", format_host_stage_table(rows, item_us, host_min_factor, alone, alone_single).c_str());
      if (!host_timeline_csv.empty()) {
        std::FILE* f = std::fopen(host_timeline_csv.c_str(), "w");
        if (f == nullptr)
          return fail(Status{pfErrorInvalidArgument, "--host-timeline: cannot write " + host_timeline_csv});
        const std::string text = host_transport->timeline()->csv();
        std::fwrite(text.data(), 1, text.size(), f);
        std::fclose(f);
      }
    }
  }
  if (!naive_status.ok()) return fail(naive_status);
  if (peers) {
    if (!fill_on)
      return fail(Status{pfErrorInvalidArgument, "--peers needs a fill job (--fill mlp, encoder or train)"});
    if (base.transport != "sim")
      return fail(Status{pfErrorNotSupported,
                         fmt::format("--peers runs on the sim transport only, this run used {}", base.transport)});
    EngineOptions po = o;
    po.transport = "sim";
    po.warm_iterations = static_cast<int>(warm);
    std::vector<PeerRow> rows;
    const Status s = compare_fill_modes(
        po, {FillMode::PipeFill, FillMode::Naive, FillMode::FreeRide, FillMode::Tally, FillMode::PaperStyle},
        &rows);
    if (!s.ok()) return fail(s);
    std::printf("\nfill modes side by side (same pipeline, fill job, seed and interference):\n%s",
                format_peer_table(po, rows, "").c_str());
  }
  return 0;
}
