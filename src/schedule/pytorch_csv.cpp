// PyTorch CSV schedule import / export. Format and grammar: pytorch_csv.hpp.
#include "schedule/pytorch_csv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <new>
#include <set>
#include <sstream>

namespace pipefill::schedule {
namespace {

constexpr size_t kMaxFileBytes = size_t{256} << 20;
constexpr long long kMaxIndex = 1LL << 24;  // stage and micro-batch indices (validate() bounds the product)

bool fail_with(std::string* error, std::string message) {
  if (error != nullptr) *error = std::move(message);
  return false;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t')) --e;
  return s.substr(b, e - b);
}

// Splits one CSV line into fields (comma separated; double-quoted fields with "" escapes, as
// Python's csv module writes them).
bool split_fields(const std::string& line, std::vector<std::string>* fields, std::string* why) {
  fields->clear();
  std::string cur;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          cur.push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        cur.push_back(c);
      }
    } else if (c == '"' && trim(cur).empty() && !was_quoted) {
      quoted = was_quoted = true;
      cur.clear();
    } else if (c == ',') {
      fields->push_back(cur);
      cur.clear();
      was_quoted = false;
    } else {
      cur.push_back(c);
    }
  }
  if (quoted) {
    *why = "unterminated quoted field";
    return false;
  }
  fields->push_back(cur);
  return true;
}

enum class Kind { F, I, B, W, Skipped };

struct Parsed {
  bool idle = false;
  std::vector<std::pair<Kind, std::pair<long long, long long>>> actions;  // (kind, (stage, mb))
  size_t skipped = 0;
};

bool parse_number(const std::string& s, size_t* pos, long long* out, bool* present) {
  *present = false;
  long long v = 0;
  while (*pos < s.size() && s[*pos] >= '0' && s[*pos] <= '9') {
    *present = true;
    v = v * 10 + (s[*pos] - '0');
    if (v > kMaxIndex) return false;
    ++*pos;
  }
  *out = v;
  return true;
}

// One action (no parentheses): stage kind [microbatch].
bool parse_simple(const std::string& text, std::pair<Kind, std::pair<long long, long long>>* out, std::string* why) {
  size_t pos = 0;
  long long stage = 0, mb = -1;
  bool present = false;
  if (!parse_number(text, &pos, &stage, &present)) {
    *why = fmt::format("stage index exceeds {}", kMaxIndex);
    return false;
  }
  if (!present) {
    *why = "should start with the stage index, e.g. 2F0";
    return false;
  }
  const size_t kind_begin = pos;
  while (pos < text.size() && ((text[pos] >= 'A' && text[pos] <= 'Z') || text[pos] == '_')) ++pos;
  const std::string kind = text.substr(kind_begin, pos - kind_begin);
  bool mb_present = false;
  if (!parse_number(text, &pos, &mb, &mb_present)) {
    *why = fmt::format("micro-batch index exceeds {}", kMaxIndex);
    return false;
  }
  if (pos != text.size()) {
    *why = "trailing characters after the micro-batch index";
    return false;
  }
  static const std::set<std::string> kSkipped = {"UNSHARD", "RESHARD", "REDUCE_GRAD", "SEND_F",
                                                 "RECV_F",  "SEND_B",  "RECV_B"};
  Kind k;
  if (kind == "F") k = Kind::F;
  else if (kind == "I") k = Kind::I;
  else if (kind == "B") k = Kind::B;
  else if (kind == "W") k = Kind::W;
  else if (kSkipped.count(kind)) k = Kind::Skipped;
  else {
    *why = fmt::format("unknown action kind '{}' (F, I, B, W, UNSHARD, RESHARD, REDUCE_GRAD, SEND_F, RECV_F, "
                       "SEND_B, RECV_B)", kind);
    return false;
  }
  if (k != Kind::Skipped && !mb_present) {
    *why = fmt::format("compute action '{}' needs a micro-batch index, e.g. {}{}0", kind, stage, kind);
    return false;
  }
  *out = {k, {stage, mb_present ? mb : -1}};
  return true;
}

bool parse_field(const std::string& raw, Parsed* out, std::string* why) {
  const std::string text = trim(raw);
  *out = Parsed{};
  if (text.empty()) {
    out->idle = true;
    return true;
  }
  if (text[0] == '(') {
    const size_t close = text.find(')');
    if (close == std::string::npos) {
      *why = "'(' without ')'";
      return false;
    }
    const std::string kind = text.substr(close + 1);
    if (kind != "OVERLAP_F_B") {
      *why = fmt::format("a parenthesised action list must be followed by OVERLAP_F_B, got '{}'", kind);
      return false;
    }
    const std::string inner = text.substr(1, close - 1);
    size_t begin = 0;
    while (begin <= inner.size()) {
      const size_t semi = inner.find(';', begin);
      const std::string part = trim(inner.substr(begin, semi == std::string::npos ? std::string::npos : semi - begin));
      if (!part.empty()) {
        std::pair<Kind, std::pair<long long, long long>> a;
        if (!parse_simple(part, &a, why)) {
          *why = fmt::format("sub-action '{}': {}", part, *why);
          return false;
        }
        if (a.first == Kind::Skipped) {
          *why = fmt::format("sub-action '{}' of OVERLAP_F_B is not a compute action", part);
          return false;
        }
        out->actions.push_back(a);
      }
      if (semi == std::string::npos) break;
      begin = semi + 1;
    }
    if (out->actions.empty()) {
      *why = "OVERLAP_F_B without sub-actions";
      return false;
    }
    return true;
  }
  std::pair<Kind, std::pair<long long, long long>> a;
  if (!parse_simple(text, &a, why)) return false;
  if (a.first == Kind::Skipped) out->skipped = 1;
  else out->actions.push_back(a);
  return true;
}

OpType op_type(Kind k) {
  switch (k) {
    case Kind::F: return OpType::Forward;
    case Kind::I: return OpType::BackwardInput;
    case Kind::W: return OpType::BackwardWeight;
    default: return OpType::Backward;
  }
}

bool parse_impl(const std::string& text, const std::string& source, CustomSchedule* out, std::string* error,
                CsvStats* stats) {
  const std::string where = source.empty() ? std::string("schedule CSV") : source;
  // Lines (\n or \r\n); a trailing newline does not start a rank.
  std::vector<std::string> lines;
  {
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      std::string line = text.substr(begin, end - begin);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      lines.push_back(std::move(line));
      begin = end + 1;
    }
    while (!lines.empty() && trim(lines.back()).empty()) lines.pop_back();
  }
  if (lines.empty()) return fail_with(error, fmt::format("{}: no rows (one row of actions per pipeline rank)", where));
  const int ranks = static_cast<int>(std::min<size_t>(lines.size(), static_cast<size_t>(kMaxIndex)));
  if (lines.size() > static_cast<size_t>(kMaxIndex))
    return fail_with(error, fmt::format("{}: {} rows exceed {} ranks", where, lines.size(), kMaxIndex));

  CsvStats st;
  std::vector<std::vector<Op>> order(static_cast<size_t>(ranks));
  std::map<long long, int> rank_of_stage;
  long long max_mb = -1;
  std::vector<std::string> fields;
  for (int r = 0; r < ranks; ++r) {
    std::string why;
    if (!split_fields(lines[static_cast<size_t>(r)], &fields, &why))
      return fail_with(error, fmt::format("{}: line {}: {}", where, r + 1, why));
    for (size_t f = 0; f < fields.size(); ++f) {
      Parsed parsed;
      if (!parse_field(fields[f], &parsed, &why))
        return fail_with(error, fmt::format("{}: line {} (rank {}), field {} '{}': {}", where, r + 1, r, f + 1,
                                            trim(fields[f]), why));
      if (parsed.idle) ++st.idle_slots;
      st.skipped_actions += parsed.skipped;
      for (size_t a = 0; a < parsed.actions.size(); ++a) {
        const auto& [kind, idx] = parsed.actions[a];
        const long long stage = idx.first, mb = idx.second;
        auto [it, inserted] = rank_of_stage.emplace(stage, r);
        if (!inserted && it->second != r)
          return fail_with(error, fmt::format("{}: line {} field {}: stage {} is on rank {} and on rank {} (a stage "
                                              "belongs to one rank)", where, r + 1, f + 1, stage, it->second, r));
        max_mb = std::max(max_mb, mb);
        Op op;
        op.type = op_type(kind);
        op.microbatch = static_cast<int>(mb);
        op.virtual_stage = static_cast<int>(stage);
        op.overlapped_with_next = a + 1 < parsed.actions.size();
        order[static_cast<size_t>(r)].push_back(op);
        ++st.compute_actions;
      }
    }
  }
  if (rank_of_stage.empty()) return fail_with(error, fmt::format("{}: no compute actions (F, I, B, W)", where));
  for (int r = 0; r < ranks; ++r)
    if (order[static_cast<size_t>(r)].empty())
      return fail_with(error, fmt::format("{}: rank {} (line {}) has no compute actions", where, r, r + 1));
  const long long virtual_stages = rank_of_stage.rbegin()->first + 1;
  if (static_cast<long long>(rank_of_stage.size()) != virtual_stages) {
    long long missing = 0;
    while (rank_of_stage.count(missing)) ++missing;
    return fail_with(error, fmt::format("{}: stage {} has no actions (stages 0..{} appear)", where, missing,
                                        virtual_stages - 1));
  }
  if (virtual_stages % ranks != 0)
    return fail_with(error, fmt::format("{}: {} stages on {} ranks: every rank must hold the same number of stages",
                                        where, virtual_stages, ranks));
  const int chunks = static_cast<int>(virtual_stages / ranks);
  std::vector<std::vector<int>> stages_of_rank(static_cast<size_t>(ranks));
  for (const auto& [stage, rank] : rank_of_stage) stages_of_rank[static_cast<size_t>(rank)].push_back(static_cast<int>(stage));
  CustomSchedule c;
  c.stages = ranks;
  c.chunks = chunks;
  c.microbatches = static_cast<int>(max_mb + 1);
  c.source = where;
  c.stage_of_virtual.assign(static_cast<size_t>(virtual_stages), -1);
  c.chunk_of_virtual.assign(static_cast<size_t>(virtual_stages), -1);
  for (int r = 0; r < ranks; ++r) {
    const auto& list = stages_of_rank[static_cast<size_t>(r)];  // ascending (map order)
    if (static_cast<int>(list.size()) != chunks)
      return fail_with(error, fmt::format("{}: rank {} holds {} stages; {} stages on {} ranks need {} per rank", where,
                                          r, list.size(), virtual_stages, ranks, chunks));
    for (size_t i = 0; i < list.size(); ++i) {
      c.stage_of_virtual[static_cast<size_t>(list[i])] = r;
      c.chunk_of_virtual[static_cast<size_t>(list[i])] = static_cast<int>(i);
    }
  }
  for (int r = 0; r < ranks; ++r)
    for (Op& op : order[static_cast<size_t>(r)]) op.chunk = c.chunk_of_virtual[static_cast<size_t>(op.virtual_stage)];
  c.order = std::move(order);

  // Structure and deadlock check with uniform costs (the order's validity does not depend on
  // the costs: an op's dependencies are fixed).
  auto shared = std::make_shared<CustomSchedule>(c);
  ScheduleSpec spec;
  use_custom_schedule(&spec, shared);
  StageCosts costs;
  costs.forward_us = 1.0;
  costs.backward_us = 2.0;
  costs.weight_us = 1.0;
  spec.costs.assign(static_cast<size_t>(c.stages), costs);
  Timeline probe;
  if (!simulate(spec, &probe, error)) return false;
  *out = std::move(c);
  if (stats != nullptr) *stats = st;
  return true;
}

}  // namespace

std::string pytorch_action(const Op& op) {
  const char* kind = "?";
  switch (op.type) {
    case OpType::Forward: kind = "F"; break;
    case OpType::Backward: kind = "B"; break;
    case OpType::BackwardInput: kind = "I"; break;
    case OpType::BackwardWeight: kind = "W"; break;
    default: break;
  }
  return fmt::format("{}{}{}", op.virtual_stage, kind, op.microbatch);
}

bool parse_pytorch_csv(const std::string& text, const std::string& source, CustomSchedule* out, std::string* error,
                       CsvStats* stats) {
  if (out == nullptr) return fail_with(error, "parse_pytorch_csv: out must not be null");
  try {
    return parse_impl(text, source, out, error, stats);
  } catch (const std::bad_alloc&) {
    return fail_with(error, fmt::format("{}: out of memory", source));
  }
}

bool load_pytorch_csv(const std::string& path, CustomSchedule* out, std::string* error, CsvStats* stats) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail_with(error, fmt::format("cannot open schedule CSV '{}'", path));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return fail_with(error, fmt::format("cannot read schedule CSV '{}'", path));
  if (static_cast<uint64_t>(size) > kMaxFileBytes)
    return fail_with(error, fmt::format("schedule CSV '{}' is {} bytes, more than the {} MiB limit", path, size,
                                        kMaxFileBytes >> 20));
  in.seekg(0, std::ios::beg);
  std::string text(static_cast<size_t>(size), '\0');
  if (size > 0 && !in.read(text.data(), size)) return fail_with(error, fmt::format("cannot read schedule CSV '{}'", path));
  return parse_pytorch_csv(text, path, out, error, stats);
}

std::string format_pytorch_csv(const std::vector<std::vector<Op>>& order) {
  std::string out;
  for (const auto& ops : order) {
    bool first = true, in_group = false;
    for (const Op& op : ops) {
      if (op.type != OpType::Forward && op.type != OpType::Backward && op.type != OpType::BackwardInput &&
          op.type != OpType::BackwardWeight)
        continue;
      if (!in_group) {
        if (!first) out += ',';
        first = false;
        if (op.overlapped_with_next) {
          out += '(';
          in_group = true;
        }
      } else {
        out += ';';
      }
      out += pytorch_action(op);
      if (in_group && !op.overlapped_with_next) {
        out += ")OVERLAP_F_B";
        in_group = false;
      }
    }
    if (in_group) out += ")OVERLAP_F_B";
    out += '\n';
  }
  return out;
}

void use_custom_schedule(ScheduleSpec* spec, std::shared_ptr<const CustomSchedule> schedule) {
  spec->kind = ScheduleKind::Custom;
  spec->stages = schedule->stages;
  spec->chunks = schedule->chunks;
  spec->microbatches = schedule->microbatches;
  spec->microbatch_group_size = 0;
  spec->custom = std::move(schedule);
}

}  // namespace pipefill::schedule
