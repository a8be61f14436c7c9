#pragma once
/// @file model.hpp
/// The GPT-2 language model: weights + KV cache + batched forward pass. Models
/// `specsample::language_model`.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/io/mapped_file.hpp>
#include <specsample/io/safetensors.hpp>
#include <specsample/models/gpt2/config.hpp>
#include <specsample/models/gpt2/kernels.hpp>
#include <specsample/models/gpt2/weights.hpp>

#include <Eigen/Core>
#include <fmt/format.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xtensor.hpp>

#include <algorithm>
#include <array>
#include <cassert>
#include <cmath>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specsample::gpt2 {

/// Wall time a model's forward passes spent in each operation, summed over the appends made while
/// it is attached (`model::time_ops`): where a call's time goes. specsample-bench's table "Where
/// the target's call goes" compares a single token's call with a 5-token one this way. Attached,
/// an append reads the clock twice per operation (9 per layer and 3 more: 114 reads for the
/// bundled target's 6 layers); a model with none attached reads no clock. One op_times per model:
/// models appending concurrently need their own.
struct op_times {
  enum op : std::uint8_t {
    embed,       ///< token and position embeddings
    layer_norm,  ///< every layer norm (two per layer and the final one)
    qkv,         ///< the attention's input matmul
    attention,   ///< the new keys and values into the cache, scores, softmax, weighted sum of values
    attn_proj,   ///< the attention's output matmul
    residual,    ///< the residual adds
    mlp_fc,      ///< the MLP's first matmul and its GELU (fused: `kernels::activation`)
    mlp_proj,    ///< the MLP's second matmul
    lm_head,     ///< the logits' matmul
  };
  static constexpr std::size_t count = lm_head + 1;
  static constexpr std::array<std::string_view, count> names{
      "embed", "layer norm", "QKV matmul", "attention", "attention projection", "residual add",
      "MLP matmul (up) + GELU", "MLP matmul (down)", "lm_head matmul"};
  std::array<double, count> seconds{};  ///< per operation, summed

  void clear() noexcept { seconds.fill(0.0); }
  [[nodiscard]] double total() const noexcept {
    double t = 0.0;
    for (const double s : seconds) t += s;
    return t;
  }
};

namespace detail {
// format_name(f), or "weight_format(n)" for a value outside the enumeration (an integer cast to it).
inline std::string format_label(weight_format f) {
  const std::string_view name = format_name(f);
  return name == "?" ? fmt::format("weight_format({})", static_cast<int>(f)) : std::string(name);
}
}  // namespace detail

/// Keys and values of every layer for the positions in the context: per layer
/// `kernels::kv_layer_size(P, C, NH)` elements each of `format` (F32 or F16:
/// `options::kv_storage`), head-major, keys in transposed 16-key blocks (the layout the attention
/// kernel reads, simd.hpp "attention layout"). Every layer's keys, then every layer's values, in
/// one `huge_page_allocator` buffer (a decode reads every layer's keys and values up to the
/// length; one buffer reaches the huge-page size where two halves might not: the bundled target's
/// F16 cache is 2 × 1.18 MB).
struct kv_cache {
  using storage = std::vector<unsigned char, huge_page_allocator<unsigned char>>;
  weight_format format = weight_format::f32;
  std::size_t n_layer = 0, layer_size = 0;  ///< layers; elements per layer of keys (and of values)
  storage data;                             ///< (2, L, layer_size) elements of `format`
  std::size_t length = 0;                   ///< valid positions; rows past it are stale and never read

  /// Allocates room for `positions` positions of every layer, zeroed: slots past the length
  /// that a vector kernel loads (and discards) are never indeterminate. Throws
  /// `specsample::error` for a `f` other than F32 and F16. (Parameters named apart from the
  /// members: a consumer's -Wshadow.)
  kv_cache(std::size_t layers, std::size_t n_head, std::size_t positions, std::size_t n_embd, weight_format f)
      : format(checked_format(f)),
        n_layer(layers),
        layer_size(kernels::kv_layer_size(positions, n_embd, n_head)),
        data(total_bytes(layers, n_head, positions, n_embd, f)) {}
  /// A moved-from cache is empty: no data, length 0.
  kv_cache(kv_cache&& o) noexcept
      : format(o.format), n_layer(o.n_layer), layer_size(o.layer_size), data(std::move(o.data)),
        length(std::exchange(o.length, 0)) {}
  kv_cache& operator=(kv_cache&& o) noexcept {
    if (this == &o) return *this;
    format = o.format;
    n_layer = o.n_layer;
    layer_size = o.layer_size;
    data = std::move(o.data);
    length = std::exchange(o.length, 0);
    return *this;
  }
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;
  ~kv_cache() = default;

  /// Bytes of keys and values a cache of these dimensions holds.
  [[nodiscard]] static std::size_t total_bytes(std::size_t n_layer, std::size_t n_head, std::size_t positions,
                                               std::size_t n_embd, weight_format format) noexcept {
    return 2 * n_layer * kernels::kv_layer_size(positions, n_embd, n_head) * format_bytes(format);
  }

  /// `f` when a cache can hold it (F32 or F16); throws `specsample::parameter_error` otherwise.
  static weight_format checked_format(weight_format f) {
    if (f != weight_format::f32 && f != weight_format::f16) {
      throw parameter_error("gpt2::options.kv_storage", fmt::format(" must be F32 or F16, not {}", detail::format_label(f)));
    }
    return f;
  }

  /// Layer `l`'s keys (F: the cache's format).
  template <weight_format F>
  [[nodiscard]] std::span<weight_t<F>> keys(std::size_t l) noexcept { return slice<F>(l); }
  /// Layer `l`'s values.
  template <weight_format F>
  [[nodiscard]] std::span<weight_t<F>> values(std::size_t l) noexcept { return slice<F>(n_layer + l); }

 private:
  template <weight_format F>
  [[nodiscard]] std::span<weight_t<F>> slice(std::size_t i) noexcept {
    assert(F == format);
    return {reinterpret_cast<weight_t<F>*>(data.data()) + i * layer_size, layer_size};
  }
};

/// Throws `specsample::error` unless `dir` is a directory ("…: no such directory", "…: a file, not a
/// directory" naming the directory that holds it, …; expected "a Hugging Face GPT-2 directory
/// (config.json, model.safetensors)"): the check `model::load` starts with, for programs that read
/// another file of the directory first (its tokenizer) or check every path before loading any.
inline void require_model_directory(const std::filesystem::path& dir) {
  io::require_directory(dir, "a Hugging Face GPT-2 directory (config.json, model.safetensors)");
}

/// The config file of the Hugging Face GPT-2 directory `dir`: `dir/config.json`, which `load` reads
/// (`config::load(config_file(dir))` gives its sizes — the context, the vocabulary — without the
/// weights: the tools check their arguments against them before any weights load).
[[nodiscard]] inline std::filesystem::path config_file(const std::filesystem::path& dir) { return dir / "config.json"; }

/// The weights file of the Hugging Face GPT-2 directory `dir`: `dir/model.safetensors`, or, when
/// that is not a regular file, the shard index `dir/model.safetensors.index.json` (transformers'
/// save_pretrained splits a checkpoint above 5 GB: a fine-tuned gpt2-xl in F32;
/// `io::safetensors_checkpoint` reads the shards as one), as transformers looks for them. Throws
/// `specsample::error` when neither is there ("file not found"), saying how to convert a PyTorch
/// pickle (`pytorch_model.bin`, or its shards' index), which this library does not read, when the
/// directory holds one instead. (A model.safetensors that is there but unreadable, a directory
/// say, with no index beside it, is returned: its reader names the problem.)
[[nodiscard]] inline std::filesystem::path weights_file(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::is_regular_file(single, ec)) return single;
  if (fs::exists(index, ec)) return index;
  if (fs::exists(single, ec)) return single;
  const bool pickle = fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec);
  throw error(fmt::format("{}: file not found (nor {}, a sharded checkpoint's index){}", single.string(),
                          index.filename().string(),
                          pickle ? "; the directory holds a PyTorch pickle (pytorch_model.bin), which specsample does "
                                   "not read: convert it with transformers, AutoModelForCausalLM.from_pretrained(dir)"
                                   ".save_pretrained(dir, safe_serialization=True)"
                                 : ""));
}

/// A GPT-2 model with a KV cache on CPU.
///
/// Storage: weights live in their checkpoint precision or in `options::weight_storage`
/// (F16/BF16/F32 `weight_matrix`es, small tensors F32 in xtensor containers) and the KV cache in
/// `options::kv_storage` (F32 or F16, `kv_cache`); the kernels work on spans, weight views and Eigen maps over that same memory, so
/// nothing is copied between the views.
/// `append` runs all new positions in one batched pass; the logits of a position are bitwise
/// identical whether it is appended alone or in a batch, and for every thread count.
class model final {
 public:
  /// Loads `dir/config.json` and `dir/model.safetensors` (a Hugging Face GPT-2 directory), or
  /// the shards `dir/model.safetensors.index.json` lists when model.safetensors is not a regular
  /// file (`weights_file`). Throws `specsample::error` naming the directory when it is none, else the
  /// file and the problem, or, before reading any file,
  /// `specsample::parameter_error` naming an option (`gpt2::options.kv_storage`, say) that holds no
  /// value of its enumeration (an integer cast to it) or contradicts another, and, once config.json
  /// is read, `gpt2::options.context` when it is above the config's n_positions.
  [[nodiscard]] static model load(const std::filesystem::path& dir, options opts = {});

  /// Builds a model from parameters already in memory (they must match `cfg`, and hold an lm_head
  /// exactly when `cfg.tie_word_embeddings` is false, as `load` gives them), converting the matmul
  /// weights to `opts.weight_storage` when it is set (`weights::convert`). Throws
  /// `specsample::error` when they do not match, for the options `load` refuses, or when the
  /// conversion or the KV cache does not fit in memory (each named).
  model(const gpt2::config& cfg, gpt2::weights w, options opts = {});

  /// Moves: a moved-from model holds no weights and an empty context (size() 0, threads() 0); its
  /// `append` throws `specsample::error` saying so. Only `truncate(0)`, assignment and destruction
  /// are meaningful then (`config()` and the like still describe the model it was; `weights()`
  /// holds no data): assign a model to it to use it again. A model moved onto itself is unchanged.
  model(model&&) noexcept = default;
  /// The move constructor's work, member by member, in place (hence `final`: no derived object
  /// is ever half replaced); nothing for a model moved onto itself, whose members moved onto
  /// themselves would be emptied.
  model& operator=(model&& other) noexcept {
    if (this != &other) {
      std::destroy_at(this);
      std::construct_at(this, std::move(other));
    }
    return *this;
  }
  model(const model&) = delete;
  model& operator=(const model&) = delete;
  ~model() = default;

  /// The hyper-parameters.
  [[nodiscard]] const gpt2::config& config() const noexcept { return cfg_; }
  /// The parameters (matmul weights in the checkpoint's precision, or `options::weight_storage`'s,
  /// or BF16 pairs / INT8 quads for `options::matmul_precision` BF16 / INT8).
  [[nodiscard]] const gpt2::weights& weights() const noexcept { return w_; }
  /// How the matmuls multiply (`options::matmul_precision`; the weights' format says it: a model
  /// built from another's BF16-pair or INT8-quad weights multiplies that way too).
  [[nodiscard]] gpt2::matmul_precision matmul_precision() const noexcept {
    switch (w_.output_embedding().format()) {
      case weight_format::bf16_pairs: return gpt2::matmul_precision::bf16;
      case weight_format::i8_quads: return gpt2::matmul_precision::int8;
      default: return gpt2::matmul_precision::f32;
    }
  }
  /// Whether the matmuls run on AMX tiles (`options::amx`): BF16 or INT8 matmuls at the AVX-512
  /// level of a CPU with AMX (`simd::has_amx`), the model's widths (n_embd, n_inner) whole tile
  /// steps (`simd::amx_fits`; every GPT-2's are).
  [[nodiscard]] bool amx() const noexcept { return amx_; }
  /// The KV cache's precision (`options::kv_storage`).
  [[nodiscard]] weight_format kv_storage() const noexcept { return cache_.format; }
  /// Vocabulary size V.
  [[nodiscard]] std::size_t vocab_size() const noexcept { return cfg_.vocab_size; }
  /// Tokens currently in the context (KV cache).
  [[nodiscard]] std::size_t size() const noexcept { return cache_.length; }
  /// Longest context: the positions the KV cache holds, `options::context` (n_positions by
  /// default).
  [[nodiscard]] std::size_t max_size() const noexcept { return context_; }
  /// Worker threads used by the kernels (the caller included); 0 for a moved-from model.
  [[nodiscard]] std::size_t threads() const noexcept { return pool_ != nullptr ? pool_->size() : 0; }
  /// The kernel instruction set in use (`options::kernels` capped at `simd::detected()`: what the
  /// CPU supports and the build compiles).
  [[nodiscard]] isa kernels() const noexcept { return isa_; }

  /// Adds the time of each operation of every later append to `*times` (nullptr, the default:
  /// none). `*times` must outlive its attachment. Bits and allocations are the same either way.
  void time_ops(op_times* times) noexcept { op_times_ = times; }

  /// Grows the scratch buffers so that appends of up to `batch` tokens (at most `max_size()`: no
  /// append is longer) allocate nothing.
  void reserve(std::size_t batch) {
    batch = std::min(batch, context_);  // (so that no buffer size wraps either)
    if (batch <= capacity_) return;
    const std::size_t C = cfg_.n_embd;
    try {  // (a buffer replaced before one failed is only larger: capacity_ still holds)
      x_ = xt::xtensor<float, 2>::from_shape({batch, C});
      ln_ = xt::xtensor<float, 2>::from_shape({batch, C});
      qkv_ = xt::xtensor<float, 2>::from_shape({batch, 3 * C});
      atty_ = xt::xtensor<float, 2>::from_shape({batch, C});
      proj_ = xt::xtensor<float, 2>::from_shape({batch, C});
      fc_ = xt::xtensor<float, 2>::from_shape({batch, cfg_.n_inner});
      logits_ = xt::xtensor<float, 2>::from_shape({batch, cfg_.vocab_size});
      operands_.reserve(w_.output_embedding().format(), batch, std::max(C, cfg_.n_inner));
    } catch (const std::bad_alloc&) {
      const double floats = static_cast<double>(batch) * static_cast<double>(7 * C + cfg_.n_inner + cfg_.vocab_size);
      throw error(fmt::format("gpt2::model: out of memory for the buffers of a batch of {} positions (their "
                              "activations and logits alone: {:.3g} GB); a smaller batch needs less (fewer tokens "
                              "per append, a smaller options::batch_capacity)",
                              batch, floats * 4 / 1e9));
    }
    capacity_ = batch;
  }

  /// Appends `tokens` to the context in one batched forward pass and returns their logits,
  /// (V, n) column-major: column j is the next-token logits after tokens[0..j].
  ///
  /// The map points into an internal buffer: it stays valid until the next `append`, `truncate`
  /// or `reserve` (copy it into an `Eigen::MatrixXf` to keep it). No heap allocation happens
  /// when n is within the reserved batch capacity. Throws `specsample::error` before touching
  /// any state when a token id is outside [0, V) or the context would exceed `max_size()`, and,
  /// leaving the context as it was, when the forward pass overflows (a corrupt checkpoint's finite
  /// but absurd weight): a key or value it would store, or a logit it would return, that is a NaN
  /// or an infinity, or a key or value an F16 KV cache cannot hold (65520 or more in magnitude).
  Eigen::Map<const Eigen::MatrixXf> append(std::span<const token> tokens) { return append(tokens, tokens.size()); }

  /// Appends `tokens` like `append(tokens)` but returns the logits of the last `logits` of them
  /// only, (V, logits), bitwise the same columns. The positions before those skip what only
  /// their logits need: the last block's attention, projection and MLP, the final layer norm and
  /// the lm_head (a prompt's prefill, `logits` = 0: 24% of the bundled target's multiply-adds,
  /// 73% of the drafts'). Throws `specsample::error` when logits > tokens.size().
  Eigen::Map<const Eigen::MatrixXf> append(std::span<const token> tokens, std::size_t logits);

  /// Keeps the first `n` tokens of the context (O(1): the cache rows past n are just ignored).
  /// Throws `specsample::error` when n > size().
  void truncate(std::size_t n) {
    if (n > cache_.length) {
      throw error(fmt::format("gpt2: cannot truncate to {} tokens: the context holds only {}", n,
                              cache_.length));
    }
    cache_.length = n;
  }

 private:
  static const gpt2::config& validated(const gpt2::config& cfg) {
    cfg.validate("gpt2::model");
    return cfg;
  }
  // `w`, once every parameter has the shape `cfg` gives it (checked before the KV cache is
  // allocated: a config whose n_positions the weights do not have could ask for gigabytes).
  static gpt2::weights matching(const gpt2::config& cfg, gpt2::weights w) {
    const std::size_t L = cfg.n_layer, C = cfg.n_embd, I = cfg.n_inner;
    const auto shaped = [](const weight_matrix& m, std::size_t r, std::size_t c) {  // (and storage to read)
      return m.rows() == r && m.cols() == c && m.data() != nullptr;
    };
    const auto sized = [](const xt::xtensor<float, 1>& v, std::size_t n) { return v.size() == n; };
    bool ok = w.layers.size() == L && w.wte.shape(0) == cfg.vocab_size && w.wte.shape(1) == C &&
              w.wpe.shape(0) == cfg.n_positions && w.wpe.shape(1) == C &&
              shaped(w.output_embedding(), cfg.vocab_size, C) && sized(w.ln_f_weight, C) && sized(w.ln_f_bias, C);
    for (const layer_weights& lw : w.layers) {
      ok = ok && shaped(lw.attn_qkv_weight, 3 * C, C) && shaped(lw.attn_proj_weight, C, C) &&
           shaped(lw.mlp_fc_weight, I, C) && shaped(lw.mlp_proj_weight, C, I) && sized(lw.ln_1_weight, C) &&
           sized(lw.ln_1_bias, C) && sized(lw.ln_2_weight, C) && sized(lw.ln_2_bias, C) &&
           sized(lw.attn_qkv_bias, 3 * C) && sized(lw.attn_proj_bias, C) && sized(lw.mlp_fc_bias, I) &&
           sized(lw.mlp_proj_bias, C);
    }
    if (!ok) throw error("gpt2::model: weights do not match the config");
    // The logits' matrix as `load` takes it: lm_head exactly when the config unties the embeddings.
    if (!cfg.tie_word_embeddings && w.lm_head.size() == 0) {
      throw error("gpt2::model: the config unties the word embeddings (tie_word_embeddings false), so the logits come "
                  "from lm_head, but the weights hold none");
    }
    if (cfg.tie_word_embeddings && w.lm_head.size() != 0) {
      throw error("gpt2::model: the config ties the word embeddings (tie_word_embeddings true), so the logits come "
                  "from wte, but the weights also hold an lm_head: drop it, or untie the config");
    }
    return w;
  }
  // The precision the matmul weights are held in for `opts` (nullopt: the checkpoint's).
  static std::optional<weight_format> storage_of(const options& opts) {
    if (opts.matmul_precision != gpt2::matmul_precision::f32 && opts.matmul_precision != gpt2::matmul_precision::bf16 &&
        opts.matmul_precision != gpt2::matmul_precision::int8) {
      throw parameter_error("gpt2::options.matmul_precision",
                            fmt::format(" must be f32, bf16 or int8, not matmul_precision({})",
                                        static_cast<int>(opts.matmul_precision)));
    }
    if (opts.weight_storage && std::string_view(format_name(*opts.weight_storage)) == "?") {
      throw parameter_error("gpt2::options.weight_storage", fmt::format(" must be empty, F32, F16 or BF16, not {}",
                                                                        detail::format_label(*opts.weight_storage)));
    }
    if (opts.weight_storage == weight_format::bf16_pairs) {
      throw parameter_error("gpt2::options.weight_storage",
                            " BF16 pairs is the layout of matmul_precision BF16: set that instead");
    }
    if (opts.weight_storage == weight_format::i8_quads) {
      throw parameter_error("gpt2::options.weight_storage",
                            " INT8 quads is the layout of matmul_precision INT8: set that instead");
    }
    if (opts.matmul_precision == gpt2::matmul_precision::int8) {
      if (!storage_fits(opts.matmul_precision, opts.weight_storage)) {
        throw parameter_error("gpt2::options.weight_storage",
                              fmt::format(" asks for {}, but matmul_precision INT8 quantises the checkpoint's weights "
                                          "itself: leave it empty",
                                          format_name(*opts.weight_storage)));
      }
      return weight_format::i8_quads;
    }
    if (opts.matmul_precision != gpt2::matmul_precision::bf16) return opts.weight_storage;
    if (!storage_fits(opts.matmul_precision, opts.weight_storage)) {
      throw parameter_error("gpt2::options.weight_storage",
                            fmt::format(" asks for {}, but matmul_precision BF16 multiplies BF16 weights: leave it "
                                        "empty or give BF16",
                                        format_name(*opts.weight_storage)));
    }
    return weight_format::bf16_pairs;
  }
  // Throws, before the keys and values of layer l's rows `qkv` (of 3C: q, k, v; the first at
  // position pos0, the context's length before the call) are stored, when
  // one is a NaN or an infinity (the forward pass overflowed) or, for an F16 cache, 65520 or more
  // in magnitude (it would be stored as an infinity): either would poison every later call,
  // including after an append that returns no logits. The context is left as it was.
  template <weight_format F>
  void check_keys_values(std::size_t l, std::size_t pos0, std::span<const float> qkv) const {
    const std::size_t C = cfg_.n_embd;
    const float bound = F == weight_format::f16 ? 65520.0f : std::numeric_limits<float>::infinity();
    for (std::size_t t = 0; t < qkv.size() / (3 * C); ++t) {
      const std::span<const float> kv = qkv.subspan(t * 3 * C + C, 2 * C);
      if (specsample::simd::magnitudes_below(isa_, kv.data(), kv.size(), bound)) continue;
      const std::size_t bad = specsample::simd::first_magnitude_at_least(kv.data(), kv.size(), bound);
      const bool finite = specsample::simd::magnitude_bits(kv[bad]) < 0x7f800000u;  // then beyond the F16 bound
      throw error(fmt::format("gpt2: layer {}'s {} {} of the token at position {} is {}: {}; the context stays at {} tokens",
                              l, bad < C ? "key" : "value", bad % C, pos0 + t, kv[bad],
                              finite ? "an F16 KV cache cannot hold 65520 or more (options::kv_storage F32 can)"
                                     : "the forward pass overflowed (a corrupt checkpoint?)",
                              pos0));
    }
  }
  // `opts`, once every option holds a value of its enumeration and none contradicts another
  // (kernels_of, kv_cache::checked_format, storage_of).
  static const options& checked(const options& opts) {
    (void)kernels_of(opts);
    (void)kv_cache::checked_format(opts.kv_storage);
    (void)storage_of(opts);
    return opts;
  }
  // The level `opts.kernels` asks for, capped at what this CPU and build have (simd::resolve).
  static isa kernels_of(const options& opts) {
    const isa k = opts.kernels;
    if (k != isa::generic && k != isa::avx2 && k != isa::avx512 && k != isa::best) {
      throw parameter_error("gpt2::options.kernels", fmt::format(" must be isa::generic, avx2, avx512 or best, not isa({})",
                                                                 static_cast<int>(k)));
    }
    return simd::resolve(k);
  }
  // The positions the KV cache holds for `opts.context` (0: n_positions); throws when it asks for
  // more than the checkpoint's n_positions (wpe has no rows past them).
  static std::size_t context_of(const gpt2::config& cfg, const options& opts) {
    if (opts.context > cfg.n_positions) {
      throw parameter_error("gpt2::options.context", fmt::format(" = {} is more than the model's n_positions = {}",
                                                                 opts.context, cfg.n_positions));
    }
    return opts.context != 0 ? opts.context : cfg.n_positions;
  }
  static std::shared_ptr<thread_pool> pool_of(const options& opts) {
    if (opts.threads > thread_pool::max_threads) {  // (thread_pool's own refusal would not name the field)
      throw parameter_error("gpt2::options.threads", fmt::format(" = {} is more than thread_pool::max_threads = {}",
                                                                 opts.threads, thread_pool::max_threads));
    }
    if (!opts.pool) return std::make_shared<thread_pool>(opts.threads);
    if (opts.threads != 0 && opts.threads != opts.pool->size()) {
      throw parameter_error("gpt2::options.threads", fmt::format(" = {} but the pool given has {} workers; set one or the other",
                                                                 opts.threads, opts.pool->size()));
    }
    return opts.pool;
  }

  gpt2::config cfg_;
  gpt2::weights w_;
  std::shared_ptr<thread_pool> pool_;
  isa isa_ = isa::generic;
  std::size_t min_parallel_work_ = 0;
  std::size_t context_ = 0;        // positions the KV cache holds (P below; `max_size`)
  std::size_t capacity_ = 0;
  kv_cache cache_;                 // keys and values of every layer + length
  xt::xtensor<float, 2> att_;      // (workers, attention_scratch(P)) attention scores scratch
  // Activations for up to capacity_ positions (B = capacity_):
  xt::xtensor<float, 2> x_;       // (B, C) residual stream
  xt::xtensor<float, 2> ln_;      // (B, C) layer-norm output
  xt::xtensor<float, 2> qkv_;     // (B, 3C)
  xt::xtensor<float, 2> atty_;    // (B, C) attention output
  xt::xtensor<float, 2> proj_;    // (B, C) projection output
  xt::xtensor<float, 2> fc_;      // (B, I) MLP hidden
  xt::xtensor<float, 2> logits_;  // (B, V) == logits (V, B) column-major
  kernels::matmul_operands operands_;  // (B, C or I) BF16 or INT8 matmul operands (matmul_precision bf16, int8)
  op_times* op_times_ = nullptr;       // where append adds its operations' times (`time_ops`), or none
  bool streamed_ = false;              // matmul weights above streamed_weight_bytes (weight_view::streamed)
  bool amx_ = false;                   // the matmuls run on AMX tiles (`amx`; weight_view::tiles)
};

// The model's loading (`load`), construction and forward pass (`append`) — with them the weights'
// loading and conversion, the JSON and safetensors parsing and the kernels they call: inline in
// every TU that uses them (header-only, the default), or, with SPECSAMPLE_SEPARATE_KERNELS, only
// in the TU that defines SPECSAMPLE_DEFINE_GPT2_MODEL (src/gpt2_model.cpp of specsample::kernels;
// the switch is models/gpt2/simd.hpp's, "Where the kernels are compiled").
#ifdef SPECSAMPLE_GPT2_MODEL

SPECSAMPLE_GPT2_MODEL model model::load(const std::filesystem::path& dir, options opts) {
  const std::filesystem::path config_path = config_file(dir);
  const std::optional<weight_format> storage = storage_of(checked(opts));  // first: before any file or thread
  opts.pool = pool_of(opts);  // (checks options.threads: an option's error comes before a file's)
  opts.threads = 0;
  require_model_directory(dir);
  gpt2::config cfg = gpt2::config::load(config_path);
  (void)context_of(cfg, opts);  // (before the weights are read)
  const io::safetensors_checkpoint file = io::safetensors_checkpoint::open(weights_file(dir));
  gpt2::weights w = gpt2::weights::load(file, cfg, config_path.string(), storage);
  return model(cfg, std::move(w), opts);
}

SPECSAMPLE_GPT2_MODEL model::model(const gpt2::config& cfg, gpt2::weights w, options opts) try
    : cfg_(validated(cfg)),
      w_(matching(cfg_, std::move(w))),  // (before the KV cache and buffers are allocated)
      pool_(pool_of(checked(opts))),  // (before the KV cache is allocated)
      isa_(kernels_of(opts)),
      min_parallel_work_(opts.min_parallel_work),
      context_(context_of(cfg_, opts)),
      cache_(cfg.n_layer, cfg.n_head, context_, cfg.n_embd, opts.kv_storage) {
  if (const std::optional<weight_format> s = storage_of(opts)) {
    try {  // (not the KV cache, which the handler below names)
      w_.convert(*s);
    } catch (const std::bad_alloc&) {
      throw error(fmt::format("gpt2::model: out of memory converting the matmul weights ({:.3g} GB as held) to {} "
                              "(options.weight_storage or matmul_precision; matrix by matrix, each beside its "
                              "original)",
                              static_cast<double>(w_.matmul_bytes()) / 1e9, format_name(*s)));
    }
  }
  const std::size_t P = context_;
  // A matmul precision's layout (BF16 pairs, INT8 quads) is all of the matmul weights' or none's.
  for (const weight_format f : {weight_format::bf16_pairs, weight_format::i8_quads}) {
    const bool held = w_.output_embedding().format() == f;
    for (const layer_weights& lw : w_.layers) {
      for (const auto m : layer_weights::matmuls) {
        if (((lw.*m).format() == f) != held) {
          throw error(fmt::format("gpt2::model: the matmul weights must be all {} (matmul_precision {}) or none",
                                  format_name(f), f == weight_format::bf16_pairs ? "BF16" : "INT8"));
        }
      }
    }
  }
  att_ = xt::xtensor<float, 2>::from_shape({pool_->size(), kernels::attention_scratch(P)});
  streamed_ = w_.matmul_bytes() > streamed_weight_bytes;
  {  // Tiles for all the matmuls or for none (their BF16 sums differ from the other kernels').
    const weight_format f = w_.output_embedding().format();
    amx_ = opts.amx && isa_ == isa::avx512 && simd::has_amx() && simd::amx_fits(f, cfg_.n_embd) &&
           simd::amx_fits(f, cfg_.n_inner);
  }
  reserve(std::min(std::max<std::size_t>(opts.batch_capacity, 1), P));
} catch (const std::bad_alloc&) {
  const std::size_t P = context_of(cfg, opts);  // (it did not throw: the cache's allocation did)
  const auto per_layer = static_cast<double>(kernels::kv_layer_size(P, cfg.n_embd, cfg.n_head));
  const std::size_t b = format_bytes(opts.kv_storage);
  throw error(fmt::format(
      "gpt2::model: out of memory for its buffers (the KV cache alone, for {} positions: {} layers x 2 "
      "(keys, values) x {:.0f} elements x {} bytes = {:.3g} GB; a smaller options::context needs less)",
      P, cfg.n_layer, per_layer, b,
      static_cast<double>(kv_cache::total_bytes(cfg.n_layer, cfg.n_head, P, cfg.n_embd, opts.kv_storage)) / 1e9));
}

SPECSAMPLE_GPT2_MODEL Eigen::Map<const Eigen::MatrixXf> model::append(std::span<const token> tokens, std::size_t logits) {
  if (pool_ == nullptr) throw error("gpt2::model: append on a moved-from model (it holds no weights); assign one to it");
  const std::size_t T = tokens.size();
  const std::size_t V = cfg_.vocab_size, C = cfg_.n_embd, P = context_;
  const std::size_t NH = cfg_.n_head;
  if (T > P - cache_.length) {
    throw error(fmt::format("gpt2: cannot append {} tokens to a context of {}: that would exceed the model's {}", T,
                            cache_.length,
                            P == cfg_.n_positions
                                ? fmt::format("n_positions = {}", P)
                                : fmt::format("context of {} positions (options::context; n_positions = {})", P,
                                              cfg_.n_positions)));
  }
  if (logits > T) {
    throw error(fmt::format("gpt2: cannot return the logits of the last {} of {} appended tokens", logits, T));
  }
  for (std::size_t t = 0; t < T; ++t) {
    if (!in_vocabulary(tokens[t], V)) {
      throw error(fmt::format("gpt2: token id {} (at index {}) is out of range for vocab_size {}",
                              tokens[t], t, V));
    }
  }
  const auto rows = static_cast<Eigen::Index>(V);
  if (T == 0) return {logits_.data(), rows, 0};
  reserve(T);

  thread_pool* pool = pool_.get();
  const std::size_t pos0 = cache_.length;
  // Rows [first, T) of the activations are computed; every layer runs them all up to its keys and
  // values (they are stored), the last from its attention on only those whose logits are asked for.
  std::size_t first = 0;
  const auto n = [&] { return T - first; };
  const auto buf = [&](xt::xtensor<float, 2>& b) {
    return std::span<float>(b.data() + first * b.shape(1), n() * b.shape(1));
  };
  const auto cbuf = [&](const xt::xtensor<float, 2>& b) {
    return std::span<const float>(b.data() + first * b.shape(1), n() * b.shape(1));
  };
  const auto vec = [](const auto& a) { return std::span<const float>(a.data(), a.size()); };

  // The pool for an op touching `work` weight elements per row (nullptr: run inline).
  const auto pool_for = [&](std::size_t work) {
    return work * n() >= min_parallel_work_ ? pool : nullptr;
  };
  const auto mm = [&](xt::xtensor<float, 2>& out, const xt::xtensor<float, 2>& in, const weight_matrix& w,
                      std::span<const float> bias, kernels::activation act = kernels::activation::none) {
    const std::size_t OC = w.rows(), K = w.cols();
    weight_view v = w.view();
    v.streamed = streamed_;
    v.tiles = amx_;
    kernels::matmul(buf(out), cbuf(in), v, bias, n(), K, OC, pool_for(OC * K), isa_, &operands_, act);
  };

  // Runs f, its wall time added to the attached op_times (`time_ops`) under `o`.
  const auto timed = [this](op_times::op o, auto&& f) {
    if (op_times_ == nullptr) return f();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    op_times_->seconds[o] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const auto ln = [&](std::span<const float> weight, std::span<const float> bias) {
    timed(op_times::layer_norm, [&] {
      kernels::layer_norm(buf(ln_), cbuf(x_), weight, bias, n(), C, cfg_.layer_norm_epsilon, isa_);
    });
  };
  const auto residual = [&] { timed(op_times::residual, [&] { kernels::residual_add(buf(x_), cbuf(proj_)); }); };

  timed(op_times::embed, [&] { kernels::embed(buf(x_), tokens, w_.wte.view(), vec(w_.wpe), pos0, C); });
  const auto blocks = [&]<weight_format F>() {  // F: the KV cache's format
    for (std::size_t l = 0; l < cfg_.n_layer; ++l) {
      const layer_weights& lw = w_.layers[l];
      const std::span<weight_t<F>> k_layer = cache_.keys<F>(l);
      const std::span<weight_t<F>> v_layer = cache_.values<F>(l);
      ln(vec(lw.ln_1_weight), vec(lw.ln_1_bias));
      timed(op_times::qkv, [&] { mm(qkv_, ln_, lw.attn_qkv_weight, vec(lw.attn_qkv_bias)); });
      const std::span<const float> all = cbuf(qkv_);  // all T rows (first is 0 up to here)
      check_keys_values<F>(l, pos0, all);
      // Every layer stores all T rows' keys and values; the last attends only from the rows whose
      // logits are asked for (none: the store alone).
      if (l + 1 == cfg_.n_layer) first = T - logits;
      timed(op_times::attention, [&] {
        kernels::attention<F>(buf(atty_), all, k_layer, v_layer, {att_.data(), att_.size()}, pos0, T, n(), C, NH, P,
                              pool_for(2 * (pos0 + T) * C), isa_);
      });
      if (n() == 0) break;
      timed(op_times::attn_proj, [&] { mm(proj_, atty_, lw.attn_proj_weight, vec(lw.attn_proj_bias)); });
      residual();
      ln(vec(lw.ln_2_weight), vec(lw.ln_2_bias));
      timed(op_times::mlp_fc, [&] { mm(fc_, ln_, lw.mlp_fc_weight, vec(lw.mlp_fc_bias), kernels::activation::gelu); });
      timed(op_times::mlp_proj, [&] { mm(proj_, fc_, lw.mlp_proj_weight, vec(lw.mlp_proj_bias)); });
      residual();
    }
  };
  if (cache_.format == weight_format::f16) {
    blocks.template operator()<weight_format::f16>();
  } else {
    blocks.template operator()<weight_format::f32>();
  }
  cache_.length += T;
  if (logits == 0) return {logits_.data(), rows, 0};
  ln(vec(w_.ln_f_weight), vec(w_.ln_f_bias));
  // logits (n, V) row-major == (V, n) column-major.
  timed(op_times::lm_head, [&] { mm(logits_, ln_, w_.output_embedding(), {}); });
  const std::span<const float> out(logits_.data() + first * V, n() * V);
  if (!specsample::simd::magnitudes_below(isa_, out.data(), out.size())) {
    const std::size_t bad = specsample::simd::first_magnitude_at_least(out.data(), out.size());
    cache_.length = pos0;
    throw error(fmt::format("gpt2: next-token logit {} at position {} is {}: the forward pass overflowed (a "
                            "corrupt checkpoint?); the context stays at {} tokens",
                            bad % V, pos0 + first + bad / V, out[bad], pos0));
  }
  return {logits_.data() + first * V, rows, static_cast<Eigen::Index>(n())};
}

#endif  // SPECSAMPLE_GPT2_MODEL

static_assert(language_model<model>,
              "gpt2::model must model specsample::language_model (vocab_size, size, append, "
              "truncate)");
static_assert(specsample::detail::has_append_last<model>,
              "the sampling loops must find gpt2::model's append(tokens, n), or they fall back to every column");

}  // namespace specsample::gpt2
