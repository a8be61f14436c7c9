// Micro-benchmarks of the GPT-2 kernels and of the sampling primitives (Google Benchmark).
//
//   build/bench/benchmarks/specsample_micro --benchmark_filter=append --benchmark_repetitions=5
//
// Shapes are shakespeare-target's (C = 384, 4C = 1536, V = 4096, 6 heads) unless stated. Matmul
// weights are F16 like the bundled checkpoints. Counters: `weight_GB/s` = weight bytes streamed per
// second (one pass over the weights per call, whatever T), `GB/s` = the bytes a probe or matmul
// reads per second (both in 10^9 bytes, as specsample-bench's figures: Google Benchmark's own
// bytes_per_second prints GiB/s as "G/s"), `tok/s` = positions per second. The
// machine probes (probes.hpp, shared with specsample-bench): the stream read sums a buffer
// allocated as weights are, with the widest vector loads the CPU has and the kernels' prefetch —
// its GB/s is the machine's bandwidth for that many bytes, the ceiling of a single-token decode;
// the FMA peak is register-only fused multiply-adds, the ceiling of a batched matmul.

#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "probes.hpp"

namespace gpt2 = specsample::gpt2;
using specsample::token;

namespace {

// `bytes` read per iteration, as decimal GB/s (SetBytesProcessed would print GiB/s as "G/s").
void set_gbs(benchmark::State& state, std::size_t bytes) {
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

const std::filesystem::path models_dir = std::filesystem::path(SPECSAMPLE_SOURCE_DIR) / "models";

std::vector<float> random_floats(std::size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

/// A random F16 (rows, cols) weight matrix.
gpt2::weight_matrix random_f16(std::size_t rows, std::size_t cols, unsigned seed) {
  const auto v = random_floats(rows * cols, 0.05f, seed);
  return gpt2::weight_matrix::from_floats(gpt2::weight_format::f16, rows, cols, v.data());
}

/// One pool per thread count, shared by the benchmarks (threads = 1: no pool).
gpt2::thread_pool* pool_for(std::size_t threads) {
  static std::map<std::size_t, std::unique_ptr<gpt2::thread_pool>> pools;
  if (threads <= 1) return nullptr;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<gpt2::thread_pool>(threads);
  return p.get();
}

// --- machine probes (probes.hpp) -----------------------------------------------------------------

/// Register-only fused multiply-adds with the kernels' vectors: this core's FMA peak.
void BM_fma_peak(benchmark::State& state) {
  const specsample_bench::fma_loop loop = specsample_bench::fma_loop_for(gpt2::simd::detected(), gpt2::matmul_precision::f32);
  constexpr std::size_t iters = 1u << 16;
  for (auto _ : state) benchmark::DoNotOptimize(loop.run(iters));
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(iters * loop.macs_per_iteration) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(gpt2::isa_name(gpt2::simd::detected()));
}
BENCHMARK(BM_fma_peak)->UseRealTime()->MinTime(0.3);

/// Reads a buffer of range(0) bytes (range(1) threads, each a contiguous share) per iteration.
void BM_stream_read(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<std::size_t>(state.range(1));
  const std::size_t n = bytes / sizeof(float) / 64 * 64;
  const specsample_bench::float_buffer buf(n);
  std::fill_n(buf.get(), n, 1.0f);
  gpt2::thread_pool* pool = pool_for(threads);
  const std::size_t chunks = n / 64;
  for (auto _ : state) {
    float total[8] = {};
    const auto body = [&](std::size_t b, std::size_t e, std::size_t w) {
      total[w] = specsample_bench::stream_sum(gpt2::simd::detected(), buf.get() + b * 64, (e - b) * 64);
    };
    if (pool != nullptr) {
      pool->parallel_for(chunks, body);
    } else {
      body(0, chunks, 0);
    }
    benchmark::DoNotOptimize(total);
  }
  set_gbs(state, n * sizeof(float));
  state.counters["MB"] = static_cast<double>(n * sizeof(float)) / 1e6;
}

/// Weight bytes of a single-token forward pass of a bundled model (the matmuls' weights), as the
/// model holds them when it multiplies in `precision`.
std::int64_t model_weight_bytes(const char* name, gpt2::matmul_precision precision = gpt2::matmul_precision::f32) {
  static std::map<std::pair<std::string, gpt2::matmul_precision>, std::int64_t> cache;
  const auto key = std::make_pair(std::string(name), precision);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto m = gpt2::model::load(models_dir / name, gpt2::options{.threads = 1, .matmul_precision = precision});
    it = cache.emplace(key, static_cast<std::int64_t>(m.weights().matmul_bytes())).first;
  }
  return it->second;
}

void stream_read_args(benchmark::internal::Benchmark* b) {
  for (const std::int64_t bytes : {model_weight_bytes("shakespeare-draft"),
                                   model_weight_bytes("shakespeare-target"),
                                   std::int64_t{256} << 20}) {
    for (const std::int64_t threads : {1, 2}) b->Args({bytes, threads});
  }
}
BENCHMARK(BM_stream_read)->Apply(stream_read_args)->UseRealTime()->MinTime(0.3);

/// Times `probe(level, tokens, p, n)` (probes.hpp: stream_fma, stream_dot) over a buffer of
/// `bytes`, as float_buffer allocates weights: the stream read with range(0) tokens' multiply-adds
/// beside it; `needs` says what the CPU lacks when the probe does not run (nullopt).
template <class Probe>
void time_stream_probe(benchmark::State& state, std::size_t bytes, Probe probe, const char* needs) {
  const int tokens = static_cast<int>(state.range(0));
  const std::size_t n = bytes / sizeof(float) / 64 * 64;
  const specsample_bench::float_buffer buf(n);
  std::fill_n(buf.get(), n, 1.0f);
  const gpt2::isa level = gpt2::simd::detected();
  if (!probe(level, tokens, buf.get(), n)) {
    state.SkipWithError(needs);
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(probe(level, tokens, buf.get(), n));
  set_gbs(state, n * sizeof(float));
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(n * sizeof(float) / 2 * static_cast<std::size_t>(tokens)) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(gpt2::isa_name(level));
}

/// range: tokens (0, 1, 5, 9). The streaming read over the bundled target's matmul bytes (F16 as
/// held) with a `tokens`-token call's F32 multiply-adds per weight on register chains beside it
/// (probes.hpp, `stream_fma`): 0 is the stream alone. It bounds BM_append_matmuls/n:tokens/precision:0:
/// how much of the call's multiply-adds this core can hide under the weight stream.
void BM_stream_fma(benchmark::State& state) {
  time_stream_probe(state, static_cast<std::size_t>(model_weight_bytes("shakespeare-target")),
                    specsample_bench::stream_fma, "needs the AVX2 or AVX-512 kernels");
}
BENCHMARK(BM_stream_fma)->ArgName("tokens")->Arg(0)->Arg(1)->Arg(5)->Arg(9)->UseRealTime()->MinTime(0.3);

/// range: tokens (0 to 6). The streaming read over the bundled target's matmul bytes as the
/// BF16 matmuls hold them (`matmul_precision::bf16`), with a `tokens`-token call's vdpbf16ps per
/// 256-byte step beside it, each row's activation pair broadcast from memory as the kernel does
/// (probes.hpp, `stream_dot`): 0 is the stream alone. It bounds
/// BM_append_matmuls/n:tokens/precision:1 as BM_stream_fma bounds the F32 matmuls. CPUs with
/// AVX512_BF16 only.
void BM_stream_dot(benchmark::State& state) {
  time_stream_probe(state, static_cast<std::size_t>(model_weight_bytes("shakespeare-target", gpt2::matmul_precision::bf16)),
                    specsample_bench::stream_dot, "needs the AVX-512 kernels and AVX512_BF16");
}
BENCHMARK(BM_stream_dot)->ArgName("tokens")->DenseRange(0, 6)->UseRealTime()->MinTime(0.3);

// --- kernels -------------------------------------------------------------------------------------

void BM_layer_norm(benchmark::State& state) {
  const auto T = static_cast<std::size_t>(state.range(0));
  const auto C = static_cast<std::size_t>(state.range(1));
  const auto x = random_floats(T * C, 1.0f, 1);
  const auto w = random_floats(C, 1.0f, 2);
  const auto b = random_floats(C, 1.0f, 3);
  std::vector<float> y(T * C);
  for (auto _ : state) {
    gpt2::kernels::layer_norm(y, x, w, b, T, C, 1e-5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(T));
}
BENCHMARK(BM_layer_norm)->ArgNames({"T", "C"})->ArgsProduct({{1, 5, 9}, {384}});

/// range: C, OC, T, threads, isa (0 generic, 1 avx2, 2 avx512 — capped at the CPU's).
void BM_matmul(benchmark::State& state) {
  const auto C = static_cast<std::size_t>(state.range(0));
  const auto OC = static_cast<std::size_t>(state.range(1));
  const auto T = static_cast<std::size_t>(state.range(2));
  const auto threads = static_cast<std::size_t>(state.range(3));
  const auto level = gpt2::simd::resolve(static_cast<gpt2::isa>(state.range(4)));
  const gpt2::weight_matrix w = random_f16(OC, C, 4);
  const auto x = random_floats(T * C, 1.0f, 5);
  const auto bias = random_floats(OC, 0.1f, 6);
  std::vector<float> out(T * OC);
  gpt2::thread_pool* pool = pool_for(threads);
  for (auto _ : state) {
    gpt2::kernels::matmul(out, x, w.view(), bias, T, C, OC, pool, level);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(gpt2::isa_name(level));
  set_gbs(state, w.bytes());
  state.counters["GMAC/s"] = benchmark::Counter(static_cast<double>(T * C * OC) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void matmul_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"C", "OC", "T", "threads", "isa"});
  const std::int64_t C = 384;
  for (const auto& [in, out] : {std::pair{C, 3 * C}, std::pair{C, 4 * C}, std::pair{4 * C, C},
                                std::pair{C, std::int64_t{4096}}}) {
    for (const std::int64_t T : {1, 5, 9}) {
      for (const std::int64_t threads : {1, 2}) b->Args({in, out, T, threads, 2});
    }
  }
  // The fallbacks at one shape (lm_head), single-threaded.
  for (const std::int64_t T : {1, 5}) {
    b->Args({C, 4096, T, 1, 1});
    b->Args({C, 4096, T, 1, 0});
  }
}
BENCHMARK(BM_matmul)->Apply(matmul_args)->UseRealTime();

/// range: context length, threads. One new position (T = 1), its key and value stored, over a KV
/// cache of that length.
void BM_attention(benchmark::State& state) {
  const auto len = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<std::size_t>(state.range(1));
  const std::size_t C = 384, NH = 6, P = 256;
  const auto qkv = random_floats(3 * C, 1.0f, 7);
  auto k = random_floats(gpt2::kernels::kv_layer_size(P, C, NH), 1.0f, 8);
  auto v = random_floats(gpt2::kernels::kv_layer_size(P, C, NH), 1.0f, 9);
  std::vector<float> out(C), scratch(threads * gpt2::kernels::attention_scratch(P));
  gpt2::thread_pool* pool = pool_for(threads);
  for (auto _ : state) {
    gpt2::kernels::attention(out, qkv, k, v, scratch, len - 1, 1, 1, C, NH, P, pool);
    benchmark::DoNotOptimize(out.data());
  }
}
BENCHMARK(BM_attention)
    ->ArgNames({"ctx", "threads"})
    ->ArgsProduct({{16, 128, 256}, {1, 2}})
    ->UseRealTime();

void BM_gelu(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  auto x = random_floats(n, 2.0f, 10);
  std::vector<float> y(n);
  for (auto _ : state) {
    gpt2::kernels::gelu(y, x);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
}
BENCHMARK(BM_gelu)->Arg(1536)->Arg(5 * 1536);

// --- the model -----------------------------------------------------------------------------------

/// Times `append` of n tokens to `m` after a 64-token prefix, truncating back each iteration,
/// with tok/s and the weights' GB/s as counters.
void time_appends(benchmark::State& state, gpt2::model& m, std::size_t n) {
  std::vector<token> tokens(64 + n);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token>(i * 37 % 4096);
  const std::size_t prefix = 64;
  (void)m.append(std::span<const token>(tokens).first(prefix));
  const auto next = std::span<const token>(tokens).subspan(prefix, n);
  for (auto _ : state) {
    const auto logits = m.append(next);
    benchmark::DoNotOptimize(logits.data());
    m.truncate(prefix);
  }
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(n),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(static_cast<double>(m.weights().matmul_bytes()) * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}

/// range: model (0 target, 1 draft, 2 distilled draft), n tokens, threads. The context holds a
/// 64-token prefix; each iteration appends n tokens and truncates back.
void BM_append(benchmark::State& state) {
  static const char* names[] = {"shakespeare-target", "shakespeare-draft",
                                "shakespeare-draft-distilled"};
  const char* name = names[state.range(0)];
  const auto threads = static_cast<std::size_t>(state.range(2));
  gpt2::model m = gpt2::model::load(models_dir / name, gpt2::options{.threads = threads});
  time_appends(state, m, static_cast<std::size_t>(state.range(1)));
  state.SetLabel(fmt::format("{} {}", name, gpt2::isa_name(m.kernels())));
}
BENCHMARK(BM_append)
    ->ArgNames({"model", "n", "threads"})
    ->ArgsProduct({{0, 1, 2}, {1, 2, 5, 9}, {1, 2}})
    ->UseRealTime()
    ->MinTime(0.3);

/// range: n tokens, precision (0 F32, 1 BF16: `options::matmul_precision`). The matmuls alone of
/// the bundled target's append of n tokens: its own weights (as the model holds them), in the
/// forward pass's order (every layer's QKV, attention projection, MLP up and down, then the
/// logits), on random inputs, without the attention, norms, GELU and KV-cache writes between them.
/// BM_append (BM_append_precision) over this is what the rest of the forward pass costs, and its
/// n-token / 1-token ratio is the matmuls' own share of a verification's cost.
void BM_append_matmuls(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto precision = static_cast<gpt2::matmul_precision>(state.range(1));
  const gpt2::model m = gpt2::model::load(models_dir / "shakespeare-target",
                                          gpt2::options{.threads = 1, .matmul_precision = precision});
  const gpt2::weights& w = m.weights();
  struct call {
    const gpt2::weight_matrix* weight;
    std::span<const float> bias;
  };
  std::vector<call> calls;
  const auto vec = [](const auto& a) { return std::span<const float>(a.data(), a.size()); };
  for (const gpt2::layer_weights& l : w.layers) {
    calls.push_back({&l.attn_qkv_weight, vec(l.attn_qkv_bias)});
    calls.push_back({&l.attn_proj_weight, vec(l.attn_proj_bias)});
    calls.push_back({&l.mlp_fc_weight, vec(l.mlp_fc_bias)});
    calls.push_back({&l.mlp_proj_weight, vec(l.mlp_proj_bias)});
  }
  calls.push_back({&w.output_embedding(), {}});
  std::size_t widest = 0;
  for (const call& c : calls) widest = std::max({widest, c.weight->rows(), c.weight->cols()});
  const auto x = random_floats(n * widest, 1.0f, 12);
  std::vector<float> out(n * widest);
  gpt2::kernels::matmul_operands operands;  // (BF16: the rounded activations, reused as the model does)
  // The views as the model's forward pass sets them: AMX tiles where it uses them, and the
  // streamed flag of weights above streamed_weight_bytes.
  const bool streamed = w.matmul_bytes() > gpt2::streamed_weight_bytes;
  for (auto _ : state) {
    for (const call& c : calls) {
      const std::size_t OC = c.weight->rows(), K = c.weight->cols();
      gpt2::weight_view v = c.weight->view();
      v.streamed = streamed;
      v.tiles = m.amx();
      gpt2::kernels::matmul(std::span<float>(out.data(), n * OC), std::span<const float>(x.data(), n * K), v, c.bias,
                            n, K, OC, nullptr, m.kernels(), &operands);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(fmt::format("shakespeare-target {}, {} matmuls", gpt2::isa_name(m.kernels()), gpt2::precision_name(precision)));
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(w.matmul_bytes()) * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_append_matmuls)
    ->ArgNames({"n", "precision"})
    ->ArgsProduct({{1, 2, 3, 4, 5, 6, 9}, {0, 1}})
    ->UseRealTime()
    ->MinTime(0.3);

/// range: storage (0 F32, 1 F16, 2 BF16: `options::weight_storage`), n tokens. The bundled
/// target (an F16 checkpoint) with its matmul weights held in each precision — F32 is how an F32
/// checkpoint such as the released gpt2 ones is held by default — after a 64-token prefix, as
/// BM_append.
void BM_append_storage(benchmark::State& state) {
  const auto storage = static_cast<gpt2::weight_format>(state.range(0));
  gpt2::model m = gpt2::model::load(models_dir / "shakespeare-target",
                                    gpt2::options{.threads = 1, .weight_storage = storage});
  time_appends(state, m, static_cast<std::size_t>(state.range(1)));
  state.SetLabel(fmt::format("{} MB of {} weights", m.weights().matmul_bytes() / 1000000,
                             gpt2::format_name(storage)));
}
BENCHMARK(BM_append_storage)
    ->ArgNames({"storage", "n"})
    ->ArgsProduct({{0, 1, 2}, {1, 5}})
    ->UseRealTime()
    ->MinTime(0.3);

/// range: precision (0 F32, 1 BF16, 2 INT8: `options::matmul_precision`), n tokens. The bundled target
/// multiplying in each precision after a 64-token prefix, as BM_append.
void BM_append_precision(benchmark::State& state) {
  const auto precision = static_cast<gpt2::matmul_precision>(state.range(0));
  gpt2::model m = gpt2::model::load(models_dir / "shakespeare-target",
                                    gpt2::options{.threads = 1, .matmul_precision = precision});
  time_appends(state, m, static_cast<std::size_t>(state.range(1)));
  state.SetLabel(fmt::format("{} matmuls{}", gpt2::precision_name(precision),
                             m.kernels() != gpt2::isa::avx512                  ? ""
                             : m.amx() && precision == gpt2::matmul_precision::int8 ? " (TDPBUSD from 4 rows, else vpdpbusd)"
                             : m.amx()                                          ? " (AMX tiles)"
                             : precision == gpt2::matmul_precision::bf16 && gpt2::simd::has_avx512_bf16() ? " (vdpbf16ps)"
                             : precision == gpt2::matmul_precision::int8 && gpt2::simd::has_avx512_vnni() ? " (vpdpbusd)"
                                                                                                          : ""));
}
BENCHMARK(BM_append_precision)
    ->ArgNames({"precision", "n"})
    ->ArgsProduct({{0, 1, 2}, {1, 2, 3, 5, 9}})
    ->UseRealTime()
    ->MinTime(0.3);

/// A 60-token prompt appended from an empty cache, with the logits of every position (logits:1,
/// `append(tokens)`) or of none (logits:0, `append(tokens, 0)`: what the sampling loops do to
/// prefill a prompt).
void BM_prefill(benchmark::State& state) {
  static const char* names[] = {"shakespeare-target", "shakespeare-draft",
                                "shakespeare-draft-distilled"};
  const char* name = names[state.range(0)];
  const bool logits = state.range(1) != 0;
  gpt2::model m = gpt2::model::load(models_dir / name, gpt2::options{.threads = 1});
  std::vector<token> prompt(60);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<token>(i * 37 % 4096);
  for (auto _ : state) {
    const auto out = logits ? m.append(prompt) : m.append(prompt, 0);
    benchmark::DoNotOptimize(out.data());
    m.truncate(0);
  }
  state.SetLabel(fmt::format("{} {}", name, gpt2::isa_name(m.kernels())));
}
BENCHMARK(BM_prefill)->ArgNames({"model", "logits"})->ArgsProduct({{0, 1, 2}, {0, 1}})->UseRealTime()->MinTime(0.3);

// --- sampling primitives -------------------------------------------------------------------------

/// range: vocabulary, temperature ×100, top_k, top_p ×100.
void BM_warp(benchmark::State& state) {
  const auto V = static_cast<std::size_t>(state.range(0));
  specsample::sampling_params p;
  p.temperature = static_cast<float>(state.range(1)) / 100.0f;
  p.top_k = static_cast<int>(state.range(2));
  p.top_p = static_cast<float>(state.range(3)) / 100.0f;
  specsample::logit_warper warp(p, V);
  const auto v = random_floats(V, 3.0f, 11);
  const Eigen::Map<const Eigen::VectorXf> logits(v.data(), static_cast<Eigen::Index>(V));
  Eigen::VectorXf probs(static_cast<Eigen::Index>(V));
  for (auto _ : state) {
    warp(logits, probs);
    benchmark::DoNotOptimize(probs.data());
  }
}
void warp_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"V", "temp100", "top_k", "top_p100"});
  for (const std::int64_t V : {4096, 50257}) {
    b->Args({V, 0, 0, 100});
    b->Args({V, 100, 0, 100});
    b->Args({V, 80, 50, 100});
    b->Args({V, 80, 0, 95});
    b->Args({V, 80, 50, 95});
  }
}
BENCHMARK(BM_warp)->Apply(warp_args);

/// Random draft distributions q (V, K) and target distributions p (V, K + 1), columns summing to 1,
/// p's first K columns 3/4 q's and 1/4 an independent distribution (an acceptance α = 1 − TV(p, q)
/// near the bundled pair's), and 16 sets of K drafts, drafts[i] drawn from q.col(i) as a draft
/// model draws them: the verifiers' benchmarks cycle through the sets. (`BM_sample_residual` reads
/// column 0, mixed with q since 10e8b37: its times moved by under 1% against the earlier
/// independent p, the two inputs side by side on the Zen 4.)
struct verify_inputs {
  Eigen::MatrixXf q, p;
  std::vector<std::vector<token>> draft_sets;
  verify_inputs(std::size_t V, std::size_t K) {
    std::mt19937 rng(12);
    std::exponential_distribution<float> e(1.0f);
    const auto fill = [&](Eigen::MatrixXf& m, std::size_t cols) {
      m.resize(static_cast<Eigen::Index>(V), static_cast<Eigen::Index>(cols));
      for (Eigen::Index j = 0; j < m.cols(); ++j) {
        for (Eigen::Index i = 0; i < m.rows(); ++i) m(i, j) = std::pow(e(rng), 4.0f);
        m.col(j) /= m.col(j).sum();
      }
    };
    fill(q, K);
    fill(p, K + 1);
    const auto k = static_cast<Eigen::Index>(K);
    p.leftCols(k) = 0.75f * q + 0.25f * p.leftCols(k);
    for (Eigen::Index j = 0; j < k; ++j) p.col(j) /= p.col(j).sum();
    std::mt19937_64 draw(13);
    draft_sets.resize(16);
    for (auto& drafts : draft_sets) {
      for (Eigen::Index i = 0; i < k; ++i) drafts.push_back(specsample::sample_categorical(q.col(i), draw));
    }
  }
};

/// The decision as the sampling loop makes it (`decide`, p read whole): without the checks of every
/// entry of p and q that a direct call of the verifier (`operator()`) makes first.
template <class Verifier>
void verify_benchmark(benchmark::State& state, Verifier verifier) {
  const auto V = static_cast<std::size_t>(state.range(0));
  const verify_inputs in(V, 4);
  const Eigen::Ref<const Eigen::MatrixXf> p = in.p;
  const specsample::detail::dense_columns columns{p};
  std::mt19937_64 rng(13);
  std::size_t set = 0;
  for (auto _ : state) {
    const auto r = verifier.decide(in.draft_sets[set], in.q, columns, rng);
    benchmark::DoNotOptimize(r);
    set = (set + 1) % in.draft_sets.size();
  }
}

void BM_verify_tokenwise(benchmark::State& state) { verify_benchmark(state, specsample::tokenwise_verifier{}); }
BENCHMARK(BM_verify_tokenwise)->ArgName("V")->Arg(4096)->Arg(50257);

void BM_verify_block(benchmark::State& state) { verify_benchmark(state, specsample::block_verifier{}); }
BENCHMARK(BM_verify_block)->ArgName("V")->Arg(4096)->Arg(50257);

void BM_sample_residual(benchmark::State& state) {
  const auto V = static_cast<std::size_t>(state.range(0));
  const verify_inputs in(V, 1);
  std::mt19937_64 rng(14);
  for (auto _ : state) {
    // (the draw the verifiers make, without the public sample_residual's checks of p and q)
    const token t = specsample::detail::draw_residual(in.p.col(0), in.q.col(0), rng);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_sample_residual)->ArgName("V")->Arg(4096)->Arg(50257);

/// The draft's draw from its warped distribution: a categorical draw over V probabilities, as the
/// loop makes it (without the public `sample_categorical`'s check of every weight).
void BM_sample_categorical(benchmark::State& state) {
  const auto V = static_cast<std::size_t>(state.range(0));
  const verify_inputs in(V, 1);
  std::mt19937_64 rng(15);
  for (auto _ : state) {
    const token t = specsample::detail::draw_categorical(in.q.col(0), rng);
    benchmark::DoNotOptimize(t);
  }
}
BENCHMARK(BM_sample_categorical)->ArgName("V")->Arg(4096)->Arg(50257);

}  // namespace

BENCHMARK_MAIN();
