#include "cupti_convert.hpp"

namespace pipefill::cuda {

const char* memcpy_kind_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "Memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "Memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "Memcpy HtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "Memcpy AtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "Memcpy AtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "Memcpy AtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "Memcpy DtoA";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "Memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "Memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "Memcpy PtoP";
    default: return "Memcpy";
  }
}

ActivityRecord ActivityConverter::from_kernel(const CuptiKernelRecord& kernel) const {
  ActivityRecord out;
  out.name = kernel.name ? kernel.name : "";
  if (is_fill_stream(kernel.contextId, kernel.streamId))
    out.kind = ActivityKind::Fill;
  else
    out.kind = is_communication_kernel_name(out.name) ? ActivityKind::Comm : ActivityKind::Kernel;
  out.device = static_cast<int>(kernel.deviceId);
  out.stream = kernel.streamId;
  out.start_us = clock_.to_device_us(kernel.start);
  out.end_us = clock_.to_device_us(kernel.end);
  out.correlation = kernel.correlationId;
  const long long blocks = static_cast<long long>(kernel.gridX) * kernel.gridY * kernel.gridZ;
  out.grid_blocks = blocks > 0 && blocks <= INT32_MAX ? static_cast<int>(blocks) : 0;
  return out;
}

ActivityRecord ActivityConverter::from_memcpy(const CuptiMemcpyRecord& copy) const {
  ActivityRecord out;
  out.kind = ActivityKind::Memcpy;
  out.name = memcpy_kind_name(copy.copyKind);
  out.device = static_cast<int>(copy.deviceId);
  out.stream = copy.streamId;
  out.start_us = clock_.to_device_us(copy.start);
  out.end_us = clock_.to_device_us(copy.end);
  out.bytes = copy.bytes;
  out.correlation = copy.correlationId;
  return out;
}

ActivityRecord ActivityConverter::from_memset(const CuptiMemsetRecord& set) const {
  ActivityRecord out;
  out.kind = ActivityKind::Memset;
  out.name = "Memset";
  out.device = static_cast<int>(set.deviceId);
  out.stream = set.streamId;
  out.start_us = clock_.to_device_us(set.start);
  out.end_us = clock_.to_device_us(set.end);
  out.bytes = set.bytes;
  out.correlation = set.correlationId;
  return out;
}

bool ActivityConverter::from_memory(const CuptiMemoryRecord& memory, ActivityRecord* out) const {
  ActivityRecord record;
  switch (memory.memoryOperationType) {
    case CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION:
      record.kind = ActivityKind::MemoryAlloc;
      record.name = "Memory alloc";
      break;
    case CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE:
      record.kind = ActivityKind::MemoryFree;
      record.name = "Memory free";
      break;
    default:
      return false;
  }
  record.device = static_cast<int>(memory.deviceId);
  record.stream = memory.streamId;
  record.start_us = record.end_us = clock_.to_device_us(memory.timestamp);
  record.bytes = memory.bytes;
  record.correlation = memory.correlationId;
  *out = std::move(record);
  return true;
}

bool ActivityConverter::convert(const CUpti_Activity& record, ActivityRecord* out) const {
  switch (record.kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto& kernel = reinterpret_cast<const CuptiKernelRecord&>(record);
      if (kernel.name == nullptr || kernel.end < kernel.start) return false;
      *out = from_kernel(kernel);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto& copy = reinterpret_cast<const CuptiMemcpyRecord&>(record);
      if (copy.end < copy.start) return false;
      *out = from_memcpy(copy);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto& set = reinterpret_cast<const CuptiMemsetRecord&>(record);
      if (set.end < set.start) return false;
      *out = from_memset(set);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMORY2:
      return from_memory(reinterpret_cast<const CuptiMemoryRecord&>(record), out);
    default:
      return false;
  }
}

}  // namespace pipefill::cuda
