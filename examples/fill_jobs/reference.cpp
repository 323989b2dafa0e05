#include "reference.hpp"

#include <algorithm>
#include <cmath>

namespace fill_jobs {

uint64_t Rng::next_u64() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float Rng::uniform(float scale) {
  // 24 random bits -> [0,1): exactly representable in float, so no platform rounding.
  const float unit = static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f);
  return (2.0f * unit - 1.0f) * scale;
}

uint64_t item_seed(uint64_t seed, uint64_t item) {
  Rng mixer(seed ^ (item * 0xD1B54A32D192ED03ull));
  return mixer.next_u64();
}

float gelu(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

namespace {

void fill_uniform(Rng& rng, std::vector<float>& v, size_t n, float scale) {
  v.resize(n);
  for (auto& x : v) x = rng.uniform(scale);
}

// y[r][o] = b[o] + sum_i w[o][i] * x[r][i]   (w: out x in, row-major)
void linear(const float* x, int rows, int in, const float* w, const float* b, int out,
            float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * in;
    for (int o = 0; o < out; ++o) {
      const float* wo = w + static_cast<size_t>(o) * in;
      float acc = b ? b[o] : 0.0f;
      for (int i = 0; i < in; ++i) acc += wo[i] * xr[i];
      y[static_cast<size_t>(r) * out + o] = acc;
    }
  }
}

void layer_norm(const float* x, int rows, int width, const float* gain, const float* bias,
                float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * width;
    float mean = 0.0f;
    for (int i = 0; i < width; ++i) mean += xr[i];
    mean /= static_cast<float>(width);
    float var = 0.0f;
    for (int i = 0; i < width; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<float>(width);
    const float inv = 1.0f / std::sqrt(var + 1e-5f);
    float* yr = y + static_cast<size_t>(r) * width;
    for (int i = 0; i < width; ++i) yr[i] = (xr[i] - mean) * inv * gain[i] + bias[i];
  }
}

}  // namespace

// ---- MLP ----------------------------------------------------------------------------------

bool valid_shape(const MlpShape& s) {
  return s.input > 0 && s.hidden > 0 && s.output > 0 && s.rows > 0;
}

double mlp_flops_per_item(const MlpShape& s) {
  return 2.0 * s.rows * (static_cast<double>(s.input) * s.hidden +
                         static_cast<double>(s.hidden) * s.output);
}

MlpWeights MlpWeights::random(const MlpShape& shape, uint64_t seed) {
  MlpWeights w;
  w.shape = shape;
  Rng rng(seed);
  // Scaled like Xavier so activations stay O(1) whatever the width.
  fill_uniform(rng, w.w1, static_cast<size_t>(shape.hidden) * shape.input,
               1.0f / std::sqrt(static_cast<float>(shape.input)));
  fill_uniform(rng, w.b1, shape.hidden, 0.1f);
  fill_uniform(rng, w.w2, static_cast<size_t>(shape.output) * shape.hidden,
               1.0f / std::sqrt(static_cast<float>(shape.hidden)));
  fill_uniform(rng, w.b2, shape.output, 0.1f);
  return w;
}

void mlp_item_input(const MlpShape& shape, uint64_t seed, uint64_t item, float* x) {
  Rng rng(item_seed(seed, item));
  const size_t n = static_cast<size_t>(shape.rows) * shape.input;
  for (size_t i = 0; i < n; ++i) x[i] = rng.uniform(1.0f);
}

void mlp_forward(const MlpWeights& w, const float* x, int rows, float* y, float* hidden) {
  const MlpShape& s = w.shape;
  linear(x, rows, s.input, w.w1.data(), w.b1.data(), s.hidden, hidden);
  const size_t n = static_cast<size_t>(rows) * s.hidden;
  for (size_t i = 0; i < n; ++i) hidden[i] = gelu(hidden[i]);
  linear(hidden, rows, s.hidden, w.w2.data(), w.b2.data(), s.output, y);
}

// ---- Encoder layer ------------------------------------------------------------------------

bool valid_shape(const EncoderShape& s) {
  return s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0 && s.ffn > 0 && s.seq > 0;
}

double encoder_flops_per_item(const EncoderShape& s) {
  const double h = s.hidden, f = s.ffn, n = s.seq;
  // QKV + output projections, attention scores and weighted sum, the two FFN GEMMs.
  return 2.0 * n * 4.0 * h * h + 2.0 * 2.0 * n * n * h + 2.0 * n * 2.0 * h * f;
}

EncoderWeights EncoderWeights::random(const EncoderShape& shape, uint64_t seed) {
  EncoderWeights w;
  w.shape = shape;
  Rng rng(seed);
  const size_t h = shape.hidden, f = shape.ffn;
  const float sh = 1.0f / std::sqrt(static_cast<float>(h));
  const float sf = 1.0f / std::sqrt(static_cast<float>(f));
  fill_uniform(rng, w.wq, h * h, sh);
  fill_uniform(rng, w.wk, h * h, sh);
  fill_uniform(rng, w.wv, h * h, sh);
  fill_uniform(rng, w.wo, h * h, sh);
  fill_uniform(rng, w.bq, h, 0.1f);
  fill_uniform(rng, w.bk, h, 0.1f);
  fill_uniform(rng, w.bv, h, 0.1f);
  fill_uniform(rng, w.bo, h, 0.1f);
  w.ln1_gain.assign(h, 1.0f);
  w.ln2_gain.assign(h, 1.0f);
  for (auto& g : w.ln1_gain) g += rng.uniform(0.1f);
  for (auto& g : w.ln2_gain) g += rng.uniform(0.1f);
  fill_uniform(rng, w.ln1_bias, h, 0.1f);
  fill_uniform(rng, w.ln2_bias, h, 0.1f);
  fill_uniform(rng, w.w1, f * h, sh);
  fill_uniform(rng, w.b1, f, 0.1f);
  fill_uniform(rng, w.w2, h * f, sf);
  fill_uniform(rng, w.b2, h, 0.1f);
  return w;
}

void encoder_item_input(const EncoderShape& shape, uint64_t seed, uint64_t item, float* x) {
  Rng rng(item_seed(seed, item));
  const size_t n = static_cast<size_t>(shape.seq) * shape.hidden;
  for (size_t i = 0; i < n; ++i) x[i] = rng.uniform(1.0f);
}

EncoderScratch::EncoderScratch(const EncoderShape& s) {
  const size_t nh = static_cast<size_t>(s.seq) * s.hidden;
  normed.resize(nh);
  q.resize(nh);
  k.resize(nh);
  v.resize(nh);
  attention.resize(nh);
  hidden_state.resize(nh);
  scores.resize(static_cast<size_t>(s.seq));
  ffn.resize(static_cast<size_t>(s.seq) * s.ffn);
}

void encoder_forward(const EncoderWeights& w, const float* x, float* y, EncoderScratch& t) {
  const EncoderShape& s = w.shape;
  const int n = s.seq, h = s.hidden, dh = s.hidden / s.heads;
  layer_norm(x, n, h, w.ln1_gain.data(), w.ln1_bias.data(), t.normed.data());
  linear(t.normed.data(), n, h, w.wq.data(), w.bq.data(), h, t.q.data());
  linear(t.normed.data(), n, h, w.wk.data(), w.bk.data(), h, t.k.data());
  linear(t.normed.data(), n, h, w.wv.data(), w.bv.data(), h, t.v.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int head = 0; head < s.heads; ++head) {
    const int off = head * dh;
    for (int i = 0; i < n; ++i) {
      const float* qi = t.q.data() + static_cast<size_t>(i) * h + off;
      float max_score = -INFINITY;
      for (int j = 0; j < n; ++j) {
        const float* kj = t.k.data() + static_cast<size_t>(j) * h + off;
        float dot = 0.0f;
        for (int d = 0; d < dh; ++d) dot += qi[d] * kj[d];
        t.scores[j] = dot * scale;
        max_score = std::fmax(max_score, t.scores[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < n; ++j) {
        t.scores[j] = std::exp(t.scores[j] - max_score);
        sum += t.scores[j];
      }
      float* out = t.attention.data() + static_cast<size_t>(i) * h + off;
      for (int d = 0; d < dh; ++d) out[d] = 0.0f;
      for (int j = 0; j < n; ++j) {
        const float p = t.scores[j] / sum;
        const float* vj = t.v.data() + static_cast<size_t>(j) * h + off;
        for (int d = 0; d < dh; ++d) out[d] += p * vj[d];
      }
    }
  }
  // h = x + Wo * attention + bo
  linear(t.attention.data(), n, h, w.wo.data(), w.bo.data(), h, t.hidden_state.data());
  const size_t nh = static_cast<size_t>(n) * h;
  for (size_t i = 0; i < nh; ++i) t.hidden_state[i] += x[i];
  layer_norm(t.hidden_state.data(), n, h, w.ln2_gain.data(), w.ln2_bias.data(), t.normed.data());
  linear(t.normed.data(), n, h, w.w1.data(), w.b1.data(), s.ffn, t.ffn.data());
  const size_t nf = static_cast<size_t>(n) * s.ffn;
  for (size_t i = 0; i < nf; ++i) t.ffn[i] = gelu(t.ffn[i]);
  linear(t.ffn.data(), n, s.ffn, w.w2.data(), w.b2.data(), h, y);
  for (size_t i = 0; i < nh; ++i) y[i] += t.hidden_state[i];
}

// ---- Trainer ------------------------------------------------------------------------------

bool valid_shape(const TrainerShape& s) {
  return s.input > 0 && s.hidden > 0 && s.output > 0 && s.batch > 0 && s.learning_rate > 0.0f &&
         std::isfinite(s.learning_rate);
}

double trainer_flops_per_item(const TrainerShape& s) {
  const double forward = 2.0 * s.batch *
                         (static_cast<double>(s.input) * s.hidden +
                          static_cast<double>(s.hidden) * s.output);
  return 3.0 * forward;  // forward + backward (2x) ; the SGD update is negligible
}

RegressionTrainer::RegressionTrainer(const TrainerShape& shape, uint64_t seed)
    : shape_(shape), seed_(seed) {
  Rng rng(seed);
  fill_uniform(rng, w1_, static_cast<size_t>(shape.hidden) * shape.input,
               1.0f / std::sqrt(static_cast<float>(shape.input)));
  b1_.assign(shape.hidden, 0.0f);
  fill_uniform(rng, w2_, static_cast<size_t>(shape.output) * shape.hidden,
               1.0f / std::sqrt(static_cast<float>(shape.hidden)));
  b2_.assign(shape.output, 0.0f);
  fill_uniform(rng, teacher_, static_cast<size_t>(shape.output) * shape.input,
               1.0f / std::sqrt(static_cast<float>(shape.input)));
  x_.resize(static_cast<size_t>(shape.batch) * shape.input);
  target_.resize(static_cast<size_t>(shape.batch) * shape.output);
  hidden_.resize(static_cast<size_t>(shape.batch) * shape.hidden);
  y_.resize(target_.size());
  grad_y_.resize(target_.size());
  grad_hidden_.resize(hidden_.size());
}

void RegressionTrainer::batch(uint64_t step, float* x, float* target) const {
  Rng rng(item_seed(seed_ ^ 0x5DEECE66Dull, step));
  const int n = shape_.batch;
  for (size_t i = 0; i < static_cast<size_t>(n) * shape_.input; ++i) x[i] = rng.uniform(1.0f);
  // A smooth nonlinear teacher the tanh student can fit: tanh(T x).
  linear(x, n, shape_.input, teacher_.data(), nullptr, shape_.output, target);
  for (size_t i = 0; i < static_cast<size_t>(n) * shape_.output; ++i)
    target[i] = std::tanh(target[i]);
}

void RegressionTrainer::forward(const float* x, int rows, float* hidden, float* y) const {
  linear(x, rows, shape_.input, w1_.data(), b1_.data(), shape_.hidden, hidden);
  for (size_t i = 0; i < static_cast<size_t>(rows) * shape_.hidden; ++i)
    hidden[i] = std::tanh(hidden[i]);
  linear(hidden, rows, shape_.hidden, w2_.data(), b2_.data(), shape_.output, y);
}

float RegressionTrainer::step(uint64_t step) {
  const int n = shape_.batch, in = shape_.input, hid = shape_.hidden, out = shape_.output;
  batch(step, x_.data(), target_.data());
  forward(x_.data(), n, hidden_.data(), y_.data());
  // MSE loss = mean over batch and outputs of (y - t)^2.
  const float norm = 1.0f / static_cast<float>(n * out);
  float loss = 0.0f;
  for (size_t i = 0; i < y_.size(); ++i) {
    const float d = y_[i] - target_[i];
    loss += d * d;
    grad_y_[i] = 2.0f * d * norm;
  }
  loss *= norm;
  // Backward: hidden gradient first (uses w2 before its update).
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < hid; ++j) {
      float acc = 0.0f;
      for (int o = 0; o < out; ++o)
        acc += grad_y_[static_cast<size_t>(r) * out + o] * w2_[static_cast<size_t>(o) * hid + j];
      const float hval = hidden_[static_cast<size_t>(r) * hid + j];
      grad_hidden_[static_cast<size_t>(r) * hid + j] = acc * (1.0f - hval * hval);
    }
  }
  const float lr = shape_.learning_rate;
  for (int o = 0; o < out; ++o) {
    float gb = 0.0f;
    for (int r = 0; r < n; ++r) gb += grad_y_[static_cast<size_t>(r) * out + o];
    b2_[o] -= lr * gb;
    for (int j = 0; j < hid; ++j) {
      float g = 0.0f;
      for (int r = 0; r < n; ++r)
        g += grad_y_[static_cast<size_t>(r) * out + o] * hidden_[static_cast<size_t>(r) * hid + j];
      w2_[static_cast<size_t>(o) * hid + j] -= lr * g;
    }
  }
  for (int j = 0; j < hid; ++j) {
    float gb = 0.0f;
    for (int r = 0; r < n; ++r) gb += grad_hidden_[static_cast<size_t>(r) * hid + j];
    b1_[j] -= lr * gb;
    for (int i = 0; i < in; ++i) {
      float g = 0.0f;
      for (int r = 0; r < n; ++r)
        g += grad_hidden_[static_cast<size_t>(r) * hid + j] * x_[static_cast<size_t>(r) * in + i];
      w1_[static_cast<size_t>(j) * in + i] -= lr * g;
    }
  }
  return loss;
}

float RegressionTrainer::batch_loss(uint64_t step) const {
  const int n = shape_.batch;
  std::vector<float> x(static_cast<size_t>(n) * shape_.input);
  std::vector<float> t(static_cast<size_t>(n) * shape_.output), y(t.size());
  std::vector<float> hidden(static_cast<size_t>(n) * shape_.hidden);
  batch(step, x.data(), t.data());
  forward(x.data(), n, hidden.data(), y.data());
  float loss = 0.0f;
  for (size_t i = 0; i < y.size(); ++i) loss += (y[i] - t[i]) * (y[i] - t[i]);
  return loss / static_cast<float>(y.size());
}

// Held-out batch: a step index no training run reaches.
float RegressionTrainer::evaluation_loss() const { return batch_loss(~uint64_t{0}); }

std::vector<float> RegressionTrainer::parameters() const {
  std::vector<float> all;
  all.reserve(w1_.size() + b1_.size() + w2_.size() + b2_.size());
  all.insert(all.end(), w1_.begin(), w1_.end());
  all.insert(all.end(), b1_.begin(), b1_.end());
  all.insert(all.end(), w2_.begin(), w2_.end());
  all.insert(all.end(), b2_.begin(), b2_.end());
  return all;
}

bool RegressionTrainer::set_parameters(const std::vector<float>& all) {
  if (all.size() != w1_.size() + b1_.size() + w2_.size() + b2_.size()) return false;
  auto it = all.begin();
  for (auto* part : {&w1_, &b1_, &w2_, &b2_}) {
    std::copy(it, it + static_cast<std::ptrdiff_t>(part->size()), part->begin());
    it += static_cast<std::ptrdiff_t>(part->size());
  }
  return true;
}

}  // namespace fill_jobs
