#include "event_query.hpp"

namespace pipefill::cuda {

EventState query_event_state(cudaEvent_t event, cudaError_t* error, const EventQueryApi& api) {
  const cudaError_t state = api.query(event);
  if (error) *error = state;
  if (state == cudaSuccess) return EventState::Complete;
  if (state == cudaErrorNotReady) {
    (void)api.get_last_error();  // NotReady is not an error: do not leave it for a launch check
    if (error) *error = cudaSuccess;
    return EventState::Pending;
  }
  return EventState::Failed;
}

}  // namespace pipefill::cuda
