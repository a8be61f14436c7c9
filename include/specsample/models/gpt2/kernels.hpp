#pragma once
/// @file kernels.hpp
/// GPT-2 forward kernels for CPU (llm.c style free functions) with plain `*_reference` twins, and
/// the small persistent thread pool the kernels split their work over.
///
/// Legend used in the shape comments:
///   T   positions processed in this call (the batch)     C   channels (n_embd)
///   OC  output channels of a matmul                      V   vocabulary size
///   P   maximum positions (n_positions, KV cache rows)   NH  heads, HS = C / NH head size
///   pos0  positions already in the KV cache before this batch
/// Every buffer is row-major and dense unless a comment says otherwise.
///
/// Batch invariance: every output element of every kernel is produced by one fixed-order loop
/// that depends only on that element's inputs, never on T, on the thread split or on the
/// address of the row. So a position's result is bitwise identical whether it is computed alone
/// or in a batch, and for every thread count. Keep it so when optimising (no -ffast-math).

#include <specsample/concepts.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <type_traits>
#include <vector>

namespace specsample::gpt2 {

/// A fixed set of worker threads (the caller is worker 0) that split a loop into contiguous
/// chunks. Persistent: no thread creation and no allocation per `parallel_for`.
class thread_pool {
 public:
  /// `threads` workers in total including the calling thread; 0 = hardware concurrency.
  explicit thread_pool(std::size_t threads) {
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    workers_.reserve(threads - 1);
    for (std::size_t id = 1; id < threads; ++id) {
      workers_.emplace_back([this, id] { run(id); });
    }
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  /// Number of workers, the calling thread included.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size() + 1; }

  /// Calls `f(begin, end, worker)` on disjoint contiguous chunks covering [0, n), one chunk per
  /// worker (fewer when n < size()), and returns when all are done. `f` must not throw.
  template <class F>
  void parallel_for(std::size_t n, F&& f) {
    const std::size_t w = std::min(size(), n);
    if (w <= 1) {
      if (n != 0) f(std::size_t{0}, n, std::size_t{0});
      return;
    }
    using fn_t = std::remove_reference_t<F>;
    {
      const std::lock_guard lock(mutex_);
      ctx_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
      call_ = [](void* ctx, std::size_t b, std::size_t e, std::size_t id) {
        (*static_cast<fn_t*>(ctx))(b, e, id);
      };
      n_ = n;
      active_ = w;
      remaining_ = w - 1;
      ++generation_;
    }
    wake_.notify_all();
    f(std::size_t{0}, n / w, std::size_t{0});
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return remaining_ == 0; });
  }

 private:
  void run(std::size_t id) {
    std::size_t seen = 0;
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= active_) continue;
      void* const ctx = ctx_;
      const auto call = call_;
      const std::size_t b = n_ * id / active_;
      const std::size_t e = n_ * (id + 1) / active_;
      lock.unlock();
      call(ctx, b, e, id);
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  bool stop_ = false;
  std::size_t generation_ = 0;
  std::size_t n_ = 0;
  std::size_t active_ = 0;
  std::size_t remaining_ = 0;
  void* ctx_ = nullptr;
  void (*call_)(void*, std::size_t, std::size_t, std::size_t) = nullptr;
};

namespace kernels {

namespace detail {
/// Runs `f(begin, end, worker)` over [0, n) on `pool`, or inline as worker 0 without one.
template <class F>
void split(thread_pool* pool, std::size_t n, F&& f) {
  if (pool != nullptr) {
    pool->parallel_for(n, f);
  } else if (n != 0) {
    f(std::size_t{0}, n, std::size_t{0});
  }
}
}  // namespace detail

// --- reductions -------------------------------------------------------------------------------

/// Σ a[i]·b[i] in a fixed order: 8 interleaved partial sums (vectorisable without reordering),
/// combined pairwise, then the tail. Depends only on n and the values, not on alignment.
[[nodiscard]] inline float dot(const float* a, const float* b, std::size_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail;
}

/// Plain sequential Σ a[i]·b[i] in double.
[[nodiscard]] inline double dot_reference(const float* a, const float* b, std::size_t n) noexcept {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

/// Σ a[i] in the same fixed order as `dot`.
[[nodiscard]] inline float sum(const float* a, std::size_t n) noexcept {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t j = 0; j < 8; ++j) acc[j] += a[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i];
  return (((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail;
}

// --- embedding --------------------------------------------------------------------------------

/// out[t] = wte[tokens[t]] + wpe[pos0 + t]. Token ids must be in [0, V) (the model checks).
inline void embed(std::span<float> out,             // (T, C)
                  std::span<const token> tokens,    // (T)
                  std::span<const float> wte,       // (V, C)
                  std::span<const float> wpe,       // (P, C)
                  std::size_t pos0, std::size_t C) {
  const std::size_t T = tokens.size();
  assert(out.size() >= T * C && wpe.size() >= (pos0 + T) * C);
  using row = Eigen::Map<Eigen::ArrayXf>;
  using crow = Eigen::Map<const Eigen::ArrayXf>;
  const auto c = static_cast<Eigen::Index>(C);
  for (std::size_t t = 0; t < T; ++t) {
    const auto id = static_cast<std::size_t>(tokens[t]);
    assert(id * C + C <= wte.size());
    row(out.data() + t * C, c) = crow(wte.data() + id * C, c) + crow(wpe.data() + (pos0 + t) * C, c);
  }
}

/// Plain twin of `embed`.
inline void embed_reference(std::span<float> out, std::span<const token> tokens,
                            std::span<const float> wte, std::span<const float> wpe,
                            std::size_t pos0, std::size_t C) {
  for (std::size_t t = 0; t < tokens.size(); ++t) {
    const auto id = static_cast<std::size_t>(tokens[t]);
    for (std::size_t c = 0; c < C; ++c) out[t * C + c] = wte[id * C + c] + wpe[(pos0 + t) * C + c];
  }
}

// --- layer norm -------------------------------------------------------------------------------

/// out[t] = (inp[t] − mean) / sqrt(var + eps) · weight + bias, per row (biased variance, two-pass).
inline void layer_norm(std::span<float> out,           // (T, C)
                       std::span<const float> inp,     // (T, C)
                       std::span<const float> weight,  // (C)
                       std::span<const float> bias,    // (C)
                       std::size_t T, std::size_t C, float eps) {
  assert(out.size() >= T * C && inp.size() >= T * C && weight.size() >= C && bias.size() >= C);
  const float inv_c = 1.0f / static_cast<float>(C);
  for (std::size_t t = 0; t < T; ++t) {
    const float* x = inp.data() + t * C;
    float* y = out.data() + t * C;
    const float mean = sum(x, C) * inv_c;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::size_t i = 0;
    for (; i + 8 <= C; i += 8) {
      for (std::size_t j = 0; j < 8; ++j) {
        const float d = x[i + j] - mean;
        acc[j] += d * d;
      }
    }
    float tail = 0;
    for (; i < C; ++i) tail += (x[i] - mean) * (x[i] - mean);
    const float var =
        ((((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))) +
         tail) *
        inv_c;
    const float rstd = 1.0f / std::sqrt(var + eps);
    for (std::size_t c = 0; c < C; ++c) y[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
  }
}

/// Plain twin of `layer_norm` (double accumulation).
inline void layer_norm_reference(std::span<float> out, std::span<const float> inp,
                                 std::span<const float> weight, std::span<const float> bias,
                                 std::size_t T, std::size_t C, float eps) {
  for (std::size_t t = 0; t < T; ++t) {
    double mean = 0;
    for (std::size_t c = 0; c < C; ++c) mean += inp[t * C + c];
    mean /= static_cast<double>(C);
    double var = 0;
    for (std::size_t c = 0; c < C; ++c) {
      const double d = inp[t * C + c] - mean;
      var += d * d;
    }
    var /= static_cast<double>(C);
    const double rstd = 1.0 / std::sqrt(var + static_cast<double>(eps));
    for (std::size_t c = 0; c < C; ++c) {
      out[t * C + c] = static_cast<float>((inp[t * C + c] - mean) * rstd * weight[c] + bias[c]);
    }
  }
}

// --- matmul -----------------------------------------------------------------------------------

/// out[t, o] = inp[t] · weight[o] + bias[o] (no bias when `bias` is empty). The weight is stored
/// (OC, C): each output is one contiguous dot product (HF Conv1D's [C, OC] is transposed at load,
/// wte (V, C) is used as is for the logits). Output channels are split across the pool; every
/// element is one `dot`, so neither T nor the split changes any result bit.
inline void matmul(std::span<float> out,           // (T, OC)
                   std::span<const float> inp,     // (T, C)
                   std::span<const float> weight,  // (OC, C)
                   std::span<const float> bias,    // (OC) or empty
                   std::size_t T, std::size_t C, std::size_t OC, thread_pool* pool = nullptr) {
  assert(out.size() >= T * OC && inp.size() >= T * C && weight.size() >= OC * C);
  assert(bias.empty() || bias.size() >= OC);
  const bool has_bias = !bias.empty();
  detail::split(pool, OC, [&](std::size_t begin, std::size_t end, std::size_t) {
    for (std::size_t o = begin; o < end; ++o) {
      const float* w = weight.data() + o * C;  // stays in L1 across the T rows
      const float b = has_bias ? bias[o] : 0.0f;
      for (std::size_t t = 0; t < T; ++t) {
        const float d = dot(inp.data() + t * C, w, C);
        out[t * OC + o] = has_bias ? d + b : d;
      }
    }
  });
}

/// Plain twin of `matmul` (double accumulation, no threads).
inline void matmul_reference(std::span<float> out, std::span<const float> inp,
                             std::span<const float> weight, std::span<const float> bias,
                             std::size_t T, std::size_t C, std::size_t OC) {
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t o = 0; o < OC; ++o) {
      double s = bias.empty() ? 0.0 : static_cast<double>(bias[o]);
      for (std::size_t c = 0; c < C; ++c) {
        s += static_cast<double>(inp[t * C + c]) * static_cast<double>(weight[o * C + c]);
      }
      out[t * OC + o] = static_cast<float>(s);
    }
  }
}

// --- activations ------------------------------------------------------------------------------

/// Tanh GELU ("gelu_new"): 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))), elementwise; out may
/// alias inp.
inline void gelu(std::span<float> out, std::span<const float> inp) {
  assert(out.size() >= inp.size());
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
  }
}

/// Plain twin of `gelu` (double).
inline void gelu_reference(std::span<float> out, std::span<const float> inp) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))));
  }
}

/// x = exp(x − max x) / Σ exp(x − max x), in place over one row (fixed-order sum).
inline void softmax(std::span<float> x) {
  if (x.empty()) return;
  float mx = x[0];
  for (const float v : x) mx = std::max(mx, v);
  for (float& v : x) v = std::exp(v - mx);
  const float inv = 1.0f / sum(x.data(), x.size());
  for (float& v : x) v *= inv;
}

/// Plain twin of `softmax` (double).
inline void softmax_reference(std::span<float> x) {
  if (x.empty()) return;
  double mx = x[0];
  for (const float v : x) mx = std::max(mx, static_cast<double>(v));
  double s = 0;
  for (const float v : x) s += std::exp(static_cast<double>(v) - mx);
  for (float& v : x) v = static_cast<float>(std::exp(static_cast<double>(v) - mx) / s);
}

/// x += y, elementwise (the residual stream).
inline void residual_add(std::span<float> x, std::span<const float> y) {
  assert(x.size() == y.size());
  const auto n = static_cast<Eigen::Index>(x.size());
  Eigen::Map<Eigen::ArrayXf>(x.data(), n) += Eigen::Map<const Eigen::ArrayXf>(y.data(), n);
}

/// Plain twin of `residual_add`.
inline void residual_add_reference(std::span<float> x, std::span<const float> y) {
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

// --- attention --------------------------------------------------------------------------------

/// Causal multi-head attention of T new positions over the KV cache. Position pos0 + t attends
/// to cache rows [0, pos0 + t]; the caller has already stored the new keys and values in rows
/// [pos0, pos0 + T). Scores are scaled by 1/√HS. `scratch` holds one row of P floats per pool
/// worker. (t, head) pairs are split across the pool.
inline void attention(std::span<float> out,             // (T, C)
                      std::span<const float> qkv,       // (T, 3C): q | k | v per row
                      std::span<const float> k_cache,   // (P, C)
                      std::span<const float> v_cache,   // (P, C)
                      std::span<float> scratch,         // (workers, P)
                      std::size_t pos0, std::size_t T, std::size_t C, std::size_t NH,
                      thread_pool* pool = nullptr) {
  const std::size_t HS = C / NH;
  const std::size_t workers = pool != nullptr ? pool->size() : 1;
  const std::size_t stride = scratch.size() / workers;
  assert(stride >= pos0 + T && out.size() >= T * C && qkv.size() >= T * 3 * C);
  assert(k_cache.size() >= (pos0 + T) * C && v_cache.size() >= (pos0 + T) * C);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  detail::split(pool, T * NH, [&](std::size_t begin, std::size_t end, std::size_t worker) {
    float* att = scratch.data() + worker * stride;
    for (std::size_t task = begin; task < end; ++task) {
      const std::size_t t = task / NH;
      const std::size_t h = task % NH;
      const std::size_t len = pos0 + t + 1;
      const float* q = qkv.data() + t * 3 * C + h * HS;
      for (std::size_t p = 0; p < len; ++p) {
        att[p] = dot(q, k_cache.data() + p * C + h * HS, HS) * scale;
      }
      softmax(std::span<float>(att, len));
      float* o = out.data() + t * C + h * HS;
      std::fill(o, o + HS, 0.0f);
      for (std::size_t p = 0; p < len; ++p) {
        const float a = att[p];
        const float* v = v_cache.data() + p * C + h * HS;
        for (std::size_t d = 0; d < HS; ++d) o[d] += a * v[d];
      }
    }
  });
}

/// Plain twin of `attention` (double, no scratch, no threads).
inline void attention_reference(std::span<float> out, std::span<const float> qkv,
                                std::span<const float> k_cache, std::span<const float> v_cache,
                                std::size_t pos0, std::size_t T, std::size_t C, std::size_t NH) {
  const std::size_t HS = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  std::vector<double> att(pos0 + T);
  for (std::size_t t = 0; t < T; ++t) {
    for (std::size_t h = 0; h < NH; ++h) {
      const std::size_t len = pos0 + t + 1;
      double mx = -INFINITY;
      for (std::size_t p = 0; p < len; ++p) {
        double s = 0;
        for (std::size_t d = 0; d < HS; ++d) {
          s += static_cast<double>(qkv[t * 3 * C + h * HS + d]) *
               static_cast<double>(k_cache[p * C + h * HS + d]);
        }
        att[p] = s * scale;
        mx = std::max(mx, att[p]);
      }
      double z = 0;
      for (std::size_t p = 0; p < len; ++p) z += (att[p] = std::exp(att[p] - mx));
      for (std::size_t d = 0; d < HS; ++d) {
        double o = 0;
        for (std::size_t p = 0; p < len; ++p) o += att[p] / z * v_cache[p * C + h * HS + d];
        out[t * C + h * HS + d] = static_cast<float>(o);
      }
    }
  }
}

}  // namespace kernels
}  // namespace specsample::gpt2
