#include "analysis/io/byte_source.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/error.hpp"

namespace pipefill::analysis::io {
namespace {

class FdSource final : public ByteSource {
 public:
  FdSource(int fd, bool owned, std::string name) : fd_(fd), owned_(owned), name_(std::move(name)) {}
  ~FdSource() override {
    if (owned_ && fd_ >= 0) ::close(fd_);
  }
  pfResult_t read(char* buffer, size_t capacity, size_t* got) override {
    while (true) {
      const ssize_t n = ::read(fd_, buffer, capacity);
      if (n >= 0) {
        *got = static_cast<size_t>(n);
        raw_ += static_cast<uint64_t>(n);
        return pfSuccess;
      }
      if (errno == EINTR) continue;
      return fail(pfErrorIo, "cannot read trace '{}' after {} bytes: {}", name_, raw_,
                  std::strerror(errno));
    }
  }
  uint64_t raw_bytes() const override { return raw_; }

 private:
  int fd_;
  bool owned_;
  std::string name_;
  uint64_t raw_ = 0;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::string_view bytes, std::string name) : bytes_(bytes), name_(std::move(name)) {}
  pfResult_t read(char* buffer, size_t capacity, size_t* got) override {
    const size_t n = std::min(capacity, bytes_.size() - position_);
    if (n > 0) std::memcpy(buffer, bytes_.data() + position_, n);
    position_ += n;
    *got = n;
    return pfSuccess;
  }
  uint64_t raw_bytes() const override { return position_; }

 private:
  std::string_view bytes_;
  std::string name_;
  size_t position_ = 0;
};

// Bytes already read while sniffing the format, then the rest of `inner`.
class PrefixedSource final : public ByteSource {
 public:
  PrefixedSource(std::string prefix, std::unique_ptr<ByteSource> inner)
      : prefix_(std::move(prefix)), inner_(std::move(inner)) {}
  pfResult_t read(char* buffer, size_t capacity, size_t* got) override {
    if (position_ < prefix_.size()) {
      const size_t n = std::min(capacity, prefix_.size() - position_);
      std::memcpy(buffer, prefix_.data() + position_, n);
      position_ += n;
      *got = n;
      return pfSuccess;
    }
    return inner_->read(buffer, capacity, got);
  }
  uint64_t raw_bytes() const override { return inner_->raw_bytes(); }

 private:
  std::string prefix_;
  size_t position_ = 0;
  std::unique_ptr<ByteSource> inner_;
};

class GzipSource final : public ByteSource {
 public:
  GzipSource(std::unique_ptr<ByteSource> inner, std::string name)
      : inner_(std::move(inner)), name_(std::move(name)), input_(kInputBytes) {
    std::memset(&stream_, 0, sizeof(stream_));
    // 15 + 32: a window of 2^15 and automatic gzip / zlib header detection.
    init_result_ = inflateInit2(&stream_, 15 + 32);
  }
  ~GzipSource() override {
    if (init_result_ == Z_OK) inflateEnd(&stream_);
  }
  bool compressed() const override { return true; }
  uint64_t raw_bytes() const override { return inner_->raw_bytes(); }

  pfResult_t read(char* buffer, size_t capacity, size_t* got) override {
    *got = 0;
    if (init_result_ != Z_OK) {
      return fail(pfErrorOutOfMemory, "{}: cannot start zlib: {}", name_, zError(init_result_));
    }
    if (capacity == 0 || finished_) return pfSuccess;
    stream_.next_out = reinterpret_cast<Bytef*>(buffer);
    stream_.avail_out = static_cast<uInt>(std::min<size_t>(capacity, 1u << 30));
    while (stream_.avail_out > 0) {
      if (stream_.avail_in == 0 && !input_eof_) {
        size_t n = 0;
        PF_TRY(inner_->read(input_.data(), input_.size(), &n));
        if (n == 0) {
          input_eof_ = true;
        } else {
          stream_.next_in = reinterpret_cast<Bytef*>(input_.data());
          stream_.avail_in = static_cast<uInt>(n);
        }
      }
      if (stream_.avail_in == 0 && input_eof_) {
        if (member_started_) {
          return fail(pfErrorInvalidArgument,
                      "{}: the gzip stream is truncated (it ends after {} compressed bytes, inside "
                      "a member)",
                      name_, inner_->raw_bytes());
        }
        finished_ = true;
        break;
      }
      member_started_ = true;
      const uInt in_before = stream_.avail_in, out_before = stream_.avail_out;
      const int r = inflate(&stream_, Z_NO_FLUSH);
      if (r == Z_BUF_ERROR && stream_.avail_in == in_before && stream_.avail_out == out_before &&
          in_before > 0) {
        return fail(pfErrorInvalidArgument, "{}: corrupt gzip data near compressed byte {}", name_,
                    inner_->raw_bytes() - stream_.avail_in);
      }
      if (r == Z_STREAM_END) {
        // gzip allows several members one after the other (e.g. `cat a.gz b.gz`).
        member_started_ = false;
        if (inflateReset(&stream_) != Z_OK) {
          return fail(pfErrorInternal, "{}: zlib reset failed", name_);
        }
        continue;
      }
      if (r == Z_OK || r == Z_BUF_ERROR) continue;  // Z_BUF_ERROR: needs more input
      const uint64_t at = inner_->raw_bytes() - stream_.avail_in;
      if (r == Z_MEM_ERROR) return fail(pfErrorOutOfMemory, "{}: zlib is out of memory", name_);
      return fail(pfErrorInvalidArgument, "{}: corrupt gzip data near compressed byte {}: {}",
                  name_, at, stream_.msg != nullptr ? stream_.msg : zError(r));
    }
    *got = capacity - stream_.avail_out;
    return pfSuccess;
  }

 private:
  static constexpr size_t kInputBytes = 256 * 1024;
  std::unique_ptr<ByteSource> inner_;
  std::string name_;
  std::vector<char> input_;
  z_stream stream_;
  int init_result_ = Z_OK;
  bool input_eof_ = false;
  bool member_started_ = false;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<ByteSource> fd_source(int fd, bool owned, std::string name) {
  return std::make_unique<FdSource>(fd, owned, std::move(name));
}

std::unique_ptr<ByteSource> memory_source(std::string_view bytes, std::string name) {
  return std::make_unique<MemorySource>(bytes, std::move(name));
}

std::unique_ptr<ByteSource> gzip_source(std::unique_ptr<ByteSource> inner, std::string name) {
  return std::make_unique<GzipSource>(std::move(inner), std::move(name));
}

pfResult_t detect_compression(std::unique_ptr<ByteSource> raw, const std::string& name,
                              std::unique_ptr<ByteSource>* out) {
  // Up to 6 bytes (xz's magic is the longest); a pipe may deliver them in pieces.
  std::string head(6, '\0');
  size_t have = 0;
  while (have < head.size()) {
    size_t n = 0;
    PF_TRY(raw->read(head.data() + have, head.size() - have, &n));
    if (n == 0) break;
    have += n;
  }
  head.resize(have);
  auto starts = [&](std::string_view magic) { return head.compare(0, magic.size(), magic) == 0; };
  const char* other = starts("\x28\xb5\x2f\xfd")            ? "zstd (zstd -d)"
                      : starts(std::string_view("\xfd" "7zXZ\0", 6)) ? "xz (xz -d)"
                      : starts("BZh")                        ? "bzip2 (bunzip2)"
                      : starts("PK\x03\x04")                 ? "zip (unzip)"
                                                             : nullptr;
  if (other != nullptr && head.size() >= 3) {
    return fail(pfErrorInvalidArgument,
                "{}: the trace is compressed with {}, which pipefill-analyze does not read; "
                "decompress it first (gzip is read directly)",
                name, other);
  }
  const bool gzip = head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
                    static_cast<unsigned char>(head[1]) == 0x8b;
  std::unique_ptr<ByteSource> source =
      std::make_unique<PrefixedSource>(std::move(head), std::move(raw));
  *out = gzip ? gzip_source(std::move(source), name) : std::move(source);
  return pfSuccess;
}

pfResult_t open_trace_source(const std::string& path, std::unique_ptr<ByteSource>* out) {
  if (path == "-") return detect_compression(fd_source(STDIN_FILENO, false, "-"), "-", out);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(pfErrorIo, "cannot open trace '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd);
    return fail(pfErrorIo, "trace '{}' is a directory (a folder of rank traces is read by "
                "read_trace_folder / the command line)", path);
  }
#ifdef POSIX_FADV_SEQUENTIAL
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  return detect_compression(fd_source(fd, true, path), path, out);
}

}  // namespace pipefill::analysis::io
