#include "common/error.hpp"

#include "common/log.hpp"

namespace pipefill {
namespace {
thread_local std::string t_last_error;
}

pfResult_t set_error(pfResult_t code, std::string message) {
  if (code != pfSuccess) {
    log::debug("{}: {}", result_name(code), message);
    t_last_error = std::move(message);
  }
  return code;
}

const std::string& last_error_message() { return t_last_error; }
void clear_last_error() { t_last_error.clear(); }

const char* result_name(pfResult_t code) {
  switch (code) {
    case pfSuccess: return "pfSuccess";
    case pfErrorInvalidArgument: return "pfErrorInvalidArgument";
    case pfErrorInvalidState: return "pfErrorInvalidState";
    case pfErrorOutOfMemory: return "pfErrorOutOfMemory";
    case pfErrorNotSupported: return "pfErrorNotSupported";
    case pfErrorNoDevice: return "pfErrorNoDevice";
    case pfErrorCudaFailure: return "pfErrorCudaFailure";
    case pfErrorCuptiFailure: return "pfErrorCuptiFailure";
    case pfErrorNcclFailure: return "pfErrorNcclFailure";
    case pfErrorJobFailed: return "pfErrorJobFailed";
    case pfErrorCancelled: return "pfErrorCancelled";
    case pfErrorTimeout: return "pfErrorTimeout";
    case pfErrorBusy: return "pfErrorBusy";
    case pfErrorIo: return "pfErrorIo";
    case pfErrorInternal: return "pfErrorInternal";
    case pfResultCount: break;
  }
  return "pfErrorUnknown";
}

}  // namespace pipefill
