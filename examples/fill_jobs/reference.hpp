// CPU reference implementations of the example fill jobs' math: an MLP and a transformer
// encoder layer for batch inference, and a small regression MLP trained with SGD.
//
// Everything here is deterministic: weights and inputs come from a seeded splitmix64 generator
// keyed by (seed, item), and every loop runs in a fixed order, so the same item gives
// bit-identical results in every run. That is what lets the simulated fill jobs compute each
// item's real result on the CPU and lets tests check outputs and exact resumption.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fill_jobs {

// splitmix64: tiny, seedable, identical everywhere (no dependency on <random>'s distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64();
  // Uniform in [-scale, scale).
  float uniform(float scale);

 private:
  uint64_t state_;
};

// Mixes a job seed and an item index into an independent stream seed.
uint64_t item_seed(uint64_t seed, uint64_t item);

float gelu(float x);  // tanh approximation (what GPT-2/BERT kernels use)

// ---- MLP inference: y = W2 * gelu(W1 * x + b1) + b2, `rows` input rows per item --------------
struct MlpShape {
  int input = 256;
  int hidden = 1024;
  int output = 256;
  int rows = 4;  // rows (samples) per item
};

struct MlpWeights {
  MlpShape shape;
  std::vector<float> w1, b1;  // hidden x input (row-major), hidden
  std::vector<float> w2, b2;  // output x hidden, output
  static MlpWeights random(const MlpShape& shape, uint64_t seed);
};

bool valid_shape(const MlpShape& shape);
double mlp_flops_per_item(const MlpShape& shape);
// The item's input rows (rows x input), a pure function of (seed, item).
void mlp_item_input(const MlpShape& shape, uint64_t seed, uint64_t item, float* x);
// y (rows x output); hidden_scratch holds rows x hidden floats.
void mlp_forward(const MlpWeights& weights, const float* x, int rows, float* y,
                 float* hidden_scratch);

// ---- Transformer encoder layer (pre-LayerNorm), one sequence per item ----------------------
//   h = x + Wo * Attention(LN1(x)),  y = h + W2 * gelu(W1 * LN2(h) + b1) + b2
struct EncoderShape {
  int hidden = 128;
  int heads = 4;
  int ffn = 512;
  int seq = 32;
};

struct EncoderWeights {
  EncoderShape shape;
  std::vector<float> wq, wk, wv, wo;  // hidden x hidden each
  std::vector<float> bq, bk, bv, bo;  // hidden each
  std::vector<float> ln1_gain, ln1_bias, ln2_gain, ln2_bias;  // hidden each
  std::vector<float> w1, b1;  // ffn x hidden, ffn
  std::vector<float> w2, b2;  // hidden x ffn, hidden
  static EncoderWeights random(const EncoderShape& shape, uint64_t seed);
};

bool valid_shape(const EncoderShape& shape);
double encoder_flops_per_item(const EncoderShape& shape);
void encoder_item_input(const EncoderShape& shape, uint64_t seed, uint64_t item, float* x);
// Scratch sized for one sequence; reuse it across items (no allocation per item).
struct EncoderScratch {
  explicit EncoderScratch(const EncoderShape& shape);
  std::vector<float> normed, q, k, v, attention, scores, hidden_state, ffn;
};
// x and y: seq x hidden.
void encoder_forward(const EncoderWeights& weights, const float* x, float* y,
                     EncoderScratch& scratch);

// ---- A small training job: 2-layer tanh MLP regressing a fixed random teacher -----------------
// Item i = one SGD step on mini-batch i (inputs and teacher targets from (seed, i)). Steps must
// run in order; the state after k steps is a pure function of (seed, k), so a job interrupted
// at any item boundary resumes exactly.
struct TrainerShape {
  int input = 32;
  int hidden = 64;
  int output = 4;
  int batch = 32;
  float learning_rate = 0.05f;
};

bool valid_shape(const TrainerShape& shape);
double trainer_flops_per_item(const TrainerShape& shape);

class RegressionTrainer {
 public:
  RegressionTrainer(const TrainerShape& shape, uint64_t seed);

  // One SGD step on mini-batch `step`; returns that batch's loss before the update (MSE).
  float step(uint64_t step);
  // Loss of the current parameters on mini-batch `step` (forward only).
  float batch_loss(uint64_t step) const;
  // Loss on a fixed held-out batch (does not change the parameters).
  float evaluation_loss() const;

  const TrainerShape& shape() const { return shape_; }
  // All parameters flattened in a fixed order (w1, b1, w2, b2): compare runs bit for bit.
  std::vector<float> parameters() const;
  // Loads parameters in the same layout (e.g. read back from a GPU); false on a size mismatch.
  bool set_parameters(const std::vector<float>& parameters);

  // The fixed teacher (output x input) the targets come from: tanh(teacher * x).
  const std::vector<float>& teacher() const { return teacher_; }
  uint64_t seed() const { return seed_; }

  // Mini-batch `step`: x (batch x input) and teacher targets (batch x output).
  void batch(uint64_t step, float* x, float* target) const;

 private:
  void forward(const float* x, int rows, float* hidden, float* y) const;

  TrainerShape shape_;
  uint64_t seed_;
  std::vector<float> w1_, b1_, w2_, b2_;  // hidden x input, hidden, output x hidden, output
  std::vector<float> teacher_;            // output x input
  // Per-step scratch, allocated once.
  std::vector<float> x_, target_, hidden_, y_, grad_y_, grad_hidden_;
};

}  // namespace fill_jobs
