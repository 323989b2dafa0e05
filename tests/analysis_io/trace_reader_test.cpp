// The streaming importer (pipefill_trace_io): the same records as the DOM importer on every
// test trace whatever the chunk size, gzip (detected by content, several members) and stdin,
// and clear errors naming the file, the event index and the value.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "analysis/chrome_trace.hpp"
#include "analysis/io/byte_source.hpp"
#include "analysis/io/trace_reader.hpp"
#include "common/error.hpp"

namespace pipefill::analysis {
namespace {

using ::testing::HasSubstr;

const std::string kData = std::string(PIPEFILL_TEST_DATA_DIR) + "/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// gzip with zlib directly (not through the code under test).
std::string gzip(std::string_view text, int level = 6) {
  z_stream s{};
  EXPECT_EQ(deflateInit2(&s, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&s, text.size()) + 64, '\0');
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  s.avail_in = static_cast<uInt>(text.size());
  s.next_out = reinterpret_cast<Bytef*>(out.data());
  s.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
  out.resize(s.total_out);
  deflateEnd(&s);
  return out;
}

std::string gunzip(const std::string& bytes) {
  z_stream s{};
  EXPECT_EQ(inflateInit2(&s, 15 + 16), Z_OK);
  s.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  s.avail_in = static_cast<uInt>(bytes.size());
  std::string out;
  char buffer[1 << 16];
  int r = Z_OK;
  while (r != Z_STREAM_END) {
    s.next_out = reinterpret_cast<Bytef*>(buffer);
    s.avail_out = sizeof(buffer);
    r = inflate(&s, Z_NO_FLUSH);
    EXPECT_TRUE(r == Z_OK || r == Z_STREAM_END) << r;
    if (r != Z_OK && r != Z_STREAM_END) break;
    out.append(buffer, sizeof(buffer) - s.avail_out);
  }
  inflateEnd(&s);
  return out;
}

void expect_same(const CompactTrace& a, const CompactTrace& b) {
  EXPECT_EQ(a.events_total, b.events_total);
  EXPECT_EQ(a.events_skipped, b.events_skipped);
  EXPECT_EQ(a.device_memory_bytes, b.device_memory_bytes);
  EXPECT_EQ(a.rank, b.rank);
  ASSERT_EQ(a.records.size(), b.records.size());
  for (size_t i = 0; i < a.records.size(); ++i) {
    const TraceRecord& x = a.records[i];
    const TraceRecord& y = b.records[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(a.name_of(x), b.name_of(y));
    EXPECT_EQ(x.kind, y.kind);
    EXPECT_EQ(x.start_us, y.start_us);
    EXPECT_EQ(x.end_us, y.end_us);
    EXPECT_EQ(x.device, y.device);
    EXPECT_EQ(x.stream, y.stream);
    EXPECT_EQ(x.bytes, y.bytes);
    EXPECT_EQ(x.correlation, y.correlation);
    EXPECT_EQ(x.in_use_bytes, y.in_use_bytes);
    EXPECT_EQ(x.process, y.process);
    EXPECT_EQ(x.event_index, y.event_index);
    EXPECT_EQ(x.grid_blocks, y.grid_blocks);
    if (::testing::Test::HasFailure()) return;  // one record's diff is enough
  }
}

CompactTrace dom(const std::string& text, const std::string& name) {
  CompactTrace t;
  EXPECT_EQ(import_chrome_trace(text, name, ImportOptions{}, &t), pfSuccess) << last_error_message();
  return t;
}

CompactTrace stream(const std::string& bytes, const std::string& name, size_t chunk = 1 << 20) {
  CompactTrace t;
  io::ReadOptions read;
  read.chunk_bytes = chunk;
  EXPECT_EQ(io::read_trace_bytes(bytes, name, ImportOptions{}, &t, read), pfSuccess)
      << last_error_message();
  return t;
}

TEST(TraceReader, GivesTheSameRecordsAsTheDomImporterOnEveryTestTrace) {
  for (const char* name : {"torch_stage_baseline.json", "torch_stage_filled.json"}) {
    SCOPED_TRACE(name);
    const std::string text = read_file(kData + name);
    const CompactTrace expected = dom(text, name);
    EXPECT_GT(expected.records.size(), 10u);
    expect_same(stream(text, name), expected);
  }
  // hta/test.json.gz (33 MB of JSON) is left out: the DOM importer takes seconds on it under
  // the sanitizers; real_traces_test checks what the streaming importer makes of it.
  for (const char* name :
       {"hta/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "hta/nccl_data.json.gz",
        "hta/sampled_ranks/sampled_rank-0.json.gz", "hta/sampled_ranks/sampled_rank-1.json.gz"}) {
    SCOPED_TRACE(name);
    const std::string compressed = read_file(kData + name);
    const std::string text = gunzip(compressed);
    const CompactTrace expected = dom(text, name);
    EXPECT_GT(expected.records.size(), 10u);
    expect_same(stream(text, name), expected);        // plain JSON
    expect_same(stream(compressed, name), expected);  // the shared .json.gz, inflated on the fly
  }
}

TEST(TraceReader, ChunkSizeDoesNotChangeTheRecords) {
  const std::string text = read_file(kData + "torch_stage_filled.json");
  const CompactTrace expected = dom(text, "t");
  for (const size_t chunk : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{64}, size_t{4096}}) {
    SCOPED_TRACE(chunk);
    expect_same(stream(text, "t", chunk), expected);
    expect_same(stream(gzip(text), "t", chunk), expected);
  }
  const std::string nccl = gunzip(read_file(kData + "hta/nccl_data.json.gz"));
  expect_same(stream(nccl, "n", 4096), dom(nccl, "n"));
}

TEST(TraceReader, GzipIsDetectedByContentAndSeveralMembersAreOneStream) {
  const std::string text = read_file(kData + "torch_stage_baseline.json");
  const CompactTrace expected = dom(text, "t");
  // No .gz in the name: the magic bytes decide.
  expect_same(stream(gzip(text), "trace.json"), expected);
  // `cat a.gz b.gz`: members split at an arbitrary byte, inside a JSON string even.
  const size_t cut = text.size() / 3 + 1;
  expect_same(stream(gzip(text.substr(0, cut), 1) + gzip(text.substr(cut), 9), "t"), expected);
}

TEST(TraceReader, TruncatedOrCorruptGzipIsAClearError) {
  const std::string text = read_file(kData + "torch_stage_baseline.json");
  const std::string gz = gzip(text);
  CompactTrace t;
  EXPECT_EQ(io::read_trace_bytes(gz.substr(0, gz.size() - 12), "cut.json.gz", ImportOptions{}, &t),
            pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("cut.json.gz: the gzip stream is truncated"));
  // The CRC-32 of the trailer no longer matches.
  std::string bad = gz;
  bad[bad.size() - 6] = static_cast<char>(bad[bad.size() - 6] ^ 0x5a);
  EXPECT_EQ(io::read_trace_bytes(bad, "crc.json.gz", ImportOptions{}, &t), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("crc.json.gz: corrupt gzip data"));
}

TEST(TraceReader, OtherCompressionsAreNamedWithTheCommandThatUndoesThem) {
  CompactTrace t;
  EXPECT_EQ(io::read_trace_bytes(std::string("\x28\xb5\x2f\xfd\x00\x00", 6), "t.json.zst",
                                 ImportOptions{}, &t),
            pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("t.json.zst: the trace is compressed with zstd (zstd -d)"));
  EXPECT_EQ(io::read_trace_bytes("BZh91AY&SY", "t.bz2", ImportOptions{}, &t), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("bzip2"));
  // Other binary data: says so instead of quoting the byte as if it were text.
  EXPECT_EQ(io::read_trace_bytes("\x01\x02\x03", "t.bin", ImportOptions{}, &t), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("t.bin: not valid JSON at byte 0: unexpected '\\x01' (binary data"));
}

// Writes `bytes` into a pipe in small pieces from another thread, as a shell pipeline would.
class PipeWriter {
 public:
  explicit PipeWriter(std::string bytes) : bytes_(std::move(bytes)) {
    EXPECT_EQ(::pipe(fds_), 0);
    thread_ = std::thread([this] {
      for (size_t at = 0; at < bytes_.size();) {
        const size_t n = std::min<size_t>(777, bytes_.size() - at);
        const ssize_t w = ::write(fds_[1], bytes_.data() + at, n);
        if (w <= 0) break;
        at += static_cast<size_t>(w);
      }
      ::close(fds_[1]);
    });
  }
  ~PipeWriter() {
    thread_.join();
    ::close(fds_[0]);
  }
  int read_end() const { return fds_[0]; }

 private:
  std::string bytes_;
  int fds_[2] = {-1, -1};
  std::thread thread_;
};

TEST(TraceReader, StdinIsReadWhenThePathIsADash) {
  const std::string text = read_file(kData + "torch_stage_filled.json");
  const CompactTrace expected = dom(text, "-");
  for (const bool compressed : {false, true}) {
    SCOPED_TRACE(compressed);
    PipeWriter writer(compressed ? gzip(text) : text);
    const int saved = ::dup(STDIN_FILENO);
    ASSERT_GE(saved, 0);
    ASSERT_EQ(::dup2(writer.read_end(), STDIN_FILENO), STDIN_FILENO);
    CompactTrace t;
    const pfResult_t r = io::read_trace_file("-", ImportOptions{}, &t);
    ::dup2(saved, STDIN_FILENO);
    ::close(saved);
    ASSERT_EQ(r, pfSuccess) << last_error_message();
    EXPECT_EQ(t.source, "-");
    expect_same(t, expected);
  }
}

TEST(TraceReader, FilesFoldersAndMissingPathsAreIoErrorsNamingThePath) {
  CompactTrace t;
  EXPECT_EQ(io::read_trace_file(kData + "no_such_trace.json.gz", ImportOptions{}, &t), pfErrorIo);
  EXPECT_THAT(last_error_message(), HasSubstr("no_such_trace.json.gz"));
  EXPECT_EQ(io::read_trace_file(kData + "hta", ImportOptions{}, &t), pfErrorIo);
  EXPECT_THAT(last_error_message(), HasSubstr("is a directory"));

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pipefill_folder_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "sub.json");
  for (const char* name : {"b.json.gz", "a.json", "notes.txt", "c.json.bak"}) {
    std::ofstream(dir / name) << "[]";
  }
  std::vector<std::string> files;
  ASSERT_EQ(io::list_trace_folder(dir.string(), &files), pfSuccess);
  EXPECT_EQ(files, (std::vector<std::string>{(dir / "a.json").string(), (dir / "b.json.gz").string()}));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  EXPECT_EQ(io::list_trace_folder(dir.string(), &files), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("holds no *.json or *.json.gz trace"));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(io::list_trace_folder(dir.string(), &files), pfErrorIo);
}

// A kernel named k at traceEvents[1] after a metadata event, with `fields` spliced in.
std::string one_kernel(const std::string& fields) {
  return R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0},
    {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, )" + fields + "}]}";
}

std::string one_event(const std::string& event) {
  return R"({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 0}, )" + event + "]}";
}

struct BadCase {
  std::string json;
  std::string expected;
};

class TraceReaderErrors : public ::testing::TestWithParam<BadCase> {};

TEST_P(TraceReaderErrors, NameTheFileTheEventAndTheValue) {
  for (const bool compressed : {false, true}) {
    CompactTrace t;
    const std::string bytes = compressed ? gzip(GetParam().json) : GetParam().json;
    EXPECT_EQ(io::read_trace_bytes(bytes, "bad.json", ImportOptions{}, &t), pfErrorInvalidArgument);
    const std::string& message = last_error_message();
    EXPECT_EQ(message.rfind("bad.json: ", 0), 0u) << message;
    EXPECT_THAT(message, HasSubstr(GetParam().expected));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Values, TraceReaderErrors,
    ::testing::Values(
        // Issue 12's cases: the JSON token is quoted as written.
        BadCase{one_kernel(R"("ts": 1e400, "dur": 5)"),
                "traceEvents[1] ('k'): \"ts\" 1e400 is outside the range of a double"},
        BadCase{one_kernel(R"("ts": 10, "dur": -1e400)"),
                "traceEvents[1] ('k'): \"dur\" -1e400 is outside the range of a double"},
        BadCase{one_kernel(R"("ts": 9.2e18, "dur": 5)"),
                "traceEvents[1] ('k'): \"ts\" 9.2e18 us is beyond 2^52 us"},
        BadCase{one_kernel(R"("ts": 9223372036854775807, "dur": 5)"),
                "\"ts\" 9223372036854775807 us is beyond 2^52 us"},
        BadCase{one_kernel(R"("ts": 10, "dur": 9.2e18)"),
                "traceEvents[1] ('k'): \"dur\" 9.2e18 us is beyond 2^52 us"},
        BadCase{one_event(R"({"ph": "X", "cat": "gpu_memcpy", "name": "c", "pid": 0, "ts": 1, "dur": 1, "args": {"bytes": 9e18}})"),
                "traceEvents[1] ('c'): \"bytes\" 9e18 is outside [0, 2^53]"},
        BadCase{one_event(R"({"ph": "X", "cat": "gpu_memset", "name": "s", "pid": 0, "ts": 1, "dur": 1, "args": {"bytes": -9e18}})"),
                "traceEvents[1] ('s'): \"bytes\" -9e18 is outside [0, 2^53]"},
        BadCase{one_event(R"({"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 9e18}})"),
                "traceEvents[1] ([memory]): \"Bytes\" 9e18 is outside [-2^53, 2^53]"},
        BadCase{one_event(R"({"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": -9e18}})"),
                "traceEvents[1] ([memory]): \"Bytes\" -9e18 is outside [-2^53, 2^53]"},
        BadCase{one_event(R"({"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 8, "Total Allocated": 9.2e18}})"),
                "traceEvents[1] ([memory]): \"Total Allocated\" 9.2e18 is outside [0, 2^53]"},
        BadCase{one_event(R"({"ph": "i", "name": "[memory]", "ts": 1, "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1e400}})"),
                "traceEvents[1] ([memory]): \"Bytes\" 1e400 is outside"},
        BadCase{one_event(R"({"ph": "X", "cat": "kernel", "name": "k", "pid": 1e12, "ts": 1, "dur": 1})"),
                "traceEvents[1] ('k'): device id 1e12 (from pid) is outside [0, 2147483647]"},
        BadCase{one_event(R"({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "ts": 1, "dur": 1, "args": {"device": -3}})"),
                "device id -3 (from args.device) is outside"},
        BadCase{one_kernel(R"("ts": 10, "dur": -2)"), "traceEvents[1] ('k'): \"dur\" -2 is negative"},
        BadCase{one_kernel(R"("ts": "soon", "dur": 2)"), "traceEvents[1] ('k'): \"ts\" \"soon\" is not a finite number"},
        BadCase{one_kernel(R"("dur": 2)"), "traceEvents[1] ('k'): \"ts\" is missing"},
        BadCase{one_event(R"({"ph": "X", "cat": "kernel", "name": 5, "ts": 1, "dur": 1})"),
                "traceEvents[1]: \"name\" has JSON type number, expected a string"},
        // Structure.
        BadCase{"", "the trace is empty"},
        BadCase{"   \n", "the trace is empty"},
        BadCase{"\"trace\"", "the trace has JSON type string"},
        BadCase{R"({"traceEvents": [{"ph": "M"}, 7]})", "traceEvents[1] has JSON type number, expected an object"},
        BadCase{R"({"traceEvents": [{"ph": "M"},)", "the trace ends at byte 29 inside traceEvents"},
        BadCase{R"({"traceEvents": [{"ph": "M", "name": "a)", "the trace ends at byte 39 inside a string"},
        BadCase{R"({"traceEvents": [{"ph": "M"}] )", "the trace ends at byte 30 inside the trace object"},
        BadCase{R"({"traceEvents": [{"ph": "M"}]} x)", "not valid JSON at byte 31: unexpected 'x' after the end of the trace"},
        BadCase{R"({"traceEvents": [{"ph": "M"} {"ph": "M"}]})", "expected ',' or ']' after traceEvents[0], got '{'"},
        BadCase{R"({"traceEvents": [{"ph": "M"}, {"ph": "X", "cat": "kernel",}]})", "traceEvents[1] (byte 30) is not valid JSON"},
        BadCase{R"({"traceEvents": [{"ph": "M"}, {"ph": "X", "ts": 1.2.3}]})", "traceEvents[1] (byte 30) is not valid JSON"},
        // Unbalanced quotes make the element end early; what follows it in the buffer must not
        // make it valid (found by the fuzzer: it was accepted when the next event was there).
        BadCase{R"({"traceEvents":[{"ph":"M","name":"p","pid":0,"args":"{name":"GPU 0"}},{"ph":"M","name":"x"}]})",
                "traceEvents[0] (byte 16) is not valid JSON"},
        BadCase{R"({"displayTimeUnit": "ms"})", "no \"traceEvents\" array in the trace object"},
        BadCase{R"({"traceEvents": {"ph": "X"}})", "\"traceEvents\" has JSON type object, expected an array"},
        BadCase{R"({"traceEvents": [], "traceEvents": []})", "\"traceEvents\" appears twice"},
        BadCase{R"({"traceEvents" [], })", "expected ':' after a key, got '['"},
        BadCase{R"({traceEvents: []})", "expected a key, got 't'"}));

TEST(TraceReader, ToleratesWhatTheAnalyserDoesNotRead) {
  // A byte-order mark, escaped quotes and brackets in strings, a unicode-escaped kernel name,
  // other top-level values before and after traceEvents (nested), the bare array form, and a
  // CPU op whose args hold a number no double holds (its args are never parsed).
  const std::string text = "\xEF\xBB\xBF" R"( { "otherData": {"a": [1, {"b": "]}\"{["}], "c": null},
    "traceEvents" : [
      {"ph": "X", "cat": "cpu_op", "name": "aten::mm \"]}", "pid": 1, "tid": 1, "ts": 0, "dur": 1,
       "args": {"huge": 1e400, "s": "{[\\\"", "nested": [[[]]]}},
      {"ph": "X", "cat": "kernel", "name": "g\u00e9mm\n", "pid": 3, "tid": 9, "ts": 100.5, "dur": 20.25,
       "args": {"correlation": 12, "grid": [4, 2, 1], "unused": {"x": [1e400]}}},
      {"ph": "X", "cat": "Memcpy", "name": "Memcpy HtoD", "pid": 3, "tid": "stream 8", "ts": 130, "dur": 5,
       "args": {"bytes": "1024", "device": 3}}
    ],
    "deviceProperties": [{"id": 3, "totalGlobalMem": 1000}, "junk", {"id": -1, "totalGlobalMem": 5}],
    "distributedInfo": {"rank": 4} } )";
  for (const size_t chunk : {size_t{1}, size_t{5}, size_t{1} << 20}) {
    SCOPED_TRACE(chunk);
    const CompactTrace t = stream(text, "ok.json", chunk);
    EXPECT_EQ(t.events_total, 3u);
    EXPECT_EQ(t.events_skipped, 1u);
    EXPECT_EQ(t.rank, 4);
    EXPECT_EQ(t.device_memory_bytes, (std::map<int, uint64_t>{{3, 1000}}));
    ASSERT_EQ(t.records.size(), 2u);
    const TraceRecord& k = t.records[0];
    EXPECT_EQ(t.name_of(k), "g\xc3\xa9mm\n");
    EXPECT_EQ(k.kind, ActivityKind::Kernel);
    EXPECT_EQ(k.device, 3);
    EXPECT_EQ(k.stream, 9u);
    EXPECT_EQ(k.start_us, 100.5);
    EXPECT_EQ(k.end_us, 120.75);
    EXPECT_EQ(k.correlation, 12u);
    EXPECT_EQ(k.grid_blocks, 8);
    EXPECT_EQ(k.event_index, 1u);
    const TraceRecord& c = t.records[1];
    EXPECT_EQ(c.kind, ActivityKind::Memcpy);
    EXPECT_EQ(c.stream, 8u);
    EXPECT_EQ(c.bytes, 1024u);
    EXPECT_EQ(c.event_index, 2u);
  }
  const CompactTrace bare = stream(R"([{"ph": "X", "cat": "kernel", "name": "a", "pid": 0, "ts": 1, "dur": 2}])", "bare.json");
  ASSERT_EQ(bare.records.size(), 1u);
  EXPECT_EQ(bare.records[0].end_us, 3.0);
}

TEST(TraceReader, AnEventLargerThanTheLimitIsRefusedNotBuffered) {
  const std::string text = one_event(R"({"ph": "X", "cat": "cpu_op", "name": ")" +
                                     std::string(5000, 'a') + R"(", "ts": 1, "dur": 1})");
  io::ReadOptions read;
  read.chunk_bytes = 64;
  read.max_value_bytes = 1024;
  CompactTrace t;
  EXPECT_EQ(io::read_trace_bytes(text, "big.json", ImportOptions{}, &t, read), pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("big.json: a single value at byte"));
  EXPECT_THAT(last_error_message(), HasSubstr("--max-value-mib"));  // how to raise it
  read.max_value_bytes = 8192;
  EXPECT_EQ(io::read_trace_bytes(text, "big.json", ImportOptions{}, &t, read), pfSuccess)
      << last_error_message();
  EXPECT_EQ(t.events_total, 2u);
}

// The number of events is bounded too (memory and time grow with it): one more than the bound
// is refused naming the flag that raises it; at the bound the trace reads.
TEST(TraceReader, MoreEventsThanTheBoundAreRefusedNamingTheFlag) {
  std::string text = R"({"traceEvents": [)";
  for (int i = 0; i < 5; ++i) {
    text += std::string(i == 0 ? "" : ",") +
            R"({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "ts": )" +
            std::to_string(10 * i) + R"(, "dur": 1})";
  }
  text += "]}";
  io::ReadOptions read;
  read.max_events = 4;
  CompactTrace t;
  EXPECT_EQ(io::read_trace_bytes(text, "many.json", ImportOptions{}, &t, read),
            pfErrorInvalidArgument);
  EXPECT_THAT(last_error_message(), HasSubstr("many.json: more than 4 entries in traceEvents"));
  EXPECT_THAT(last_error_message(), HasSubstr("--max-events"));
  read.max_events = 5;
  CompactTrace all;
  ASSERT_EQ(io::read_trace_bytes(text, "many.json", ImportOptions{}, &all, read), pfSuccess)
      << last_error_message();
  EXPECT_EQ(all.records.size(), 5u);
}

}  // namespace
}  // namespace pipefill::analysis
