#pragma once
/// @file weights.hpp
/// GPT-2 parameters in memory and their loader from a Hugging Face `model.safetensors`, or the
/// shards a `model.safetensors.index.json` lists (F32, F16 or BF16; with or without the
/// `transformer.` prefix).
///
/// Storage: the big matrices (the four matmul weights of every block and wte / lm_head) are
/// `weight_matrix`es kept in the checkpoint's precision — F16 stays F16 and BF16 stays BF16 (2
/// bytes per parameter, converted to F32 exactly inside the matmul kernels), F32 stays F32 — or
/// converted at load to the one `options::weight_storage` asks for (`weight_matrix::converted`),
/// packed in the panel layout the kernels stream, all in one allocation in the order a forward
/// pass streams them (`allocate_weight_storage`). The small tensors (layer-norm parameters,
/// biases, wpe) are F32 `xt::xtensor`s.

#include <specsample/error.hpp>
#include <specsample/io/safetensors.hpp>
#include <specsample/models/gpt2/config.hpp>
#include <specsample/models/gpt2/simd.hpp>

#include <fmt/format.h>
#include <xtensor/xtensor.hpp>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cassert>
#include <array>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specsample::gpt2 {

/// Bytes from which weight and KV-cache storage is aligned to, and advised as, transparent huge
/// pages.
inline constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// A standard allocator for the big buffers a forward pass streams (weights, KV cache): from
/// `huge_page_bytes` up, 2 MiB-aligned, rounded up to whole 2 MiB pages and advised
/// MADV_HUGEPAGE (Linux), so that streaming them takes a TLB entry per 2 MiB instead of per
/// 4 KiB; smaller buffers 64-byte aligned. Without THP the advice is a no-op. Measured A/B on the
/// bundled target (Zen 5, THP "madvise"; docs/gpt2.md, "Storage"): for the weights, an append of
/// 1 token 5–7% faster; for the KV cache (a call reads every layer's keys and values, 2.6 MB over
/// ~650 pages of 4 KiB at context 141), appends of 3 tokens 2–9% faster (median of eight pairs
/// 4%), of 5 tokens 0.3–5% (2%), 1 token within noise.
template <class T>
struct huge_page_allocator {
  using value_type = T;

  huge_page_allocator() = default;
  template <class U>
  huge_page_allocator(const huge_page_allocator<U>&) noexcept {}  // NOLINT: rebinding converts implicitly

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > max_size()) throw std::bad_alloc();
    const std::size_t bytes = n * sizeof(T);
    const bool huge = bytes >= huge_page_bytes;
    const std::size_t align = std::max(huge ? huge_page_bytes : std::size_t{64}, alignof(T));
    const std::size_t size = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, size);
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (huge) (void)::madvise(p, size, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  /// The largest n whose rounded-up size cannot overflow.
  [[nodiscard]] static constexpr std::size_t max_size() noexcept {
    return (std::numeric_limits<std::size_t>::max() - std::max(huge_page_bytes, alignof(T))) / sizeof(T);
  }

  template <class U>
  [[nodiscard]] bool operator==(const huge_page_allocator<U>&) const noexcept { return true; }
};

/// Zeroed storage for packed weights, from `huge_page_allocator` (huge pages from
/// `huge_page_bytes` up: a single-token decode streams every weight once, and with 4 KiB pages
/// that is a TLB miss per 4 KiB, 6,000 per token on the bundled target).
[[nodiscard]] inline std::shared_ptr<unsigned char[]> allocate_weight_storage(std::size_t bytes) {
  if (bytes == 0) return {};
  huge_page_allocator<unsigned char> alloc;
  unsigned char* p = alloc.allocate(bytes);
  std::memset(p, 0, bytes);
  return {p, [alloc, bytes](unsigned char* q) mutable { alloc.deallocate(q, bytes); }};
}

/// A (rows, cols) weight matrix in its storage precision (F32, or F16 / BF16 as raw 16-bit
/// patterns), packed in panels of 64 rows — [ceil(rows/64)][cols][64], padding rows zero;
/// `bf16_pairs` (`matmul_precision::bf16`): [ceil(rows/64)][ceil(cols/2)][64][2]; `i8_quads`
/// (`matmul_precision::int8`): [ceil(rows/64)][ceil(cols/4)][64][4] INT8, then a scale and an
/// integer sum per output — in one 64-byte aligned buffer (the layout the matmul kernels stream;
/// see simd.hpp). Row o is output channel o.
class weight_matrix {
 public:
  weight_matrix() = default;

  /// A zeroed (rows, cols) matrix of `format` with storage of its own.
  weight_matrix(weight_format format, std::size_t rows, std::size_t cols)
      : weight_matrix(format, rows, cols, allocate_weight_storage(packed_bytes(format, rows, cols))) {}

  /// A (rows, cols) matrix of `format` whose packed storage is the `packed_bytes(format, rows,
  /// cols)` zeroed bytes at `storage` (which it shares: one allocation can hold many matrices, in
  /// the order a forward pass streams them; see `weights::load`).
  weight_matrix(weight_format format, std::size_t rows, std::size_t cols,
                std::shared_ptr<unsigned char[]> storage) noexcept
      : format_(format), rows_(rows), cols_(cols), data_(std::move(storage)) {}

  /// Bytes of packed storage of a (rows, cols) matrix of `format` (padding rows included).
  [[nodiscard]] static constexpr std::size_t packed_bytes(weight_format format, std::size_t rows,
                                                          std::size_t cols) noexcept {
    return simd::packed_matrix_bytes(format, rows, cols);
  }

  /// Packs a row-major (rows, cols) matrix whose elements are in `format` (row o = output o),
  /// into `storage` when given (as the sharing constructor), else into storage of its own. (Not
  /// `bf16_pairs` or `i8_quads`, which only `converted` and `from_floats` make.)
  [[nodiscard]] static weight_matrix from_rows(weight_format format, std::size_t rows,
                                               std::size_t cols, const void* src,
                                               std::shared_ptr<unsigned char[]> storage = {}) {
    assert(simd::group_cols(format) == 1);
    weight_matrix m = make(format, rows, cols, std::move(storage));
    if (m.data_) simd::pack_rows(src, m.data_.get(), rows, cols, format_bytes(format));
    return m;
  }
  /// Packs a row-major (cols, rows) matrix — HF Conv1D's [in, out] — whose column o is output o
  /// (into `storage` as `from_rows`).
  [[nodiscard]] static weight_matrix from_columns(weight_format format, std::size_t rows,
                                                  std::size_t cols, const void* src,
                                                  std::shared_ptr<unsigned char[]> storage = {}) {
    assert(simd::group_cols(format) == 1);
    weight_matrix m = make(format, rows, cols, std::move(storage));
    if (m.data_) simd::pack_columns(src, m.data_.get(), rows, cols, format_bytes(format));
    return m;
  }
  /// Packs row-major F32 values, stored as `format` (F16 rounds to nearest even; BF16 too;
  /// `bf16_pairs` and `i8_quads` as `converted` does).
  [[nodiscard]] static weight_matrix from_floats(weight_format format, std::size_t rows,
                                                 std::size_t cols, const float* src) {
    if (format == weight_format::f32) return from_rows(format, rows, cols, src);
    if (simd::group_cols(format) != 1) return from_rows(weight_format::f32, rows, cols, src).converted(format);
    std::vector<std::uint16_t> h(rows * cols);
    simd::narrow(format, src, h.size(), h.data());
    return from_rows(format, rows, cols, h.data());
  }

  /// This matrix stored in `format`: into `storage` when given (`packed_bytes(format, rows,
  /// cols)` zeroed bytes, as the sharing constructor), else into storage of its own. To F32 every
  /// weight is kept exactly; to F16 or BF16 each is rounded to nearest even (relative error at most
  /// 2^-11 and 2^-8; F16 weights below 2^-14 lose precision, those up to 2^-25 become 0); to
  /// `bf16_pairs` as to BF16, by `simd::bf16_operand` (a subnormal F32 weight becomes 0), and
  /// re-laid out in column pairs; to `i8_quads` every output o is quantised by its own scale s_o =
  /// max_k |w(o, k)| / 127 to the integers w(o, k) / s_o rounded half to even (`simd::i8_value`;
  /// an output whose largest weight is below 2^-96 becomes zeros), re-laid out in column quads
  /// (at most `simd::i8_max_cols` columns). The same format copies every bit. Throws
  /// `specsample::error` naming the first weight that a finite value would turn into an infinity
  /// (F16: |w| >= 65520) instead of storing it.
  [[nodiscard]] weight_matrix converted(weight_format format,
                                        std::shared_ptr<unsigned char[]> storage = {}) const {
    if (format == weight_format::i8_quads && cols_ > simd::i8_max_cols) {
      throw error(fmt::format("a matrix of {} input columns is too wide for INT8 (at most {}: its integer sums "
                              "would overflow)", cols_, simd::i8_max_cols));
    }
    weight_matrix m = make(format, rows_, cols_, std::move(storage));
    if (!m.data_) return m;
    if (format == format_) {
      std::memcpy(m.raw(), data(), storage_bytes());
      return m;
    }
    if (simd::group_cols(format) != simd::group_cols(format_)) {
      m.relayout_from(*this);
      return m;
    }
    const std::size_t n = simd::panels(rows_) * simd::packed_cols(format, cols_) * simd::panel;  // padding included
    constexpr std::size_t chunk = 4096;
    std::vector<float> buf(std::min(chunk, n));
    for (std::size_t first = 0; first < n; first += chunk) {
      const std::size_t k = std::min(chunk, n - first);
      simd::convert(format_, data(), first, k, buf.data());
      if (format == weight_format::f32) {
        std::memcpy(static_cast<float*>(m.raw()) + first, buf.data(), k * sizeof(float));
        continue;
      }
      auto* out = static_cast<std::uint16_t*>(m.raw()) + first;
      simd::narrow(format, buf.data(), k, out);  // (BF16 pairs to BF16 pairs: exact)
      for (std::size_t i = 0; i < k; ++i) {
        if (overflowed(out[i], buf[i], format)) {
          const std::size_t e = first + i;  // (o, c) of packed element e, in the standard layout
          const std::size_t panel_elems = cols_ * simd::panel;
          overflow(e / panel_elems * simd::panel + e % simd::panel, e % panel_elems / simd::panel, buf[i],
                   format);
        }
      }
    }
    return m;
  }

  weight_matrix(weight_matrix&&) noexcept = default;
  weight_matrix& operator=(weight_matrix&&) noexcept = default;
  weight_matrix(const weight_matrix& o) : weight_matrix(o.format_, o.rows_, o.cols_) {
    if (data_) std::memcpy(data_.get(), o.data_.get(), storage_bytes());
  }
  weight_matrix& operator=(const weight_matrix& o) {
    if (this != &o) *this = weight_matrix(o);
    return *this;
  }
  ~weight_matrix() = default;

  /// Storage precision.
  [[nodiscard]] weight_format format() const noexcept { return format_; }
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  /// Extent of dimension `i` (0: rows, 1: cols).
  [[nodiscard]] std::size_t shape(std::size_t i) const noexcept { return i == 0 ? rows_ : cols_; }
  /// Number of parameters (rows × cols; 0 when empty).
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  /// Bytes of packed storage (padding rows included): what one pass of a matmul streams.
  [[nodiscard]] std::size_t bytes() const noexcept { return storage_bytes(); }
  /// The packed storage.
  [[nodiscard]] const void* data() const noexcept { return data_.get(); }
  /// The view the kernels take.
  [[nodiscard]] weight_view view() const noexcept { return {data(), format_, rows_, cols_}; }
  /// Element (r, c) as float (exact; `i8_quads`: its integer times the output's scale, rounded
  /// once — `simd::packed_value`).
  [[nodiscard]] float at(std::size_t r, std::size_t c) const noexcept { return simd::packed_value(view(), r, c); }
  /// The whole matrix as F32, row-major (rows, cols): for tests and tools.
  [[nodiscard]] std::vector<float> to_float() const {
    std::vector<float> out(size());
    for (std::size_t r = 0; r < rows_; ++r) {
      for (std::size_t c = 0; c < cols_; ++c) out[r * cols_ + c] = at(r, c);
    }
    return out;
  }

 private:
  static weight_matrix make(weight_format format, std::size_t rows, std::size_t cols,
                            std::shared_ptr<unsigned char[]> storage) {
    if (!storage) return weight_matrix(format, rows, cols);
    return weight_matrix(format, rows, cols, std::move(storage));
  }
  [[nodiscard]] std::size_t storage_bytes() const noexcept { return packed_bytes(format_, rows_, cols_); }
  [[nodiscard]] void* raw() noexcept { return data_.get(); }
  // Fills this matrix (zeroed, of another layout) with `src`'s weights: into BF16 pairs 64 rows
  // of a panel column at a time, into INT8 quads a panel at a time, out of either one weight at a
  // time.
  void relayout_from(const weight_matrix& src) {
    if (format_ == weight_format::i8_quads) {
      quantize_from(src);
      return;
    }
    if (format_ != weight_format::bf16_pairs) {
      for (std::size_t r = 0; r < rows_; ++r) {
        for (std::size_t c = 0; c < cols_; ++c) set(r, c, src.at(r, c));
      }
      return;
    }
    float col[simd::panel];
    auto* out = static_cast<std::uint16_t*>(raw());
    for (std::size_t p = 0; p < simd::panels(rows_); ++p) {
      const std::size_t n = std::min(simd::panel, rows_ - p * simd::panel);
      for (std::size_t c = 0; c < cols_; ++c) {
        src.column(p * simd::panel, n, c, col);
        for (std::size_t j = 0; j < n; ++j) {
          const std::uint16_t h = simd::bf16_operand(col[j]);
          if (overflowed(h, col[j], format_)) overflow(p * simd::panel + j, c, col[j], format_);
          out[simd::packed_index(format_, p * simd::panel + j, c, cols_)] = h;
        }
      }
    }
  }
  // col[j] = at(o0 + j, c) for j < n (n outputs of one panel): in one conversion from the
  // standard layout, where they are contiguous.
  void column(std::size_t o0, std::size_t n, std::size_t c, float* col) const noexcept {
    if (simd::group_cols(format_) == 1) {
      simd::convert(format_, data(), simd::packed_index(format_, o0, c, cols_), n, col);
      return;
    }
    for (std::size_t j = 0; j < n; ++j) col[j] = at(o0 + j, c);
  }
  // Quantises `src` (finite weights: the loader checks) into this `i8_quads` matrix, per output.
  void quantize_from(const weight_matrix& src) {
    const simd::i8_meta meta = simd::i8_meta_of(data(), rows_, cols_);
    auto* scales = const_cast<float*>(meta.scale);  // (this matrix's own storage)
    auto* sums = const_cast<std::int32_t*>(meta.sum);
    auto* out = static_cast<std::int8_t*>(raw());
    std::vector<float> block(cols_ * simd::panel), row(cols_);
    for (std::size_t p = 0; p < simd::panels(rows_); ++p) {
      const std::size_t o0 = p * simd::panel, n = std::min(simd::panel, rows_ - o0);
      for (std::size_t c = 0; c < cols_; ++c) src.column(o0, n, c, block.data() + c * simd::panel);
      for (std::size_t j = 0; j < n; ++j) {
        for (std::size_t c = 0; c < cols_; ++c) row[c] = block[c * simd::panel + j];
        const simd::i8_scaling s = simd::i8_scaling_of(row.data(), cols_);
        std::int32_t sum = 0;
        for (std::size_t c = 0; c < cols_; ++c) {
          const int q = simd::i8_value(row[c], s.inverse);
          out[simd::packed_index(format_, o0 + j, c, cols_)] = static_cast<std::int8_t>(q);
          sum += q;
        }
        scales[o0 + j] = s.scale;
        sums[o0 + j] = sum;
      }
    }
  }
  // Stores `value` as weight (r, c) of this matrix (F32, F16 or BF16 in the standard layout).
  void set(std::size_t r, std::size_t c, float value) {
    const std::size_t i = simd::packed_index(format_, r, c, cols_);
    if (format_ == weight_format::f32) {
      static_cast<float*>(raw())[i] = value;
      return;
    }
    std::uint16_t h = 0;
    simd::narrow(format_, &value, 1, &h);
    if (overflowed(h, value, format_)) overflow(r, c, value, format_);
    static_cast<std::uint16_t*>(raw())[i] = h;
  }
  // Whether the finite `value` became an infinity as `h` in the 16-bit `format`.
  static bool overflowed(std::uint16_t h, float value, weight_format format) noexcept {
    const std::uint16_t inf = format == weight_format::f16 ? 0x7C00u : 0x7F80u;
    return (h & 0x7FFFu) == inf && std::isfinite(value);
  }
  // Weight (row, col), finite `value`, would be infinite in `format`.
  [[noreturn]] void overflow(std::size_t row, std::size_t col, float value, weight_format format) const {
    const char* advice = format == weight_format::f16          ? "hold this matrix as F32 or BF16"
                         : format == weight_format::bf16_pairs ? "multiply in F32 (matmul_precision F32)"
                                                               : "hold this matrix as F32";
    throw error(fmt::format("weight ({}, {}) = {} is outside the range of {} (largest finite value {}): {}", row,
                            col, value, format_name(format), format == weight_format::f16 ? "65504" : "3.39e+38",
                            advice));
  }

  weight_format format_ = weight_format::f32;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::shared_ptr<unsigned char[]> data_;
};

/// One transformer block. Matmul weights are stored (OC, C) — transposed from HF Conv1D's
/// [C, OC] — so every output channel is one contiguous dot product.
struct layer_weights {
  xt::xtensor<float, 1> ln_1_weight, ln_1_bias;  // (C)
  weight_matrix attn_qkv_weight;                 // (3C, C)   HF attn.c_attn.weight [C, 3C]
  xt::xtensor<float, 1> attn_qkv_bias;           // (3C)
  weight_matrix attn_proj_weight;                // (C, C)    HF attn.c_proj.weight [C, C]
  xt::xtensor<float, 1> attn_proj_bias;          // (C)
  xt::xtensor<float, 1> ln_2_weight, ln_2_bias;  // (C)
  weight_matrix mlp_fc_weight;                   // (I, C)    HF mlp.c_fc.weight [C, I], I = n_inner
  xt::xtensor<float, 1> mlp_fc_bias;             // (I)
  weight_matrix mlp_proj_weight;                 // (C, I)    HF mlp.c_proj.weight [I, C]
  xt::xtensor<float, 1> mlp_proj_bias;           // (C)

  /// The block's four matmul weights and its eight F32 vectors (layer norms and biases), the
  /// lists every count over a block's tensors walks.
  static constexpr std::array matmuls{&layer_weights::attn_qkv_weight, &layer_weights::attn_proj_weight,
                                      &layer_weights::mlp_fc_weight, &layer_weights::mlp_proj_weight};
  static constexpr std::array vectors{&layer_weights::ln_1_weight,    &layer_weights::ln_1_bias,
                                      &layer_weights::attn_qkv_bias,  &layer_weights::attn_proj_bias,
                                      &layer_weights::ln_2_weight,    &layer_weights::ln_2_bias,
                                      &layer_weights::mlp_fc_bias,    &layer_weights::mlp_proj_bias};
};

/// All GPT-2 parameters.
struct weights {
  weight_matrix wte;          // (V, C) token embedding, also the tied output projection
  xt::xtensor<float, 2> wpe;  // (P, C) position embedding (F32)
  std::vector<layer_weights> layers;
  xt::xtensor<float, 1> ln_f_weight, ln_f_bias;  // (C)
  weight_matrix lm_head;                         // (V, C) when untied (lm_head.weight), else empty

  /// The (V, C) matrix the logits are computed with: lm_head when present, else wte (tied).
  [[nodiscard]] const weight_matrix& output_embedding() const noexcept {
    return lm_head.size() != 0 ? lm_head : wte;
  }

  /// Number of parameters held (a separate lm_head counted once).
  [[nodiscard]] std::size_t parameter_count() const noexcept {
    std::size_t n = wte.size() + wpe.size() + lm_head.size() + vector_floats();
    for (const layer_weights& l : layers) {
      for (const auto m : layer_weights::matmuls) n += (l.*m).size();
    }
    return n;
  }

  /// Bytes a single-token forward pass streams through the matmuls: every block's four matmul
  /// weights plus the output embedding.
  [[nodiscard]] std::size_t matmul_bytes() const noexcept {
    std::size_t n = output_embedding().bytes();
    for (const layer_weights& l : layers) {
      for (const auto m : layer_weights::matmuls) n += (l.*m).bytes();
    }
    return n;
  }

  /// Bytes of weights a single-token forward pass reads, as held: `matmul_bytes()`, every layer
  /// norm's and bias's F32 vector, one row of wpe (the position's) and, where the logits use a
  /// separate lm_head, one row of wte (the token's embedding; tied, wte is read whole as the output
  /// embedding). What the decode's bandwidth is measured in; not the checkpoint file's size, which
  /// also holds the whole wpe, the `attn.bias` masks the loader ignores and the header.
  [[nodiscard]] std::size_t decode_bytes() const noexcept {
    const std::size_t floats = vector_floats() + (wpe.shape(0) > 0 ? wpe.shape(1) : 0);
    std::size_t n = matmul_bytes() + floats * sizeof(float);
    if (lm_head.size() != 0 && wte.rows() > 0) n += wte.bytes() / wte.rows();
    return n;
  }

  /// Loads and checks every tensor against `cfg` (`config_name` names the config in errors).
  /// Accepts keys with or without the `transformer.` prefix, ignores `h.N.attn.bias` /
  /// `h.N.attn.masked_bias` buffers and anything else unknown; uses `lm_head.weight` (required) when
  /// `cfg.tie_word_embeddings` is false, and wte otherwise, as transformers does.
  /// The matmul weights keep the checkpoint's precision, or are held in `storage` when given
  /// (`weight_matrix::converted`, one matrix at a time: `options::weight_storage`).
  /// Every shape is validated before anything is allocated. Throws `specsample::error` naming
  /// the file, the tensor, and the expected and actual shape (or the value out of range).
  [[nodiscard]] static weights load(const io::safetensors_checkpoint& file, const config& cfg,
                                    const std::string& config_name = "config.json",
                                    std::optional<weight_format> storage = {});

  /// Every matmul weight held in `format` (`weight_matrix::converted`; the others are F32
  /// already). Matrices already in `format` are left as they are.
  void convert(weight_format format) {
    const auto to = [format](weight_matrix& m) {
      if (m.size() != 0 && m.format() != format) m = m.converted(format);
    };
    for (layer_weights& l : layers) {
      for (const auto m : layer_weights::matmuls) to(l.*m);
    }
    to(wte);
    to(lm_head);
  }

 private:
  // Floats of the F32 vectors: ln_f's and every block's layer norms and biases.
  [[nodiscard]] std::size_t vector_floats() const noexcept {
    std::size_t n = ln_f_weight.size() + ln_f_bias.size();
    for (const layer_weights& l : layers) {
      for (const auto v : layer_weights::vectors) n += (l.*v).size();
    }
    return n;
  }
};

namespace detail {

/// Converts `n` elements of a floating-point tensor starting at element `first` into `out`.
inline void convert_floats(const io::tensor_view& t, std::size_t first, std::size_t n, float* out) {
  const std::byte* p = t.data.data();
  switch (t.dtype) {
    case io::dtype::f32:
      std::memcpy(out, p + 4 * first, 4 * n);
      return;
    case io::dtype::f16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h = 0;
        std::memcpy(&h, p + 2 * (first + i), 2);
        out[i] = io::f16_to_float(h);
      }
      return;
    case io::dtype::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h = 0;
        std::memcpy(&h, p + 2 * (first + i), 2);
        out[i] = io::bf16_to_float(h);
      }
      return;
    default:
      break;
  }
}

/// The index of the first of the `n` values of type U at `p` whose bits include all of `bits`
/// (n when none). A block of 4096 values is tested without a branch per value, an OR
/// reduction of U-sized flags that GCC 12 vectorises at -O3 (0.9 ms for 24.6 MB of F16 in a
/// scratch benchmark; a `bool` flag stayed scalar, 4.3 ms).
template <class U>
[[nodiscard]] std::size_t first_with_bits(const std::byte* p, std::size_t n, U bits) {
  constexpr std::size_t block = 4096;
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t e = std::min(n, b + block);
    U hits = 0;
    for (std::size_t i = b; i < e; ++i) {
      U u{};
      std::memcpy(&u, p + sizeof(U) * i, sizeof(U));
      hits |= static_cast<U>((u & bits) == bits);
    }
    if (hits == 0) continue;
    for (std::size_t i = b; i < e; ++i) {
      U u{};
      std::memcpy(&u, p + sizeof(U) * i, sizeof(U));
      if ((u & bits) == bits) return i;
    }
  }
  return n;
}

/// The index of the first NaN or infinity (all exponent bits set) in floating-point tensor `t`,
/// or its numel() when there is none.
[[nodiscard]] inline std::size_t first_non_finite(const io::tensor_view& t) {
  const std::byte* p = t.data.data();
  switch (t.dtype) {
    case io::dtype::f32: return first_with_bits(p, t.numel(), std::uint32_t{0x7F800000});
    case io::dtype::f16: return first_with_bits(p, t.numel(), std::uint16_t{0x7C00});
    case io::dtype::bf16: return first_with_bits(p, t.numel(), std::uint16_t{0x7F80});
    default: return t.numel();
  }
}

/// Looks tensors up with the checkpoint's prefix and checks dtype and shape.
class tensor_loader {
 public:
  tensor_loader(const io::safetensors_checkpoint& file, const config& cfg, std::string config_name,
                std::optional<weight_format> storage)
      : file_(file), cfg_(cfg), config_name_(std::move(config_name)), storage_(storage) {
    if (file.contains("transformer.wte.weight")) {
      prefix_ = "transformer.";
    } else if (!file.contains("wte.weight")) {
      throw error(fmt::format("{}: missing tensor 'wte.weight' (also looked for "
                              "'transformer.wte.weight'): not a GPT-2 checkpoint?",
                              file.path().string()));
    }
  }

  /// The checked view of `name` (prefixed unless `top_level`) with the expected shape.
  const io::tensor_view& get(const std::string& name, std::vector<std::size_t> shape,
                             bool top_level = false) const {
    const std::string key = top_level ? name : prefix_ + name;
    const io::tensor_view* t = file_.find(key);
    if (t == nullptr) {
      throw error(fmt::format("{}: missing tensor '{}' (expected shape {})", file_.path().string(),
                              key, io::detail::shape_string(shape)));
    }
    if (!io::is_floating(t->dtype)) {
      throw error(fmt::format("{}: tensor '{}' has dtype {}, expected F32, F16 or BF16",
                              file_.path_of(*t).string(), key, io::dtype_name(t->dtype)));
    }
    if (t->shape != shape) {
      throw error(fmt::format("{}: tensor '{}' has shape {}, expected {} (from {}: n_layer={}, "
                              "n_head={}, n_embd={}, n_positions={}, vocab_size={}, n_inner={}); "
                              "the config does not match the tensors",
                              file_.path_of(*t).string(), key, io::detail::shape_string(t->shape),
                              io::detail::shape_string(shape), config_name_, cfg_.n_layer,
                              cfg_.n_head, cfg_.n_embd, cfg_.n_positions, cfg_.vocab_size,
                              cfg_.n_inner));
    }
    return *t;
  }

  /// Loads `name` as is (1-D or 2-D, same layout as the file).
  template <std::size_t N>
  void load(xt::xtensor<float, N>& dst, const std::string& name, std::vector<std::size_t> shape,
            bool top_level = false) const {
    const io::tensor_view& t = get(name, shape, top_level);
    typename xt::xtensor<float, N>::shape_type s;
    std::copy(shape.begin(), shape.end(), s.begin());
    dst = xt::xtensor<float, N>::from_shape(s);
    convert_floats(t, 0, t.numel(), dst.data());
    check_finite(t);
  }

  /// A matmul weight to load: the tensor `name`, the (rows, cols) matrix it becomes (row o =
  /// output o) and whether the file holds it transposed (HF Conv1D's [in, out] = [cols, rows]).
  struct matrix_spec {
    weight_matrix* dst;
    std::string name;
    std::size_t rows, cols;
    bool transposed = false;
    bool top_level = false;
  };

  /// The precision `m` is held in: the checkpoint's, or the one asked for.
  [[nodiscard]] weight_format format(const matrix_spec& m) const {
    return storage_.value_or(format_of(view(m).dtype));
  }

  /// Packed bytes of `m` in that precision.
  [[nodiscard]] std::size_t packed_bytes(const matrix_spec& m) const {
    return weight_matrix::packed_bytes(format(m), m.rows, m.cols);
  }

  /// Loads `m` into *m.dst, packed into `storage` (packed_bytes(m) zeroed bytes): in the
  /// checkpoint's precision, or packed in it first and then converted.
  void load_matrix(const matrix_spec& m, std::shared_ptr<unsigned char[]> storage) const {
    const io::tensor_view& t = view(m);
    const weight_format stored = format_of(t.dtype);
    const weight_format held = storage_.value_or(stored);
    const bool keep = held == stored;
    weight_matrix packed = m.transposed ? weight_matrix::from_columns(stored, m.rows, m.cols, t.data.data(),
                                                                      keep ? std::move(storage) : nullptr)
                                        : weight_matrix::from_rows(stored, m.rows, m.cols, t.data.data(),
                                                                   keep ? std::move(storage) : nullptr);
    check_finite(t);
    if (keep) {
      *m.dst = std::move(packed);
      return;
    }
    try {
      *m.dst = packed.converted(held, std::move(storage));
    } catch (const error& e) {
      throw error(fmt::format("{}: tensor '{}' ({} x {} as output x input channels), options::{}: {}",
                              file_.path_of(t).string(), io::detail::excerpt(t.name), m.rows, m.cols,
                              held == weight_format::bf16_pairs ? "matmul_precision BF16"
                              : held == weight_format::i8_quads ? "matmul_precision INT8"
                                                                : "weight_storage",
                              e.what()));
    }
  }

  /// Throws if the file has blocks beyond n_layer (the config disagrees with the tensors).
  void check_no_extra_layers() const {
    const std::string h = prefix_ + "h.";
    for (const io::tensor_view* tp : file_.tensors()) {
      const io::tensor_view& t = *tp;
      if (t.name.rfind(h, 0) != 0) continue;
      std::size_t layer = 0;
      std::size_t i = h.size();
      bool digits = false;
      const auto digit = [&](std::size_t at) { return at < t.name.size() && t.name[at] >= '0' && t.name[at] <= '9'; };
      while (digit(i) && layer < (1u << 20)) {  // (the value up to 2^20 · 10: no overflow)
        layer = layer * 10 + static_cast<std::size_t>(t.name[i] - '0');
        digits = true;
        ++i;
      }
      if (digits && layer >= cfg_.n_layer) {
        // The block as the name writes it where the value was cut short (a number past 2^20).
        std::size_t end = i;
        while (digit(end)) ++end;
        const std::string block = end > i ? t.name.substr(h.size(), end - h.size()) : std::to_string(layer);
        throw error(fmt::format("{}: tensor '{}' belongs to block {} but {} says n_layer = {}; "
                                "the config does not match the tensors",
                                file_.path_of(t).string(), io::detail::excerpt(t.name), io::detail::excerpt(block),
                                config_name_, cfg_.n_layer));
      }
    }
  }

  [[nodiscard]] const io::safetensors_checkpoint& file() const noexcept { return file_; }

 private:
  // Every value of `t` finite: a NaN or an infinity in a checkpoint (a corrupt file, a diverged
  // training run) is reported at load, naming the tensor, not as NaN logits later. Run right
  // after the tensor is copied, while its bytes are still in cache. Loading the bundled target
  // (-O3, min of 21 loads, three runs): 14.4–15.0 ms without the check, 15.4–16.0 ms with it.
  void check_finite(const io::tensor_view& t) const {
    const std::size_t i = first_non_finite(t);
    if (i == t.numel()) return;
    float value = 0.0f;
    convert_floats(t, i, 1, &value);
    throw error(fmt::format("{}: tensor '{}' holds {} at element {}: a corrupt or diverged checkpoint",
                            file_.path_of(t).string(), io::detail::excerpt(t.name), value, i));
  }

  const io::tensor_view& view(const matrix_spec& m) const {
    return m.transposed ? get(m.name, {m.cols, m.rows}) : get(m.name, {m.rows, m.cols}, m.top_level);
  }
  static weight_format format_of(io::dtype d) noexcept {
    return d == io::dtype::f16 ? weight_format::f16
                               : (d == io::dtype::bf16 ? weight_format::bf16 : weight_format::f32);
  }

  const io::safetensors_checkpoint& file_;
  const config& cfg_;
  std::string config_name_;
  std::optional<weight_format> storage_;
  std::string prefix_;
};

}  // namespace detail

inline weights weights::load(const io::safetensors_checkpoint& file, const config& cfg,
                             const std::string& config_name, std::optional<weight_format> storage) {
  const detail::tensor_loader ld(file, cfg, config_name, storage);
  const std::size_t C = cfg.n_embd, V = cfg.vocab_size, P = cfg.n_positions, I = cfg.n_inner;
  // Tied (the default), the logits use wte, and an lm_head.weight in the file must be a copy of
  // it: transformers versions disagree on what a tied file with another lm_head means (one ties
  // both to the file's lm_head, one keeps them apart, one ties both to wte). Untied, the logits
  // use lm_head.weight, which must be there.
  const bool has_lm_head = !cfg.tie_word_embeddings;
  if (has_lm_head && !file.contains("lm_head.weight")) {
    throw error(fmt::format("{}: missing tensor 'lm_head.weight' (expected shape {}): {} has tie_word_embeddings "
                            "= false, so the logits need their own matrix",
                            file.path().string(), io::detail::shape_string(std::array<std::size_t, 2>{V, C}), config_name));
  }

  // Pass 1: every shape and dtype, before allocating anything.
  ld.check_no_extra_layers();
  (void)ld.get("wte.weight", {V, C});
  (void)ld.get("wpe.weight", {P, C});
  for (std::size_t l = 0; l < cfg.n_layer; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    (void)ld.get(h + "ln_1.weight", {C});
    (void)ld.get(h + "ln_1.bias", {C});
    (void)ld.get(h + "attn.c_attn.weight", {C, 3 * C});
    (void)ld.get(h + "attn.c_attn.bias", {3 * C});
    (void)ld.get(h + "attn.c_proj.weight", {C, C});
    (void)ld.get(h + "attn.c_proj.bias", {C});
    (void)ld.get(h + "ln_2.weight", {C});
    (void)ld.get(h + "ln_2.bias", {C});
    (void)ld.get(h + "mlp.c_fc.weight", {C, I});
    (void)ld.get(h + "mlp.c_fc.bias", {I});
    (void)ld.get(h + "mlp.c_proj.weight", {I, C});
    (void)ld.get(h + "mlp.c_proj.bias", {C});
  }
  (void)ld.get("ln_f.weight", {C});
  (void)ld.get("ln_f.bias", {C});
  if (file.contains("lm_head.weight")) {
    const io::tensor_view& head = ld.get("lm_head.weight", {V, C}, /*top_level=*/true);
    const io::tensor_view& wte = ld.get("wte.weight", {V, C});
    if (!has_lm_head && (head.dtype != wte.dtype || !std::ranges::equal(head.bytes(), wte.bytes()))) {
      // (A whole V x C comparison, 321 MB for gpt2-xl in F32, only for a file holding both.)
      throw error(fmt::format("{}: {} ties the output projection to wte (tie_word_embeddings true or absent), but "
                              "'lm_head.weight' ({}) differs from '{}' ({}): set \"tie_word_embeddings\": false to "
                              "compute the logits with it, or remove it",
                              file.path_of(head).string(), config_name, io::dtype_name(head.dtype), wte.name,
                              io::dtype_name(wte.dtype)));
    }
  }

  // Pass 2: convert, checking that every value is finite. The matmul weights share one
  // allocation (`allocate_weight_storage`: huge pages when large), laid out in the order a forward
  // pass streams them — block 0's qkv, proj, fc and proj, block 1's, …, the output projection —
  // and wte last (the embedding reads one row per token; tied, wte is the output projection).
  weights w;
  w.layers.resize(cfg.n_layer);
  using spec = detail::tensor_loader::matrix_spec;
  std::vector<spec> matrices;
  for (std::size_t l = 0; l < cfg.n_layer; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    layer_weights& lw = w.layers[l];
    matrices.push_back(spec{&lw.attn_qkv_weight, h + "attn.c_attn.weight", 3 * C, C, true});
    matrices.push_back(spec{&lw.attn_proj_weight, h + "attn.c_proj.weight", C, C, true});
    matrices.push_back(spec{&lw.mlp_fc_weight, h + "mlp.c_fc.weight", I, C, true});
    matrices.push_back(spec{&lw.mlp_proj_weight, h + "mlp.c_proj.weight", C, I, true});
  }
  if (has_lm_head) matrices.push_back(spec{&w.lm_head, "lm_head.weight", V, C, false, /*top_level=*/true});
  matrices.push_back(spec{&w.wte, "wte.weight", V, C});
  const auto slot = [](std::size_t bytes) { return (bytes + 63) / 64 * 64; };
  std::size_t total = 0;
  for (const spec& m : matrices) total += slot(ld.packed_bytes(m));
  std::shared_ptr<unsigned char[]> arena;
  try {
    arena = allocate_weight_storage(total);
  } catch (const std::bad_alloc&) {
    throw error(fmt::format("{}: out of memory for the matmul weights ({:.3g} GB as held, in panels of {} rows)",
                            file.path().string(), static_cast<double>(total) / 1e9, simd::panel));
  }
  std::size_t offset = 0;
  for (const spec& m : matrices) {
    ld.load_matrix(m, std::shared_ptr<unsigned char[]>(arena, arena.get() + offset));  // (aliasing)
    offset += slot(ld.packed_bytes(m));
  }

  ld.load(w.wpe, "wpe.weight", {P, C});
  for (std::size_t l = 0; l < cfg.n_layer; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    layer_weights& lw = w.layers[l];
    ld.load(lw.ln_1_weight, h + "ln_1.weight", {C});
    ld.load(lw.ln_1_bias, h + "ln_1.bias", {C});
    ld.load(lw.attn_qkv_bias, h + "attn.c_attn.bias", {3 * C});
    ld.load(lw.attn_proj_bias, h + "attn.c_proj.bias", {C});
    ld.load(lw.ln_2_weight, h + "ln_2.weight", {C});
    ld.load(lw.ln_2_bias, h + "ln_2.bias", {C});
    ld.load(lw.mlp_fc_bias, h + "mlp.c_fc.bias", {I});
    ld.load(lw.mlp_proj_bias, h + "mlp.c_proj.bias", {C});
  }
  ld.load(w.ln_f_weight, "ln_f.weight", {C});
  ld.load(w.ln_f_bias, "ln_f.bias", {C});
  return w;
}

}  // namespace specsample::gpt2
