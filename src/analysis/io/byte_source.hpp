// Where the streaming trace importer gets its bytes: a file, stdin or memory, inflated on the
// fly when gzip-compressed (detected by the magic bytes, not the file name). Part of the
// pipefill_trace_io library (zlib, simdjson), which the runtime never links.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "pipefill/pipefill.h"

namespace pipefill::analysis::io {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `capacity` bytes; *got == 0 only at the end. pfErrorIo when the source cannot be
  // read, pfErrorInvalidArgument for corrupt compressed data (message names the source).
  virtual pfResult_t read(char* buffer, size_t capacity, size_t* got) = 0;
  // Bytes taken from the underlying file or memory so far (compressed bytes for gzip).
  virtual uint64_t raw_bytes() const = 0;
  virtual bool compressed() const { return false; }
};

// A file descriptor (not closed when `owned` is false, e.g. stdin).
std::unique_ptr<ByteSource> fd_source(int fd, bool owned, std::string name);
// Bytes in memory (not copied: must outlive the source).
std::unique_ptr<ByteSource> memory_source(std::string_view bytes, std::string name);
// Inflates `inner` (gzip, several concatenated members allowed, or zlib).
std::unique_ptr<ByteSource> gzip_source(std::unique_ptr<ByteSource> inner, std::string name);

// Wraps `raw` in gzip_source when its first bytes are gzip's magic; other compressions (zstd,
// xz, bzip2, zip) are refused with a message saying which and how to decompress.
pfResult_t detect_compression(std::unique_ptr<ByteSource> raw, const std::string& name,
                              std::unique_ptr<ByteSource>* out);

// Opens a trace: a path, or "-" for stdin; gzip detected as above. pfErrorIo for a missing or
// unreadable file or a directory.
pfResult_t open_trace_source(const std::string& path, std::unique_ptr<ByteSource>* out);

}  // namespace pipefill::analysis::io
