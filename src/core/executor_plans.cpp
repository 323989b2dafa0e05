// The executor's planning inputs per bubble class: the margin (pfRuntimeSetClassMargin), the
// quantile its gated work is sized to (the gated quantile, or the noticed one while the class is
// closed early by pfBubbleCloseFill), the fill request for one bubble, and the plans the inline
// launch mode prepares for every class after each harvest.
#include <string>

#include <fmt/format.h>

#include "core/executor.hpp"

namespace pipefill::core {

double Executor::class_margin(const RuntimeState& s, const std::string& class_key) const {
  const auto it = s.class_margins.find(class_key);
  return it != s.class_margins.end() ? it->second : -1.0;
}

double Executor::gated_quantile(const RuntimeState& s, const std::string& class_key) const {
  return s.noticed_classes.count(class_key) != 0 ? options_.noticed_prediction_quantile
                                                 : options_.gated_prediction_quantile;
}

FillRequest Executor::request_for(RuntimeState& s, const std::string& class_key,
                                  double expected_us, std::string* why) {
  // Two quantiles of one history: the gate bounds a too-long prediction to one item of overrun,
  // so gated work is sized to the higher gated_prediction_quantile (the median by default);
  // nothing stops ungated work, so it keeps the conservative prediction_quantile.
  const BubblePrediction prediction = s.predictor.predict(class_key, gated_quantile(s, class_key));
  FillRequest request;
  request.margin_us = class_margin(s, class_key);
  const bool measured = prediction.ready && prediction.count > 0;
  if (measured) {
    request.gated_predicted_us = prediction.quantile_us;
    request.ungated_predicted_us =
        s.predictor.predict(class_key, options_.prediction_quantile).quantile_us;
  } else if (expected_us > 0) {
    // A hint is trusted for gated work only: the gate bounds a wrong hint to one item of
    // overrun, while ungated work sized from it could hold the SMs far past the bubble.
    request.gated_predicted_us = expected_us;
  }
  if (request.gated_predicted_us <= 0) {
    *why = fmt::format("class {} has {} of {} samples and no expected duration", class_key,
                       prediction.count, options_.min_samples);
  }
  return request;
}

void Executor::refresh_plans(RuntimeState& s) {
  if (options_.launch_mode != pfLaunchInline || !s.plans_dirty) return;
  s.plans_dirty = false;
  s.prepared_plans.clear();
  for (const std::string& key : s.predictor.class_keys()) {
    // The same two quantiles as request_for: gated work to the gated one, ungated to the low one.
    const BubblePrediction prediction = s.predictor.predict(key, gated_quantile(s, key));
    if (!prediction.ready || prediction.count == 0 || !(prediction.quantile_us > 0)) continue;
    PreparedPlan prepared;
    prepared.class_key = key;
    prepared.gated_predicted_us = prediction.quantile_us;
    prepared.ungated_predicted_us =
        s.predictor.predict(key, options_.prediction_quantile).quantile_us;
    FillRequest request;
    request.gated_predicted_us = prepared.gated_predicted_us;
    request.ungated_predicted_us = prepared.ungated_predicted_us;
    request.margin_us = class_margin(s, key);
    // Made before the bubble begins: nothing of it has gone yet (observed = none).
    prepared.plan = launcher_.plan(s, request, /*observed=*/nullptr);
    s.prepared_plans.push_back(std::move(prepared));
  }
}

}  // namespace pipefill::core
