#pragma once
/// @file config.hpp
/// GPT-2 hyper-parameters (Hugging Face `config.json`) and load options.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/io/json.hpp>
#include <specsample/io/mapped_file.hpp>
#include <specsample/models/gpt2/simd.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace specsample::gpt2 {

template <class Clock>
class basic_thread_pool;  // thread_pool.hpp
using thread_pool = basic_thread_pool<std::chrono::steady_clock>;

/// How the matmuls multiply (`options::matmul_precision`).
enum class matmul_precision : std::uint8_t {
  f32,   ///< F32 activations times the weights converted exactly to F32 (the default)
  bf16,  ///< activations and weights rounded to BF16, their exact products summed in F32
  int8,  ///< weights per output and activations per row quantised to INT8, exact integer sums, scaled
};

/// "f32", "bf16" or "int8".
[[nodiscard]] constexpr const char* precision_name(matmul_precision p) noexcept {
  return p == matmul_precision::bf16 ? "bf16" : p == matmul_precision::int8 ? "int8" : "f32";
}

/// The precision named "f32", "bf16" or "int8" (in either case); nullopt for anything else.
[[nodiscard]] constexpr std::optional<matmul_precision> precision_from_name(std::string_view name) noexcept {
  for (const matmul_precision p : {matmul_precision::f32, matmul_precision::bf16, matmul_precision::int8}) {
    if (specsample::equal_ignoring_case(name, precision_name(p))) return p;
  }
  return std::nullopt;
}

/// Options for `model::load` and the in-memory `model` constructor.
struct options {
  /// Worker threads for the kernels (the calling thread included); 0 = as many as the CPUs this
  /// process may run on (its affinity).
  /// Results are bitwise identical for every thread count.
  std::size_t threads = 0;
  /// A pool to run the kernels on, shared with other models; null (default): the model starts its
  /// own pool of `threads` workers. Give a draft and its target one pool: the sampling loop calls
  /// them in turn, and with a pool each, the idle model's workers spin (then sleep) beside the busy
  /// model's and wake late for its next call (docs/gpt2.md, "Threads"). With a pool, `threads` must
  /// be 0 or the pool's size.
  std::shared_ptr<thread_pool> pool = nullptr;
  /// Positions the KV cache holds: the longest context `append` accepts (`model::max_size()`),
  /// at most the checkpoint's n_positions; 0 (the default) is n_positions. The cache is allocated
  /// and zeroed in full at load (docs/gpt2.md, "Memory"), so a program whose prompts and
  /// generations are short saves its memory here: the released gpt2-xl's F32 cache is 629 MB at
  /// 1024 positions, 78.6 MB at 128. The logits are bitwise those of the full context's for every
  /// position it holds. A value above n_positions is an error naming both.
  std::size_t context = 0;
  /// Positions per `append` the scratch buffers are sized for at load; a bigger batch grows them
  /// once (an allocation), after which appends up to that size allocate nothing.
  std::size_t batch_capacity = 16;
  /// Kernel instruction set: `isa::best` (default) picks the best the CPU supports (AVX-512,
  /// unless the build leaves it out with SPECSAMPLE_AVX512=0, AVX2 or the generic C++ path); a
  /// lower level forces it (a higher one is capped).
  isa kernels = isa::best;
  /// An op is split over the threads only when it touches at least this many weight elements
  /// (matmuls: OC × C; attention: positions × C per new row, times T): smaller ones run on the
  /// calling thread, where the wake-up and join of the pool would cost more than they save.
  std::size_t min_parallel_work = std::size_t{1} << 16;
  /// Precision to hold the matmul weights in (the four matrices of every block and wte / lm_head:
  /// all but a few percent of the bytes a token streams). Empty (the default): the checkpoint's,
  /// bit for bit. `weight_format::f16` or `bf16` halves the memory and the bytes per token of an
  /// F32 checkpoint (the released Hugging Face gpt2 files are F32), so roughly the time of a
  /// decode bound by memory bandwidth, by rounding every weight once to nearest even: the model
  /// then computes slightly different logits from the checkpoint's (docs/gpt2.md, "Storage
  /// precision"); sampling, speculative or not, stays exact for the model as loaded. F32 keeps
  /// every value exactly (and only costs bytes). A weight that F16 cannot hold (|w| >= 65520) is
  /// an error naming its tensor, not an infinity.
  std::optional<weight_format> weight_storage{};
  /// Precision of the KV cache: F32 (the default) or F16 (BF16 is an error). F16 halves the cache's
  /// memory and the bytes of keys and values every call reads (in F32, 8·n_layer·c·n_embd at
  /// context c: 2.6 MB for the bundled target at c = 141, 11% of its weights' bytes; 75.5 MB for the
  /// released gpt2 at c = 1024), by rounding each key and value once to nearest even as it is
  /// stored; attention computes in F32 as before. Logits then differ slightly from the F32 cache's
  /// (docs/gpt2.md, "KV cache precision"); batch invariance and exact sampling for the model as
  /// configured hold the same. A key or value of magnitude 65520 or more would be stored as ±inf
  /// (F16's largest finite value is 65504): `model::append` refuses it with an error instead.
  weight_format kv_storage = weight_format::f32;
  /// How the matmuls multiply. `f32` (the default): F32 activations times the weights as held
  /// (`weight_storage`), converted exactly to F32. `bf16`: the matmul weights are held in BF16
  /// (rounded once to nearest even at load, a subnormal to 0, whatever the checkpoint holds; wte
  /// included, so the embedding reads the rounded values too) and every matmul rounds its input
  /// activations the same way; the products, exact in F32, are summed in F32 — PyTorch's
  /// "medium" float32 matmul precision, oneDNN's fpmath_mode::bf16. At the AVX-512 level of a CPU
  /// with AVX512_BF16 (Zen 4 and later, Cooper Lake, Sapphire Rapids) vdpbf16ps does two of those
  /// multiply-adds per lane and instruction (twice the F32 FMA's rate on this project's Zen 4), so
  /// calls of several tokens — a verification of K drafts — cost less (docs/gpt2.md, "Matmul
  /// precision"). Elsewhere, and at a lower `kernels` level, F32 FMAs compute the same sums, bit
  /// for bit.
  /// Logits differ slightly from the F32 ones; sampling, speculative or not, stays exact for the
  /// model as configured, and batch invariance holds the same. `weight_storage` must be empty or
  /// BF16.
  ///
  /// `int8`: every matmul weight matrix (wte included) is quantised at load per output channel o
  /// to integers in [−127, 127] times a scale s_o = max |w_o| / 127 (rounded half to even); every
  /// matmul quantises its input rows the same way, one scale per row; an output is the exact
  /// integer dot product times both scales, plus the bias (docs/gpt2.md, "Matmul precision"). A
  /// quarter of F32's bytes, and at the AVX-512 level of a CPU with AVX512_VNNI (Zen 4 and later,
  /// Intel Cascade Lake and later) vpdpbusd does four multiply-adds per lane and instruction: meant
  /// for draft models, whose precision costs only acceptance — the target's distribution is
  /// whatever the target computes, so speculative sampling stays exact with any draft. The logits
  /// move by about a percent of their range; batch invariance holds, and the integer sums give
  /// every kernel level the same matmul bits for the same inputs (the other kernels still differ
  /// by level). `weight_storage` must be empty (`with_matmul_precision` drops it).
  gpt2::matmul_precision matmul_precision = gpt2::matmul_precision::f32;
  /// Run the `bf16` and `int8` matmuls on AMX tiles where the CPU has them (Intel Sapphire Rapids
  /// and later; `simd::has_amx`) at the AVX-512 level, when n_embd and n_inner are multiples of 32
  /// (BF16) or 64 (INT8), as every GPT-2's are (`model::amx`). One tile dot product takes up to 16 rows at
  /// the cost of one, so a verification call of K + 1 ≤ 16 tokens costs about what a single token
  /// does. INT8 gives the same bits either way (and takes the tiles from 4 rows on: fewer run as
  /// fast on vectors, a draft's single tokens among them). BF16 on tiles adds each 32-column block of exact
  /// products in the hardware's own order and rounding, not vdpbf16ps's, so its logits differ in
  /// the last bits from the same model without tiles (a CPU without AMX, another level, or false
  /// here); batch invariance and exact sampling hold the same (docs/gpt2.md, "Matmul precision").
  bool amx = true;
};

/// The precision that the value of a command-line flag (`--matmul`, `--draft-matmul`) names: "f32",
/// "bf16" or "int8". Throws `specsample::error` naming the flag and what it accepts otherwise.
[[nodiscard]] inline matmul_precision precision_option(std::string_view flag, std::string_view value) {
  const auto p = precision_from_name(value);
  if (!p) throw error(fmt::format("{} expects f32, bf16 or int8, got '{}'", flag, value));
  return *p;
}

/// The command-line flags that `set_option` reads (those of specsample-generate and
/// specsample-bench): `--kernels` (`options::kernels`), `--weights` (`weight_storage`), `--kv`
/// (`kv_storage`), `--matmul` (`matmul_precision`) and `--amx` (`amx`).
inline constexpr std::array<std::string_view, 5> option_flags{"--kernels", "--weights", "--kv", "--matmul", "--amx"};

/// Whether `flag` is one of `option_flags`.
[[nodiscard]] constexpr bool is_option_flag(std::string_view flag) noexcept {
  return std::find(option_flags.begin(), option_flags.end(), flag) != option_flags.end();
}

/// Sets the field of `o` that `flag` names (`option_flags`) from its command-line value:
/// `--kernels best|avx512|avx2|generic`, `--weights f32|f16|bf16`, `--kv f32|f16`,
/// `--matmul f32|bf16|int8`, `--amx on|off`. Throws `specsample::error` naming the flag and what it accepts when the
/// value is none of those, or when `flag` is not one of them (`o` is then unchanged). Each flag
/// sets its field alone, as a repeated flag's last value wins; `check_option_flags` checks the
/// fields against each other once every flag is read.
inline void set_option(options& o, std::string_view flag, std::string_view value) {
  const auto bad = [&](std::string_view accepts) {
    return error(fmt::format("{} expects {}, got '{}'", flag, accepts, value));
  };
  if (flag == "--kernels") {
    const auto level = isa_from_name(value);
    if (!level) throw bad("best, avx512, avx2 or generic");
    o.kernels = *level;
  } else if (flag == "--weights") {
    const auto f = format_from_name(value);
    if (!f) throw bad("f32, f16 or bf16");
    o.weight_storage = f;
  } else if (flag == "--kv") {
    const auto f = format_from_name(value);
    if (!f || *f == weight_format::bf16) throw bad("f32 or f16");
    o.kv_storage = *f;
  } else if (flag == "--matmul") {
    o.matmul_precision = precision_option(flag, value);
  } else if (flag == "--amx") {
    const bool on = specsample::equal_ignoring_case(value, "on");
    if (!on && !specsample::equal_ignoring_case(value, "off")) throw bad("on or off");
    o.amx = on;
  } else {
    throw error(fmt::format("gpt2::set_option: '{}' is not a model option flag (--kernels, --weights, --kv, --matmul or --amx)", flag));
  }
}

/// Whether matmuls in `p` can multiply matmul weights held as `storage` (nullopt: as the checkpoint
/// stores them): F32 multiplies any; BF16 holds its weights in BF16 (`storage` empty or BF16); INT8
/// quantises the checkpoint's itself (`storage` empty). The loader and `check_option_flags` both ask.
[[nodiscard]] constexpr bool storage_fits(matmul_precision p, std::optional<weight_format> storage) noexcept {
  if (p == matmul_precision::bf16) return !storage || *storage == weight_format::bf16;
  if (p == matmul_precision::int8) return !storage;
  return true;
}

/// Throws `specsample::error` naming both flags when the `--weights` and `--matmul` that
/// `set_option` set contradict each other: BF16 matmuls hold their weights in BF16, INT8 matmuls
/// quantise the checkpoint's. (The loader refuses the same pair naming the options' fields, after
/// the files are read; a command line calls this once its flags are read, before.)
inline void check_option_flags(const options& o) {
  if (storage_fits(o.matmul_precision, o.weight_storage)) return;
  std::string weights(format_name(*o.weight_storage));
  for (char& c : weights) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // as the flag takes it
  if (o.matmul_precision == matmul_precision::int8) {
    throw error(fmt::format("--matmul int8 quantises the checkpoint's weights itself: drop --weights {}", weights));
  }
  throw error(fmt::format("--matmul bf16 multiplies BF16 weights, but --weights asks for {}: drop it or give bf16", weights));
}

/// `o` for a model that multiplies in `p` instead (a draft's precision: `--draft-matmul` of
/// specsample-generate and specsample-bench): `p` set, and `weight_storage` dropped when `p` is
/// BF16 or INT8, which hold the matmul weights in a layout of their own (so that a `--weights`
/// meant for the other models does not contradict it).
[[nodiscard]] inline options with_matmul_precision(options o, gpt2::matmul_precision p) {
  o.matmul_precision = p;
  if (p != gpt2::matmul_precision::f32) o.weight_storage.reset();
  return o;
}

/// The precisions `o` asks for, as the command-line tools report them: {"weights": the
/// `weight_storage` format's name or "checkpoint", "kv": the `kv_storage` format's name,
/// "matmul": the `matmul_precision`'s name}.
[[nodiscard]] inline nlohmann::json precision_json(const options& o) {
  return {{"weights", o.weight_storage ? format_name(*o.weight_storage) : "checkpoint"},
          {"kv", format_name(o.kv_storage)},
          {"matmul", precision_name(o.matmul_precision)}};
}

/// GPT-2 hyper-parameters, as in a Hugging Face `config.json`.
struct config {
  std::size_t n_layer = 0;      ///< transformer blocks
  std::size_t n_head = 0;       ///< attention heads per block
  std::size_t n_embd = 0;       ///< channels C
  std::size_t n_positions = 0;  ///< longest context P (learned positions)
  std::size_t vocab_size = 0;   ///< V
  std::size_t n_inner = 0;      ///< MLP hidden width (4 C when the file says null)
  float layer_norm_epsilon = 1e-5f;
  /// The logits use wte (true, Hugging Face's default) or the checkpoint's own lm_head.weight
  /// (false, which it must have). Read by `weights::load`: a tied checkpoint that holds an
  /// lm_head.weight other than wte.weight is refused (transformers versions disagree on which of
  /// the two such a file means).
  bool tie_word_embeddings = true;
  /// The token that ends a text (`eos_token_id`), where it is a token of the vocabulary: Hugging
  /// Face's `generate` stops there, as `speculative_params::eos` does when set to it. None where
  /// the file says null, has no such field, or names an id outside the vocabulary (transformers'
  /// `GPT2Config` writes GPT-2's 50256 whatever the vocabulary: a model that can never emit it).
  std::optional<token> eos_token_id;

  /// Upper bound on every size (keeps all products of sizes far from overflow).
  static constexpr std::size_t max_dimension = std::size_t{1} << 24;
  static_assert(max_dimension <= static_cast<std::size_t>(INT32_MAX), "token ids are int32");
  /// Bounds of layer_norm_epsilon: the smallest normal float, and 1 (the variance is of unit
  /// order; GPT-2 uses 1e-5). Outside them a layer norm would divide by zero or ignore its input.
  static constexpr float min_epsilon = std::numeric_limits<float>::min();
  static constexpr float max_epsilon = 1.0f;

  /// The most JSON values (every scalar, object and array) `load` reads in a config.json: GPT-2's
  /// hold tens (a label map of a thousand classes, two thousand). Without a bound the parsed
  /// document costs 25–35 bytes a byte of file: 3.5 GB for a crafted one of 96 MB.
  static constexpr std::size_t max_json_values = 65536;

  /// Channels per head (n_embd / n_head).
  [[nodiscard]] std::size_t head_dim() const noexcept { return n_embd / n_head; }

  /// Throws `specsample::error` (prefixed with `source`) unless all sizes are positive and at most
  /// `max_dimension`, n_embd is divisible by n_head, layer_norm_epsilon is in
  /// [min_epsilon, max_epsilon] and eos_token_id, if set, is a token of the vocabulary.
  void validate(const std::string& source = "config") const {
    // In this order: n_inner defaults to 4 n_embd, which wraps when n_embd is absurd.
    for (const auto& [v, name] : {std::pair{n_layer, "n_layer"}, std::pair{n_head, "n_head"},
                                  std::pair{n_embd, "n_embd"}, std::pair{n_positions, "n_positions"},
                                  std::pair{vocab_size, "vocab_size"},
                                  std::pair{n_inner, "n_inner (4 n_embd where the config has none)"}}) {
      if (v == 0) throw error(fmt::format("{}: {} must be positive", source, name));
      if (v > max_dimension) {
        throw error(fmt::format("{}: {} = {} is implausibly large (limit {})", source, name, v,
                                max_dimension));
      }
    }
    if (n_embd % n_head != 0) {
      throw error(fmt::format("{}: n_embd = {} is not divisible by n_head = {}", source, n_embd,
                              n_head));
    }
    if (!(layer_norm_epsilon >= min_epsilon && layer_norm_epsilon <= max_epsilon)) {
      throw error(fmt::format("{}: layer_norm_epsilon = {} is outside [{}, {}]", source,
                              layer_norm_epsilon, min_epsilon, max_epsilon));
    }
    if (eos_token_id && !in_vocabulary(*eos_token_id, vocab_size)) {
      throw error(fmt::format("{}: eos_token_id = {} is not a token of the vocabulary of {}", source,
                              *eos_token_id, vocab_size));
    }
  }

  /// Reads the GPT-2 fields of a parsed `config.json` (`source` names it in errors):
  /// n_layer, n_head, n_embd, n_positions (else n_ctx), vocab_size, layer_norm_epsilon (default
  /// 1e-5), activation_function ("gelu_new" or "gelu_pytorch_tanh" when present), n_inner (null/absent = 4 C),
  /// tie_word_embeddings (default true; null reads as false), eos_token_id (an integer or null;
  /// none unless a token of the vocabulary). Fields of transformers' GPT2Config that would change the
  /// computation are refused unless absent or GPT-2's: model_type other than "gpt2" (or null),
  /// scale_attn_weights false or null (no 1/sqrt(d) in attention: transformers reads null as
  /// false), scale_attn_by_inverse_layer_idx true (another 1/(layer + 1)); these two must be
  /// booleans or null.
  [[nodiscard]] static config from_json(const nlohmann::json& j,
                                        const std::string& source = "config.json") {
    if (!j.is_object()) throw error(fmt::format("{}: not a JSON object", source));
    // A value of the file as a message quotes it: its JSON by its head (a string can be megabytes).
    const auto quoted = [](const nlohmann::json& v) { return io::detail::excerpt(v.dump()); };
    if (const auto it = j.find("model_type"); it != j.end() && !it->is_null() && *it != "gpt2") {
      throw error(fmt::format("{}: model_type {} is not supported (only \"gpt2\")", source, quoted(*it)));
    }
    // A flag that must be absent or `expected` (the computation GPT-2 does). transformers tests
    // it for truth, so null reads as false.
    const auto gpt2_flag = [&](const char* name, bool expected, const char* otherwise) {
      const auto it = j.find(name);
      if (it == j.end()) return;
      if (!it->is_boolean() && !it->is_null()) {
        throw error(fmt::format("{}: \"{}\" must be true or false, got {}", source, name, quoted(*it)));
      }
      if ((it->is_boolean() && it->get<bool>()) == expected) return;
      throw error(fmt::format("{}: {} = {} is not supported ({}; GPT-2 has {})", source, name, quoted(*it),
                              otherwise, expected));
    };
    gpt2_flag("scale_attn_weights", true, "attention scores not scaled by 1/sqrt(head size)");
    gpt2_flag("scale_attn_by_inverse_layer_idx", false, "attention scores scaled by 1/(layer + 1) as well");
    const auto size_field = [&](const char* name) -> std::size_t {
      const auto it = j.find(name);
      if (it == j.end()) throw error(fmt::format("{}: missing field \"{}\"", source, name));
      if (!it->is_number_unsigned() || it->get<std::uint64_t>() == 0) {
        throw error(fmt::format("{}: \"{}\" must be a positive integer, got {}", source, name,
                                quoted(*it)));
      }
      const auto v = it->get<std::uint64_t>();
      return static_cast<std::size_t>(v);
    };
    config c;
    c.n_layer = size_field("n_layer");
    c.n_head = size_field("n_head");
    c.n_embd = size_field("n_embd");
    if (!j.contains("n_positions") && !j.contains("n_ctx")) {
      throw error(fmt::format("{}: missing field \"n_positions\" (or \"n_ctx\")", source));
    }
    c.n_positions = j.contains("n_positions") ? size_field("n_positions") : size_field("n_ctx");
    c.vocab_size = size_field("vocab_size");
    if (const auto it = j.find("n_inner"); it != j.end() && !it->is_null()) {
      c.n_inner = size_field("n_inner");
    } else {
      c.n_inner = 4 * c.n_embd;
    }
    if (const auto it = j.find("layer_norm_epsilon"); it != j.end()) {
      const double e = it->is_number() ? it->get<double>() : 0.0;
      if (!(e >= double{min_epsilon} && e <= double{max_epsilon})) {  // keeps the conversion defined
        throw error(fmt::format("{}: \"layer_norm_epsilon\" must be a number in [{}, {}], got {}",
                                source, min_epsilon, max_epsilon, quoted(*it)));
      }
      c.layer_norm_epsilon = static_cast<float>(e);
    }
    if (const auto it = j.find("tie_word_embeddings"); it != j.end()) {
      if (!it->is_boolean() && !it->is_null()) {
        throw error(fmt::format("{}: \"tie_word_embeddings\" must be true or false, got {}", source, quoted(*it)));
      }
      c.tie_word_embeddings = it->is_boolean() && it->get<bool>();  // null: false, as transformers reads it
    }
    if (const auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
      // A list (several end tokens, as later models' configs allow) is no GPT-2 config: refused
      // rather than one of them picked.
      if (!it->is_number_integer()) {
        throw error(fmt::format("{}: \"eos_token_id\" must be an integer (a token id) or null, got {}", source,
                                quoted(*it)));
      }
      if (it->is_number_unsigned() && it->get<std::uint64_t>() < c.vocab_size) {
        c.eos_token_id = static_cast<token>(it->get<std::uint64_t>());
      }
    }
    if (const auto it = j.find("activation_function"); it != j.end() && !it->is_null()) {
      // "gelu_pytorch_tanh" is the same tanh approximation under its newer transformers name.
      if (!it->is_string() ||
          (it->get<std::string>() != "gelu_new" && it->get<std::string>() != "gelu_pytorch_tanh")) {
        throw error(fmt::format("{}: activation_function {} is not supported (only the tanh GELU: "
                                "\"gelu_new\" or \"gelu_pytorch_tanh\")",
                                source, quoted(*it)));
      }
    }
    c.validate(source);
    return c;
  }

  /// Reads and validates `path` (a Hugging Face GPT-2 `config.json`).
  [[nodiscard]] static config load(const std::filesystem::path& path) {
    const std::string text = io::read_file(path);
    return from_json(io::detail::parse_json_strict(text, path.string(), "config", max_json_values), path.string());
  }
};

}  // namespace specsample::gpt2
