// The engine tests' usual run: the example engine on the simulated transport, 4 stages, 1F1B,
// 8 micro-batches, MLP inference fill (outputs not kept), 6 iterations of which the first 2 (the
// predictor's history) are not counted. Each test changes what it studies from there.
#pragma once

#include "../../examples/pipeline_engine/engine.hpp"

namespace engine_tests {

inline engine::EngineOptions four_stage_sim_options() {
  engine::EngineOptions o;
  o.transport = "sim";
  o.iterations = 6;
  o.warm_iterations = 2;
  o.pipeline.stages = 4;
  o.pipeline.microbatches = 8;
  o.fill = "mlp";
  o.keep_every = 0;
  return o;
}

}  // namespace engine_tests
