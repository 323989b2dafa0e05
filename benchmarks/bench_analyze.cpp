// pipefill-analyze's trace import: the streaming importer (pipefill_trace_io: simdjson
// On-Demand per event, zlib for .json.gz) against the DOM importer it replaces (nlohmann-json on
// the whole text, what pipefill-analyze used before), side by side in one run, on a large trace
// built from a real one: the events of a HolisticTraceAnalysis Kineto trace (default
// tests/data/hta/test.json.gz), replicated with shifted timestamps up to --target-mb of JSON.
//
// Each measurement runs in a child process (this binary, re-executed) that reads and analyses
// the trace as pipefill-analyze does (every device, default options) on one thread; the parent
// takes the child's peak resident memory (ru_maxrss) and CPU time from wait4(). Printed per row:
// read and analysis time, throughput in MB/s of JSON (wall and CPU), peak memory and its ratio
// to the JSON size; then the streaming/DOM ratios and whether issue 12's targets are met
// (>= 100 MB/s of JSON on one core, peak <= 0.5x the JSON size). Medians over --repetitions
// (DOM: --dom-repetitions). The generated files are deleted at the end (--keep keeps them).
//
//   bench_analyze [--target-mb 500] [--source trace.json.gz] [--dir /tmp] [--repetitions 3]
//                 [--dom-repetitions 1] [--no-dom] [--no-gzip] [--keep] [--json out.json]
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analysis/bubbles.hpp"
#include "analysis/chrome_trace.hpp"
#include "analysis/io/byte_source.hpp"
#include "analysis/io/trace_reader.hpp"
#include "analysis/report.hpp"
#include "common/error.hpp"

namespace {

using namespace pipefill;
using namespace pipefill::analysis;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "bench_analyze: %s\n", message.c_str());
  std::exit(1);
}

// ---- child: one measured run ------------------------------------------------------------------

// Reads and analyses `path` like pipefill-analyze; prints one JSON line on stdout.
int child(const std::string& importer, const std::string& path) {
  const AnalysisOptions options;
  size_t records = 0, bubbles = 0, devices = 0;
  const auto t0 = Clock::now();
  double read_s = 0.0;
  if (importer == "streaming") {
    CompactTrace trace;
    if (io::read_trace_file(path, ImportOptions{}, &trace) != pfSuccess) die(last_error_message());
    read_s = seconds_since(t0);
    TraceReport report;
    if (build_report(trace, nullptr, {}, options, &report) != pfSuccess) die(last_error_message());
    records = trace.records.size();
    devices = report.devices.size();
    for (const DeviceAnalysis& d : report.devices) bubbles += d.bubbles.size();
  } else if (importer == "dom") {
    ImportedTrace trace;
    if (import_chrome_trace_file(path, ImportOptions{}, &trace) != pfSuccess) {
      die(last_error_message());
    }
    read_s = seconds_since(t0);
    TraceReport report;
    if (build_report(path, trace.records, "", nullptr, analysable_devices(trace.records), options,
                     &report, trace.device_memory_bytes) != pfSuccess) {
      die(last_error_message());
    }
    records = trace.records.size();
    devices = report.devices.size();
    for (const DeviceAnalysis& d : report.devices) bubbles += d.bubbles.size();
  } else {
    die("unknown importer " + importer);
  }
  const double total_s = seconds_since(t0);
  std::printf("%s\n", json{{"read_s", read_s},
                           {"analyse_s", total_s - read_s},
                           {"total_s", total_s},
                           {"records", records},
                           {"devices", devices},
                           {"bubbles", bubbles}}
                          .dump()
                          .c_str());
  return 0;
}

struct Run {
  double read_s = 0, analyse_s = 0, total_s = 0, cpu_s = 0;
  uint64_t peak_bytes = 0;
  size_t records = 0, devices = 0, bubbles = 0;
};

Run run_child(const std::string& importer, const std::string& path) {
  int fds[2];
  if (::pipe(fds) != 0) die("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) die("fork failed");
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    const char* args[] = {"bench_analyze", "--child", importer.c_str(), path.c_str(), nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(args));
    std::_Exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  rusage usage{};
  if (::wait4(pid, &status, 0, &usage) != pid) die("wait4 failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    die(fmt::format("the {} run on {} failed (status {})", importer, path, status));
  }
  const json j = json::parse(out);
  Run r;
  r.read_s = j["read_s"];
  r.analyse_s = j["analyse_s"];
  r.total_s = j["total_s"];
  r.records = j["records"];
  r.devices = j["devices"];
  r.bubbles = j["bubbles"];
  r.cpu_s = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
            usage.ru_stime.tv_usec * 1e-6;
  r.peak_bytes = static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

Run median_of(const std::vector<Run>& runs) {
  auto pick = [&](auto field) {
    std::vector<double> v;
    for (const Run& r : runs) v.push_back(static_cast<double>(r.*field));
    return median(v);
  };
  Run m = runs.front();
  m.read_s = pick(&Run::read_s);
  m.analyse_s = pick(&Run::analyse_s);
  m.total_s = pick(&Run::total_s);
  m.cpu_s = pick(&Run::cpu_s);
  m.peak_bytes = static_cast<uint64_t>(pick(&Run::peak_bytes));
  return m;
}

// ---- the large trace ----------------------------------------------------------------------------

std::string read_source(const std::string& path) {
  std::unique_ptr<io::ByteSource> source;
  if (io::open_trace_source(path, &source) != pfSuccess) die(last_error_message());
  std::string text;
  std::vector<char> buffer(1 << 20);
  while (true) {
    size_t got = 0;
    if (source->read(buffer.data(), buffer.size(), &got) != pfSuccess) die(last_error_message());
    if (got == 0) break;
    text.append(buffer.data(), got);
  }
  return text;
}

struct Generated {
  uint64_t bytes = 0;
  size_t events = 0;
  int replicas = 0;
  size_t source_events = 0;
};

// The source's events again and again, each copy shifted in time past the previous one, until
// the file holds `target_bytes` of JSON. Each event is serialised once, around its "ts".
Generated write_large_trace(const std::string& source_path, const std::string& out_path,
                            uint64_t target_bytes) {
  const json root = json::parse(read_source(source_path));
  const json& events = root.is_array() ? root : root.at("traceEvents");
  struct Template {
    std::string before, after;
    double ts;
    bool timed;
  };
  std::vector<Template> templates;
  double first = std::numeric_limits<double>::infinity(), last = -first;
  const std::string placeholder = "\"@@PIPEFILL_TS@@\"";
  for (const json& e : events) {
    Template t{};
    if (e.is_object() && e.contains("ts") && e["ts"].is_number()) {
      t.ts = e["ts"].get<double>();
      t.timed = true;
      first = std::min(first, t.ts);
      last = std::max(last, t.ts + (e.contains("dur") && e["dur"].is_number() ? e["dur"].get<double>() : 0.0));
      json copy = e;
      copy["ts"] = "@@PIPEFILL_TS@@";
      const std::string text = copy.dump();
      const size_t at = text.find(placeholder);
      t.before = text.substr(0, at);
      t.after = text.substr(at + placeholder.size());
    } else {
      t.before = e.dump();
    }
    templates.push_back(std::move(t));
  }
  const double shift = (last - first) + 1000.0;
  std::ofstream out(out_path, std::ios::binary);
  if (!out) die("cannot write " + out_path);
  std::string head = "{";
  if (root.is_object()) {
    for (const auto& [key, value] : root.items()) {
      if (key != "traceEvents") head += json(key).dump() + ":" + value.dump() + ",";
    }
  }
  head += "\"traceEvents\":[\n";
  out << head;
  Generated g;
  g.bytes = head.size();
  g.source_events = templates.size();
  std::string chunk;
  bool comma = false;
  while (g.bytes < target_bytes) {
    const double offset = shift * g.replicas;
    chunk.clear();
    for (const Template& t : templates) {
      if (comma) chunk += ",\n";
      comma = true;
      chunk += t.before;
      if (t.timed) {
        chunk += fmt::format("{:.3f}", t.ts + offset);
        chunk += t.after;
      }
    }
    out << chunk;
    g.bytes += chunk.size();
    g.events += templates.size();
    ++g.replicas;
  }
  out << "\n]}\n";
  g.bytes += 4;
  if (!out.good()) die("cannot write " + out_path);
  return g;
}

uint64_t gzip_file(const std::string& in_path, const std::string& out_path) {
  std::ifstream in(in_path, std::ios::binary);
  gzFile out = gzopen(out_path.c_str(), "wb6");
  if (!in || out == nullptr) die("cannot gzip " + in_path);
  gzbuffer(out, 1 << 20);
  std::vector<char> buffer(1 << 22);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = in.gcount();
    if (n > 0 && gzwrite(out, buffer.data(), static_cast<unsigned>(n)) != n) die("gzwrite failed");
  }
  if (gzclose(out) != Z_OK) die("gzclose failed");
  return std::filesystem::file_size(out_path);
}

void warm_page_cache(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(1 << 22);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--child") return child(argv[2], argv[3]);

  double target_mb = 500.0;
  std::string source = std::string(PIPEFILL_SOURCE_DIR) + "/tests/data/hta/test.json.gz";
  std::string dir = std::filesystem::temp_directory_path().string();
  int repetitions = 3, dom_repetitions = 1;
  bool with_dom = true, with_gzip = true, keep = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--target-mb") target_mb = std::stod(value());
    else if (a == "--source") source = value();
    else if (a == "--dir") dir = value();
    else if (a == "--repetitions") repetitions = std::max(1, std::stoi(value()));
    else if (a == "--dom-repetitions") dom_repetitions = std::max(1, std::stoi(value()));
    else if (a == "--no-dom") with_dom = false;
    else if (a == "--no-gzip") with_gzip = false;
    else if (a == "--keep") keep = true;
    else if (a == "--json") json_path = value();
    else die("unknown argument " + a + " (see the header of benchmarks/bench_analyze.cpp)");
  }
  if (!(target_mb > 0.0 && target_mb < 1e6)) die("--target-mb must be in (0, 1e6)");

  std::string work = dir + "/pipefill_bench_analyze_XXXXXX";
  if (::mkdtemp(work.data()) == nullptr) die("cannot create a folder in " + dir);
  const std::string big = work + "/trace.json";
  const std::string big_gz = big + ".gz";
  std::printf("Building a %.0f MB trace from the events of %s ...\n", target_mb, source.c_str());
  std::fflush(stdout);
  // In a child of its own: the source's DOM would otherwise stay in this process's resident
  // set, which every measured child inherits at fork (ru_maxrss counts it).
  Generated g;
  uint64_t gz_bytes = 0;
  {
    int fds[2];
    if (::pipe(fds) != 0) die("pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
      ::close(fds[0]);
      const auto tg = Clock::now();
      const Generated made = write_large_trace(source, big, static_cast<uint64_t>(target_mb * 1e6));
      std::printf("  %s: %.1f MB of JSON, %zu events (%d copies of %zu), written in %.1f s\n",
                  big.c_str(), made.bytes / 1e6, made.events, made.replicas, made.source_events,
                  seconds_since(tg));
      uint64_t zipped = 0;
      if (with_gzip) {
        const auto tz = Clock::now();
        zipped = gzip_file(big, big_gz);
        std::printf("  %s: %.1f MB (gzip -6), written in %.1f s\n", big_gz.c_str(), zipped / 1e6,
                    seconds_since(tz));
      }
      std::fflush(stdout);
      const std::string report = json{{"bytes", made.bytes}, {"events", made.events},
                                      {"replicas", made.replicas}, {"gz_bytes", zipped}}
                                     .dump();
      if (::write(fds[1], report.data(), report.size()) != static_cast<ssize_t>(report.size())) {
        std::_Exit(1);
      }
      std::_Exit(0);
    }
    ::close(fds[1]);
    std::string text;
    char buffer[512];
    ssize_t n;
    while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) text.append(buffer, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      die("building the trace failed");
    }
    const json made = json::parse(text);
    g.bytes = made["bytes"];
    g.events = made["events"];
    g.replicas = made["replicas"];
    gz_bytes = made["gz_bytes"];
  }
  rusage self{};
  ::getrusage(RUSAGE_SELF, &self);
  const double parent_mb = self.ru_maxrss * 1024 / 1e6;
  double load[3] = {0, 0, 0};
  ::getloadavg(load, 3);

  struct Row {
    std::string input, importer;
    uint64_t file_bytes;
    Run run;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::string& input, const std::string& path, uint64_t file_bytes,
                     const std::string& importer, int reps) {
    warm_page_cache(path);
    std::vector<Run> runs;
    for (int r = 0; r < reps; ++r) runs.push_back(run_child(importer, path));
    rows.push_back({input, importer, file_bytes, median_of(runs)});
    const Run& m = rows.back().run;
    std::fprintf(stderr, "  measured %s / %s: %.2f s, peak %.0f MB\n", input.c_str(),
                 importer.c_str(), m.total_s, m.peak_bytes / 1e6);
  };
  if (with_dom) measure("trace.json", big, g.bytes, "dom", dom_repetitions);
  measure("trace.json", big, g.bytes, "streaming", repetitions);
  if (with_gzip) measure("trace.json.gz", big_gz, gz_bytes, "streaming", repetitions);

  const double json_mb = g.bytes / 1e6;
  std::printf("\nEach run: a child process (single-threaded) reading and analysing the trace, "
              "forked from a parent of %.0f MB resident (counted in its peak); load average %.1f "
              "when the runs started, so throughput is judged on CPU time (user + sys).\n",
              parent_mb, load[0]);
  std::printf("\n%-14s %-10s %9s %9s %8s %9s %8s %11s %10s %9s %10s %9s %8s\n", "input", "importer",
              "json_MB", "file_MB", "read_s", "analyse_s", "total_s", "MB/s(wall)", "MB/s(cpu)",
              "peak_MB", "peak/json", "records", "bubbles");
  json out_rows = json::array();
  for (const Row& row : rows) {
    const Run& r = row.run;
    std::printf("%-14s %-10s %9.1f %9.1f %8.2f %9.2f %8.2f %11.1f %10.1f %9.1f %10.3f %9zu %8zu\n",
                row.input.c_str(), row.importer.c_str(), json_mb, row.file_bytes / 1e6, r.read_s,
                r.analyse_s, r.total_s, json_mb / r.total_s, json_mb / r.cpu_s, r.peak_bytes / 1e6,
                static_cast<double>(r.peak_bytes) / g.bytes, r.records, r.bubbles);
    out_rows.push_back({{"input", row.input}, {"importer", row.importer}, {"json_bytes", g.bytes},
                        {"file_bytes", row.file_bytes}, {"read_s", r.read_s},
                        {"analyse_s", r.analyse_s}, {"total_s", r.total_s}, {"cpu_s", r.cpu_s},
                        {"mb_per_s_wall", json_mb / r.total_s}, {"mb_per_s_cpu", json_mb / r.cpu_s},
                        {"peak_bytes", r.peak_bytes},
                        {"peak_over_json", static_cast<double>(r.peak_bytes) / g.bytes},
                        {"records", r.records}, {"devices", r.devices}, {"bubbles", r.bubbles}});
  }
  const auto find = [&](const std::string& input, const std::string& importer) -> const Row* {
    for (const Row& r : rows) {
      if (r.input == input && r.importer == importer) return &r;
    }
    return nullptr;
  };
  const Row* dom = find("trace.json", "dom");
  const Row* stream = find("trace.json", "streaming");
  std::printf("\n");
  if (dom != nullptr) {
    if (dom->run.records != stream->run.records || dom->run.bubbles != stream->run.bubbles) {
      die(fmt::format("the importers disagree: {} / {} records, {} / {} bubbles", dom->run.records,
                      stream->run.records, dom->run.bubbles, stream->run.bubbles));
    }
    std::printf("streaming vs DOM (same %zu records, %zu bubbles): %.1fx the throughput (CPU time), "
                "%.1fx less peak memory\n",
                stream->run.records, stream->run.bubbles, dom->run.cpu_s / stream->run.cpu_s,
                static_cast<double>(dom->run.peak_bytes) / stream->run.peak_bytes);
  }
  bool all_met = true;
  for (const Row& row : rows) {
    if (row.importer != "streaming") continue;
    const double mbps = json_mb / row.run.cpu_s;
    const double ratio = static_cast<double>(row.run.peak_bytes) / g.bytes;
    const bool fast = mbps >= 100.0, small = ratio <= 0.5;
    all_met = all_met && fast && small;
    std::printf("%-14s read + analyse >= 100 MB/s of JSON on one core: %s (%.0f MB/s of CPU time, "
                "%.0f MB/s wall); peak <= 0.5x JSON: %s (%.3fx)\n",
                row.input.c_str(), fast ? "met" : "NOT met", mbps, json_mb / row.run.total_s,
                small ? "met" : "NOT met", ratio);
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << json{{"benchmark", "bench_analyze"},
                                     {"load_average", load[0]},
                                     {"parent_resident_mb", parent_mb},
                                     {"source", source},
                                     {"json_bytes", g.bytes},
                                     {"events", g.events},
                                     {"repetitions", repetitions},
                                     {"dom_repetitions", dom_repetitions},
                                     {"rows", out_rows},
                                     {"targets_met", all_met}}
                                    .dump(2)
                             << "\n";
  }
  if (!keep) {
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
  } else {
    std::printf("kept %s\n", work.c_str());
  }
  return 0;
}
