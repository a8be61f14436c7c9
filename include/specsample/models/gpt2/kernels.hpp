#pragma once
/// @file kernels.hpp
/// GPT-2 forward kernels for CPU (llm.c style free functions) with plain `*_reference` twins. The
/// matmuls run the run-time dispatched micro-kernels of simd.hpp (generic / AVX2 / AVX-512, F32,
/// F16 or BF16 weights); work is split over the persistent pool of thread_pool.hpp.
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
#include <specsample/models/gpt2/simd.hpp>
#include <specsample/models/gpt2/thread_pool.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

namespace specsample::gpt2 {

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

/// `embed` with the token embedding packed in its storage precision (converted exactly; INT8
/// quads as `simd::packed_value`: each integer times its token's scale).
inline void embed(std::span<float> out,             // (T, C)
                  std::span<const token> tokens,    // (T)
                  const weight_view& wte,           // (V, C)
                  std::span<const float> wpe,       // (P, C)
                  std::size_t pos0, std::size_t C) {
  const std::size_t T = tokens.size();
  assert(out.size() >= T * C && wpe.size() >= (pos0 + T) * C && wte.cols == C);
  for (std::size_t t = 0; t < T; ++t) {
    const auto id = static_cast<std::size_t>(tokens[t]);
    assert(id < wte.rows);
    float* y = out.data() + t * C;
    for (std::size_t c = 0; c < C; ++c) y[c] = simd::packed_value(wte, id, c);
    const float* p = wpe.data() + (pos0 + t) * C;
    for (std::size_t c = 0; c < C; ++c) y[c] += p[c];
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

/// out[t] = (inp[t] − mean) / sqrt(var + eps) · weight + bias, per row (biased variance, two-pass;
/// `simd::layer_norm_row` with the kernels of `level`).
inline void layer_norm(std::span<float> out,           // (T, C)
                       std::span<const float> inp,     // (T, C)
                       std::span<const float> weight,  // (C)
                       std::span<const float> bias,    // (C)
                       std::size_t T, std::size_t C, float eps, isa level = isa::best) {
  assert(out.size() >= T * C && inp.size() >= T * C && weight.size() >= C && bias.size() >= C);
  const isa lv = simd::resolve(level);
  for (std::size_t t = 0; t < T; ++t) {
    simd::layer_norm_row(lv, out.data() + t * C, inp.data() + t * C, weight.data(), bias.data(), C, eps);
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

/// The rows of a BF16 or INT8 matmul's input as the kernels multiply them (`matmul`).
struct matmul_operands {
  std::vector<std::uint16_t> bf16;  ///< (T, C rounded up to even): `simd::bf16_operands`
  std::vector<std::uint8_t> i8;     ///< (T, C rounded up to a multiple of 4): `simd::i8_operands`
  std::vector<float> i8_scales;     ///< (T): the INT8 rows' scales

  /// Sizes the buffers for T rows of up to K columns of a matmul over weights of `format`.
  void reserve(weight_format format, std::size_t T, std::size_t K) {
    const std::size_t n = T * simd::packed_cols(format, K);
    if (format == weight_format::bf16_pairs && bf16.size() < n) bf16.resize(n);
    if (format == weight_format::i8_quads && i8.size() < n) i8.resize(n);
    if (format == weight_format::i8_quads && i8_scales.size() < T) i8_scales.resize(T);
  }
};

/// What `matmul` applies to each output after the bias.
enum class activation : std::uint8_t {
  none,
  gelu,  ///< `gelu`, elementwise: the same bits as calling it on the matmul's output afterwards
};

/// out[t, o] = act(inp[t] · weight[o] + bias[o]) (no bias when `bias` is empty). The weight is
/// (OC, C) in F32, F16, BF16, BF16 pairs or INT8 quads, packed in panels of 64 output channels (simd.hpp; HF Conv1D's
/// [C, OC] and wte (V, C) are packed at load). A kernel streams one panel and applies every
/// weight vector to a register tile of up to 6 rows (AVX-512), so the weights are read from
/// memory once per tile of rows (once per call up to 6 rows; up to 12 for `weight_view::streamed`
/// weights, whose tiles share each block of a panel; the AVX2 kernels always do). Panels are split
/// across the pool; every output element is accumulated sequentially in k in one vector lane, so
/// neither T, the row's place in the batch nor the split changes any result bit (INT8 quads sum
/// integers, exactly). `level` picks the kernels (capped at the CPU's). `act` runs on each
/// chunk's outputs as soon as the chunk's panels are done, on the thread that computed them (the
/// MLP's GELU: split with the matmul, its inputs still in that thread's cache).
///
/// With `bf16_pairs` weights (`matmul_precision::bf16`) the rows of inp are first rounded to
/// BF16 (`simd::bf16_operands`), with `i8_quads` weights (`matmul_precision::int8`) quantised to
/// INT8 (`simd::i8_operands`), into `operands` (grown when too small: an allocation; a buffer of
/// the call's own when null), and multiplied as such.
inline void matmul(std::span<float> out,          // (T, OC)
                   std::span<const float> inp,    // (T, C)
                   const weight_view& weight,     // (OC, C) packed
                   std::span<const float> bias,   // (OC) or empty
                   std::size_t T, std::size_t C, std::size_t OC, thread_pool* pool = nullptr,
                   isa level = isa::best, matmul_operands* operands = nullptr,
                   activation act = activation::none) {
  assert(out.size() >= T * OC && inp.size() >= T * C);
  assert(weight.rows == OC && weight.cols == C);
  assert(bias.empty() || bias.size() >= OC);
  if (T == 0 || OC == 0) return;
  const isa lv = simd::resolve(level);
  simd::matmul_args a{out.data(), OC, inp.data(), C, T, C, OC, weight.data,
                      bias.empty() ? nullptr : bias.data()};
  a.streamed = weight.streamed;
  a.tiles = weight.tiles && lv == isa::avx512 && simd::has_amx();
  matmul_operands own;
  matmul_operands& ops = operands != nullptr ? *operands : own;
  ops.reserve(weight.format, T, C);
  const std::size_t ld = simd::packed_cols(weight.format, C);
  if (weight.format == weight_format::bf16_pairs) {
    simd::bf16_operands(lv, inp.data(), C, T, C, ops.bf16.data(), ld);
    a.xh = ops.bf16.data();
    a.ldxh = ld;
  } else if (weight.format == weight_format::i8_quads) {
    simd::i8_operands(lv, inp.data(), C, T, C, ops.i8.data(), ld, ops.i8_scales.data());
    a.xq = ops.i8.data();
    a.ldxq = ld;
    a.xs = ops.i8_scales.data();
  }
  detail::split(pool, simd::panels(OC), [&](std::size_t begin, std::size_t end, std::size_t) {
    simd::matmul_panels(lv, weight.format, a, begin, end);
    if (act == activation::gelu) {  // on the panels this thread just wrote, while they are in its cache
      const std::size_t o0 = begin * simd::panel, o1 = std::min(OC, end * simd::panel);
      for (std::size_t t = 0; t < T; ++t) simd::gelu(lv, out.data() + t * OC + o0, out.data() + t * OC + o0, o1 - o0);
    }
  });
}

/// `matmul` with F32 weights given row-major (OC, C) as a span: packs them into a temporary
/// first (allocates; for tests and tools, the model keeps its weights packed).
inline void matmul(std::span<float> out, std::span<const float> inp,
                   std::span<const float> weight,  // (OC, C) row-major
                   std::span<const float> bias, std::size_t T, std::size_t C, std::size_t OC,
                   thread_pool* pool = nullptr, isa level = isa::best) {
  assert(weight.size() >= OC * C);
  std::vector<float> packed(simd::panels(OC) * C * simd::panel);
  simd::pack_rows(weight.data(), packed.data(), OC, C, sizeof(float));
  matmul(out, inp, weight_view{packed.data(), weight_format::f32, OC, C}, bias, T, C, OC, pool,
         level);
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
/// alias inp. The SIMD paths evaluate the same function as x / (1 + exp(−2u)) with a vector exp
/// (simd.hpp); every element goes through the same instructions wherever it is in the buffer.
inline void gelu(std::span<float> out, std::span<const float> inp, isa level = isa::best) {
  assert(out.size() >= inp.size());
  simd::gelu(simd::resolve(level), out.data(), inp.data(), inp.size());
}

/// Plain twin of `gelu` (double).
inline void gelu_reference(std::span<float> out, std::span<const float> inp) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (std::size_t i = 0; i < inp.size(); ++i) {
    const double x = inp[i];
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x))));
  }
}

/// x = exp(x − max x) / Σ exp(x − max x), in place over one row (simd::softmax_row: the
/// attention's softmax, with the kernels of `level`).
inline void softmax(std::span<float> x, isa level = isa::best) {
  simd::softmax_row(simd::resolve(level), x.data(), x.size());
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

/// Elements of one layer's key cache (and of its value cache) for `P` positions: per head,
/// `simd::key_cache_blocks(P)` blocks of (HS, 16) keys, the layout of `simd::key_offset`.
[[nodiscard]] constexpr std::size_t kv_layer_size(std::size_t P, std::size_t C, std::size_t NH) noexcept {
  return NH * simd::key_cache_blocks(P) * simd::key_block * (C / NH);
}

/// Stores the keys and values of T new positions (columns [C, 2C) and [2C, 3C) of each qkv row)
/// in rows [pos0, pos0 + T) of one layer's caches, held in F: F32 (copied) or F16 (rounded to
/// nearest even, like `simd::narrow`: from magnitude 65520 on a key or value becomes ±inf, which
/// `model::append` refuses to store). Every head, or only head `only` (< NH) when given.
template <weight_format F = weight_format::f32>
void store_kv(std::span<weight_t<F>> k_cache,  // kv_layer_size(P, C, NH)
              std::span<weight_t<F>> v_cache,  // kv_layer_size(P, C, NH)
              std::span<const float> qkv,      // (T, 3C)
              std::size_t pos0, std::size_t T, std::size_t C, std::size_t NH, std::size_t P,
              std::optional<std::size_t> only = std::nullopt) {
  static_assert(F == weight_format::f32 || F == weight_format::f16, "the KV cache is F32 or F16");
  const std::size_t HS = C / NH, head = kv_layer_size(P, C, NH) / NH;
  assert(pos0 + T <= P && k_cache.size() >= NH * head && v_cache.size() >= NH * head);
  assert(!only || *only < NH);
  // Value rows are contiguous: written (narrowed) in place. Keys are scattered into their blocks
  // channel by channel, a channel's new positions one after another (they share a cache line of
  // the block; position by position, a cold 5-token store into the bundled target's six layers
  // took 34–45 µs against 30–40, alternating runs): F32 straight from qkv, F16 through a buffer of
  // up to `chunk` narrowed keys (nt positions × nd channels).
  const auto put = [](const float* src, std::size_t n, weight_t<F>* dst) {
    if constexpr (F == weight_format::f32) {
      std::copy_n(src, n, dst);
    } else {
      simd::narrow(F, src, n, dst);
    }
  };
  constexpr std::size_t chunk = 256;
  constexpr bool direct = F == weight_format::f32;
  weight_t<F> buf[direct ? 1 : chunk];
  const std::size_t dd = direct ? HS : std::min(HS, chunk), tt = direct ? T : std::max<std::size_t>(1, chunk / dd);
  const std::size_t ld = 3 * C;
  const std::size_t h0 = only.value_or(0), h1 = only ? *only + 1 : NH;
  for (std::size_t h = h0; h < h1; ++h) {
    weight_t<F>* kh = k_cache.data() + h * head;
    for (std::size_t t0 = 0; t0 < T; t0 += tt) {
      const std::size_t nt = std::min(tt, T - t0);
      for (std::size_t d0 = 0; d0 < HS; d0 += dd) {
        const std::size_t nd = std::min(dd, HS - d0);
        const float* src = qkv.data() + t0 * ld + C + h * HS + d0;  // key (t0 + i, d0 + d) at src[i·ld + d]
        if constexpr (!direct) {
          for (std::size_t i = 0; i < nt; ++i) put(src + i * ld, nd, buf + i * nd);
        }
        for (std::size_t d = 0; d < nd; ++d) {
          for (std::size_t i = 0; i < nt; ++i) {
            weight_t<F>& k = kh[simd::key_offset(pos0 + t0 + i, d0 + d, HS)];
            if constexpr (direct) {
              k = src[i * ld + d];
            } else {
              k = buf[i * nd + d];
            }
          }
        }
      }
    }
    for (std::size_t t = 0; t < T; ++t) {
      put(qkv.data() + t * ld + 2 * C + h * HS, HS, v_cache.data() + h * head + (pos0 + t) * HS);
    }
  }
}

/// Floats of attention scratch per pool worker: scores of one group of queries.
[[nodiscard]] constexpr std::size_t attention_scratch(std::size_t P) noexcept {
  return simd::query_group * P;
}

/// Causal multi-head attention of the last n of T new positions over one layer's KV cache: first
/// stores the T positions' keys and values (`store_kv`: qkv's rows, at [pos0, pos0 + T)), then
/// position pos0 + T − n + i attends to positions [0, pos0 + T − n + i] (n = 0: only the store).
/// Per head the keys are transposed 16-key blocks and the values (P, HS) rows (simd.hpp,
/// "attention layout"): one contiguous block per head, a score per vector lane. Scores are scaled
/// by 1/√HS. `scratch` holds `attention_scratch(P)` floats per pool worker. The work is split
/// across the pool in (head, group) tasks, the n queries cut into the fewest groups of at most
/// `simd::query_group` queries, of sizes differing by at most one; `simd::attend` runs a group as
/// tiles of at most `simd::query_tile` queries that share every key and value load, their passes
/// interleaved. Where a head's queries form one group (n ≤ `simd::query_group`: every
/// verification of up to 17 drafts), its task stores the head's keys and values first, on the
/// thread that then reads them (measured: docs/gpt2.md, "Threads"); otherwise every head is
/// stored before the split. Each query's scores and outputs are computed by one
/// fixed-order sequence, so results do not depend on T, n, the grouping, the tiling or the split.
/// While a worker computes a head, it prefetches the keys and values of its next one
/// (`simd::prefetch_stream`).
template <weight_format F = weight_format::f32>
void attention(std::span<float> out,            // (n, C)
               std::span<const float> qkv,      // (T, 3C): q | k | v per row
               std::span<weight_t<F>> k_cache,  // kv_layer_size(P, C, NH), F32 or F16
               std::span<weight_t<F>> v_cache,  // kv_layer_size(P, C, NH)
               std::span<float> scratch,        // (workers, attention_scratch(P))
               std::size_t pos0, std::size_t T, std::size_t n, std::size_t C, std::size_t NH, std::size_t P,
               thread_pool* pool = nullptr, isa level = isa::best) {
  const std::size_t HS = C / NH, head = kv_layer_size(P, C, NH) / NH;
  const std::size_t workers = pool != nullptr ? pool->size() : 1;
  const std::size_t stride = scratch.size() / workers, ldatt = stride / simd::query_group;
  assert(n <= T && ldatt >= pos0 + T && out.size() >= n * C && qkv.size() >= T * 3 * C);
  assert(pos0 + T <= P && k_cache.size() >= NH * head && v_cache.size() >= NH * head);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const isa lv = simd::resolve(level);
  const std::size_t groups = (n + simd::query_group - 1) / simd::query_group;
  const std::size_t len = pos0 + T;     // positions the last query of a head reads
  const std::size_t q0 = pos0 + T - n;  // the first query's position
  const float* q = qkv.data() + (T - n) * 3 * C;
  if (groups != 1) store_kv<F>(k_cache, v_cache, qkv, pos0, T, C, NH, P);
  detail::split(pool, NH * groups, [&](std::size_t begin, std::size_t end, std::size_t worker) {
    float* att = scratch.data() + worker * stride;
    for (std::size_t task = begin; task < end; ++task) {
      const std::size_t h = task / groups, group = task % groups;
      const std::size_t t = group * n / groups, nq = (group + 1) * n / groups - t;
      if (groups == 1) store_kv<F>(k_cache, v_cache, qkv, pos0, T, C, NH, P, h);
      // The first group of a head (the one that reads it from memory) prefetches the keys and
      // values of the next head when this chunk of tasks runs it too, paced over its steps.
      simd::prefetch_stream ahead;
      if (group == 0 && (h + 1) * groups < end) {
        ahead = simd::prefetch_stream::of(k_cache.data() + (h + 1) * head,
                                          simd::key_elements(len, HS) * sizeof(weight_t<F>),
                                          v_cache.data() + (h + 1) * head, len * HS * sizeof(weight_t<F>))
                    .paced(simd::attend_steps(lv, nq, q0 + t + 1, HS));
      }
      simd::attend<F>(lv, q + t * 3 * C + h * HS, 3 * C, nq, k_cache.data() + h * head,
                      v_cache.data() + h * head, q0 + t + 1, HS, scale, att, ldatt, out.data() + t * C + h * HS,
                      C, ahead);
    }
  });
}

/// Plain twin of `attention` (double, no scratch, no threads) for all T queries, over caches that
/// already hold the T new positions' keys and values (`store_kv`).
template <weight_format F = weight_format::f32>
void attention_reference(std::span<float> out, std::span<const float> qkv,
                         std::span<const weight_t<F>> k_cache, std::span<const weight_t<F>> v_cache,
                         std::size_t pos0, std::size_t T, std::size_t C, std::size_t NH, std::size_t P) {
  const std::size_t HS = C / NH, head = kv_layer_size(P, C, NH) / NH;
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
               static_cast<double>(simd::load_scalar<F>(k_cache.data(), h * head + simd::key_offset(p, d, HS)));
        }
        att[p] = s * scale;
        mx = std::max(mx, att[p]);
      }
      double z = 0;
      for (std::size_t p = 0; p < len; ++p) z += (att[p] = std::exp(att[p] - mx));
      for (std::size_t d = 0; d < HS; ++d) {
        double o = 0;
        for (std::size_t p = 0; p < len; ++p) {
          o += att[p] / z * simd::load_scalar<F>(v_cache.data(), h * head + p * HS + d);
        }
        out[t * C + h * HS + d] = static_cast<float>(o);
      }
    }
  }
}

}  // namespace kernels
}  // namespace specsample::gpt2
