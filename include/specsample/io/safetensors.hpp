#pragma once
/// @file safetensors.hpp
/// A validating, memory-mapped reader (and a small writer) for the safetensors format.
///
/// Layout (https://github.com/huggingface/safetensors): an 8-byte little-endian u64 header length
/// N, then N bytes of UTF-8 JSON (an object: tensor name -> {"dtype", "shape", "data_offsets":
/// [begin, end]}, plus an optional "__metadata__" string -> string map), then the data section.
/// Offsets are relative to the start of the data section. Everything is validated before any
/// tensor byte is touched; every failure throws `specsample::error` naming the file.

#include <specsample/error.hpp>
#include <specsample/io/half.hpp>
#include <specsample/io/json.hpp>
#include <specsample/io/mapped_file.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace specsample::io {

static_assert(std::endian::native == std::endian::little,
              "specsample::io reads safetensors (little-endian) by memcpy: big-endian hosts are "
              "not supported");

/// Element types of the safetensors format (every one of a byte or more). The reader checks any
/// tensor's layout (its bytes = elements × size, in bounds, not overlapping); the conversions below
/// read F32, F16 and BF16 as floats and I32 and I64 as integers, and refuse the rest by name — so a
/// tensor a model does not use may be of any of them (older transformers saved GPT-2's causal-mask
/// buffer `attn.bias` as U8, later ones as BOOL).
enum class dtype : std::uint8_t {
  f32, f16, bf16, i32, i64,  // (the ones the conversions read)
  f64, i8, i16, u8, u16, u32, u64, boolean, f8_e4m3, f8_e5m2, f8_e8m0
};

/// The safetensors spelling of `t` ("F32", "F16", "BF16", "I32", "I64", "BOOL", "F8_E4M3", ...).
[[nodiscard]] constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "F32";
    case dtype::f16: return "F16";
    case dtype::bf16: return "BF16";
    case dtype::i32: return "I32";
    case dtype::i64: return "I64";
    case dtype::f64: return "F64";
    case dtype::i8: return "I8";
    case dtype::i16: return "I16";
    case dtype::u8: return "U8";
    case dtype::u16: return "U16";
    case dtype::u32: return "U32";
    case dtype::u64: return "U64";
    case dtype::boolean: return "BOOL";
    case dtype::f8_e4m3: return "F8_E4M3";
    case dtype::f8_e5m2: return "F8_E5M2";
    case dtype::f8_e8m0: return "F8_E8M0";
  }
  return "?";
}

/// Size of one element of `t` in bytes.
[[nodiscard]] constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
    case dtype::u64: return 8;
    case dtype::f32:
    case dtype::i32:
    case dtype::u32: return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16:
    case dtype::u16: return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
    case dtype::f8_e4m3:
    case dtype::f8_e5m2:
    case dtype::f8_e8m0: return 1;
  }
  return 0;
}

/// Every dtype the reader knows.
inline constexpr dtype all_dtypes[] = {dtype::f32,  dtype::f16,  dtype::bf16, dtype::i32,     dtype::i64,     dtype::f64,
                                       dtype::i8,   dtype::i16,  dtype::u8,   dtype::u16,     dtype::u32,     dtype::u64,
                                       dtype::boolean, dtype::f8_e4m3, dtype::f8_e5m2, dtype::f8_e8m0};

/// Parses a safetensors dtype string; `std::nullopt` for one this reader does not know (the
/// format's packed sub-byte types F4, F6_E2M3 and F6_E3M2 among them).
[[nodiscard]] constexpr std::optional<dtype> parse_dtype(std::string_view s) noexcept {
  for (const dtype t : all_dtypes) {
    if (s == dtype_name(t)) return t;
  }
  return std::nullopt;
}

/// True for F32, F16 and BF16.
[[nodiscard]] constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16;
}

/// One tensor of a safetensors file: a view into the file's bytes (no copy). Valid as long as the
/// `safetensors_file` it came from is alive. The bytes may be unaligned: read them with the
/// conversion helpers below (or memcpy).
struct tensor_view {
  std::string name;                ///< the key in the header
  io::dtype dtype = io::dtype::f32;  ///< element type
  std::vector<std::size_t> shape;  ///< dimensions, outermost first (row-major)
  std::span<const std::byte> data;  ///< the raw little-endian bytes, numel() * dtype_size()

  /// Number of elements (product of the shape; 1 for a scalar).
  [[nodiscard]] std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (const std::size_t d : shape) n *= d;
    return n;
  }
  /// The raw bytes (same as `data`).
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return data; }
};

namespace detail {

inline constexpr std::uint64_t max_header_bytes = 100'000'000;  // same cap as the Rust reference
/// The most JSON values (every scalar, object and array) a header may hold. A tensor's entry holds
/// 6 and one a dimension (its object, dtype, shape and offsets arrays, the two offsets): room for
/// some 250 000 tensors, where real checkpoints have at most tens of thousands. The document takes
/// tens of bytes a value: at the bound 180–460 MB (2 million zeros, empty objects or strings);
/// unbounded, 25–35 bytes a byte of header, 3 GB for a crafted one within `max_header_bytes`.
inline constexpr std::size_t max_header_values = 2'000'000;
/// The same for a shard index (`*.safetensors.index.json`): a value a tensor in its weight_map.
inline constexpr std::size_t max_index_values = max_header_values;

[[nodiscard]] inline bool mul_overflows(std::size_t a, std::size_t b, std::size_t& out) noexcept {
  return __builtin_mul_overflow(a, b, &out);
}

/// "[a, b, ...]", cut at 160 bytes (`excerpt`): a file's shape may hold millions of dimensions.
[[nodiscard]] inline std::string shape_string(std::span<const std::size_t> shape) {
  return excerpt(fmt::format("[{}]", fmt::join(shape, ", ")), 160);
}

/// The parsed header: views into `file` and the metadata map.
struct parsed_header {
  std::vector<tensor_view> tensors;  // sorted by name
  std::map<std::string, std::string, std::less<>> metadata;
};

[[nodiscard]] inline std::size_t json_size(const nlohmann::json& j, bool& ok) {
  if (j.is_number_unsigned()) {
    const auto v = j.get<std::uint64_t>();
    if (v <= std::numeric_limits<std::size_t>::max()) return static_cast<std::size_t>(v);
  } else if (j.is_number_integer() && j.get<std::int64_t>() >= 0) {
    return static_cast<std::size_t>(j.get<std::int64_t>());
  }
  ok = false;
  return 0;
}

// Why `json_size` refused j, for a message: nlohmann parses an integer of 2^64 or more as a
// float, which is not "not an integer".
[[nodiscard]] inline const char* json_size_problem(const nlohmann::json& j) {
  if (j.is_number_float() && j.get<double>() >= 0x1p64 && j.get<double>() == std::floor(j.get<double>())) {
    return "too large (2^64 or more)";
  }
  if (j.is_number_unsigned()) return "too large for a size on this platform";
  return "not a non-negative integer";
}

/// Validates the whole file layout and returns views into `file`.
[[nodiscard]] inline parsed_header parse_safetensors(std::span<const std::byte> file,
                                                     const std::string& label) {
  if (file.size() < 8) {
    throw error(fmt::format(
        "{}: file is too small to be safetensors ({} bytes; the header length alone is 8)", label,
        file.size()));
  }
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const std::uint64_t available = file.size() - 8;
  if (n > available) {
    throw error(fmt::format("{}: header length {} exceeds the file size ({} bytes after the "
                            "8-byte length; file truncated or not safetensors)",
                            label, n, available));
  }
  if (n > max_header_bytes) {
    throw error(fmt::format("{}: header length {} exceeds the limit of {} bytes", label, n,
                            max_header_bytes));
  }
  const auto header_len = static_cast<std::size_t>(n);
  const std::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_len);
  const nlohmann::json header = parse_json_strict(text, label, "header", max_header_values);
  if (!header.is_object()) {
    throw error(fmt::format("{}: header is not a JSON object", label));
  }
  if (text.front() != '{') {  // (JSON parsers skip a UTF-8 byte order mark and whitespace; the format does not)
    throw error(fmt::format("{}: header has {} bytes before its opening '{{' ({}); a safetensors header begins "
                            "with '{{', as the format's reference reader requires",
                            label, text.find('{'), text.starts_with("\xEF\xBB\xBF") ? "a UTF-8 byte order mark" : "whitespace"));
  }
  const std::span<const std::byte> data_section = file.subspan(8 + header_len);

  parsed_header out;
  struct range {
    std::size_t begin, end, index;
  };
  std::vector<range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) {
        throw error(fmt::format("{}: __metadata__ is not a JSON object", label));
      }
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          throw error(fmt::format(
              "{}: __metadata__ entry '{}' is not a string (metadata maps strings to strings)",
              label, excerpt(k)));
        }
        out.metadata.emplace(k, v.get<std::string>());
      }
      continue;
    }
    const auto where = [&, &tensor = name] { return fmt::format("{}: tensor '{}'", label, excerpt(tensor)); };
    if (!entry.is_object()) {
      throw error(fmt::format("{}: entry is not a JSON object", where()));
    }
    const auto dt = entry.find("dtype");
    const auto sh = entry.find("shape");
    const auto off = entry.find("data_offsets");
    if (dt == entry.end() || sh == entry.end() || off == entry.end()) {
      throw error(fmt::format("{}: entry must have \"dtype\", \"shape\" and \"data_offsets\"",
                              where()));
    }
    if (!dt->is_string()) throw error(fmt::format("{}: \"dtype\" is not a string", where()));
    const auto& dts = dt->get_ref<const std::string&>();
    const std::optional<dtype> type = parse_dtype(dts);
    if (!type) {
      std::string known;
      for (const dtype t : all_dtypes) known.append(known.empty() ? "" : ", ").append(dtype_name(t));
      throw error(fmt::format("{}: unknown dtype '{}' (known: {})", where(), excerpt(dts), known));
    }
    if (!sh->is_array()) throw error(fmt::format("{}: \"shape\" is not an array", where()));
    tensor_view view;
    view.name = name;
    view.dtype = *type;
    std::size_t numel = 1;
    for (const auto& d : *sh) {
      bool ok = true;
      const std::size_t dim = json_size(d, ok);
      if (!ok) {
        throw error(fmt::format("{}: shape entry {} is {}", where(), excerpt(d.dump()), json_size_problem(d)));
      }
      if (mul_overflows(numel, dim, numel)) {
        throw error(fmt::format("{}: shape {} overflows the element count", where(), excerpt(sh->dump(), 160)));
      }
      view.shape.push_back(dim);
    }
    std::size_t nbytes = 0;
    if (mul_overflows(numel, dtype_size(*type), nbytes)) {
      throw error(fmt::format("{}: shape {} overflows the byte size", where(), excerpt(sh->dump(), 160)));
    }
    if (!off->is_array() || off->size() != 2) {
      throw error(fmt::format("{}: \"data_offsets\" is not an array [begin, end]", where()));
    }
    bool begin_ok = true, end_ok = true;
    const std::size_t begin = json_size((*off)[0], begin_ok);
    const std::size_t end = json_size((*off)[1], end_ok);
    if (!begin_ok || !end_ok) {
      throw error(fmt::format("{}: \"data_offsets\" {}: {} is {}", where(), excerpt(off->dump(), 160),
                              begin_ok ? "the end" : "the begin", json_size_problem((*off)[begin_ok ? 1 : 0])));
    }
    if (begin > end) {
      throw error(fmt::format("{}: data_offsets [{}, {}] have begin > end", where(), begin, end));
    }
    if (end > data_section.size()) {
      throw error(fmt::format(
          "{}: data_offsets [{}, {}] lie outside the data section ({} bytes; file truncated?)",
          where(), begin, end, data_section.size()));
    }
    if (end - begin != nbytes) {
      throw error(fmt::format(
          "{}: data_offsets [{}, {}] hold {} bytes but dtype {} with shape {} needs {} bytes",
          where(), begin, end, end - begin, dts, shape_string(view.shape), nbytes));
    }
    view.data = data_section.subspan(begin, nbytes);
    ranges.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(view));
  }
  // The authors' rule: the tensors, in the order of their offsets, lie one after another and cover
  // the data section without holes (no room for a second payload, as in polyglot files) — an empty
  // tensor too lies where the one before it ends, not inside it — exactly as their reference
  // implementation checks.
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::size_t covered = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto& b = ranges[i];
    if (b.begin < covered) {
      const auto& a = ranges[i - 1];  // (it ends at `covered`, and is not empty: b would begin after it)
      if (b.begin == b.end) {
        throw error(fmt::format("{}: empty tensor '{}' at data offset {} lies inside tensor '{}' [{}, {}] (each "
                                "tensor begins where the one before it ends)",
                                label, excerpt(out.tensors[b.index].name), b.begin,
                                excerpt(out.tensors[a.index].name), a.begin, a.end));
      }
      throw error(fmt::format("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", label,
                              excerpt(out.tensors[a.index].name), a.begin, a.end,
                              excerpt(out.tensors[b.index].name), b.begin, b.end));
    }
    if (b.begin > covered) {
      throw error(fmt::format("{}: {} unindexed bytes before tensor '{}' at data offset {} (the data "
                              "section must be covered without holes)",
                              label, b.begin - covered, excerpt(out.tensors[b.index].name), covered));
    }
    covered = b.end;
  }
  if (covered != data_section.size()) {
    throw error(fmt::format("{}: {} unindexed bytes after the last tensor (data section of {} bytes, "
                            "tensors cover {})",
                            label, data_section.size() - covered, data_section.size(), covered));
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const tensor_view& a, const tensor_view& b) { return a.name < b.name; });
  return out;
}

}  // namespace detail

/// A safetensors file, validated and memory-mapped read-only. Tensor views point into the mapping:
/// nothing is copied until you convert a tensor. Move-only; views stay valid across moves.
class safetensors_file {
 public:
  /// Maps and validates `path`. Throws `specsample::error` naming the file and the problem.
  [[nodiscard]] static safetensors_file open(const std::filesystem::path& path) {
    safetensors_file f;
    f.path_ = path;
    f.storage_ = mapped_file::open(path);
    f.init(std::get<mapped_file>(f.storage_).bytes(), path.string());
    return f;
  }

  /// Validates an in-memory copy of a file (`label` names it in error messages).
  [[nodiscard]] static safetensors_file from_bytes(std::vector<std::byte> bytes,
                                                   std::string label = "<memory>") {
    safetensors_file f;
    f.path_ = label;
    f.storage_ = std::move(bytes);
    f.init(std::get<std::vector<std::byte>>(f.storage_), label);
    return f;
  }

  /// The path (or label) the file was opened from.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// All tensors, sorted by name.
  [[nodiscard]] std::span<const tensor_view> tensors() const noexcept { return header_.tensors; }
  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const tensor_view* find(std::string_view name) const noexcept {
    const auto& ts = header_.tensors;
    const auto it = std::lower_bound(ts.begin(), ts.end(), name,
                                     [](const tensor_view& t, std::string_view n) {
                                       return std::string_view(t.name) < n;
                                     });
    return it != ts.end() && it->name == name ? &*it : nullptr;
  }
  /// Whether a tensor called `name` exists.
  [[nodiscard]] bool contains(std::string_view name) const noexcept {
    return find(name) != nullptr;
  }
  /// The tensor called `name`; throws `specsample::error` naming the file if absent.
  [[nodiscard]] const tensor_view& at(std::string_view name) const {
    if (const tensor_view* t = find(name)) return *t;
    throw error(fmt::format("{}: missing tensor '{}'", path_.string(), detail::excerpt(name)));
  }
  /// The "__metadata__" map (empty when absent).
  [[nodiscard]] const std::map<std::string, std::string, std::less<>>& metadata() const noexcept {
    return header_.metadata;
  }

 private:
  void init(std::span<const std::byte> bytes, const std::string& label) {
    header_ = detail::parse_safetensors(bytes, label);
  }

  std::filesystem::path path_;
  std::variant<mapped_file, std::vector<std::byte>> storage_;
  detail::parsed_header header_;
};

/// The safetensors files of one checkpoint, read as one: a single file, or the shards a
/// `*.safetensors.index.json` lists. transformers' `save_pretrained` splits a checkpoint larger
/// than its `max_shard_size` (5 GB by default) into `model-0000i-of-0000n.safetensors` beside a
/// `model.safetensors.index.json` whose "weight_map" names each tensor's shard: a fine-tuned
/// gpt2-xl in F32 (6.2 GB) is two. Every shard is mapped and validated, and the index checked
/// against them (each tensor it names in the shard it names, no tensor in two shards, shards named
/// by a file name in the index's directory), before a tensor is read. Move-only; views stay valid.
class safetensors_checkpoint {
 public:
  /// One file as a checkpoint.
  explicit safetensors_checkpoint(safetensors_file file) : path_(file.path()) {
    files_.push_back(std::move(file));
    index_tensors();
  }
  safetensors_checkpoint(safetensors_checkpoint&&) noexcept = default;
  safetensors_checkpoint& operator=(safetensors_checkpoint&&) noexcept = default;
  safetensors_checkpoint(const safetensors_checkpoint&) = delete;  // (tensors() points into files_)
  safetensors_checkpoint& operator=(const safetensors_checkpoint&) = delete;

  /// Opens `path`: a safetensors file, or (a name ending in ".index.json") a shard index and the
  /// shards it names. Throws `specsample::error` naming the file and the problem.
  [[nodiscard]] static safetensors_checkpoint open(const std::filesystem::path& path) {
    const std::string name = path.filename().string();
    if (!name.ends_with(".index.json")) return safetensors_checkpoint(safetensors_file::open(path));
    const std::string label = path.string();
    const nlohmann::json j =
        detail::parse_json_strict(read_file(path), label, "shard index", detail::max_index_values);
    const auto map = j.is_object() ? j.find("weight_map") : j.end();
    if (map == j.end() || !map->is_object()) {
      throw error(fmt::format("{}: expected a JSON object with a \"weight_map\" object (tensor name -> shard file)",
                              label));
    }
    safetensors_checkpoint c;
    c.path_ = path;
    std::map<std::string, std::size_t, std::less<>> shard_of_name;
    for (const auto& [tensor, shard] : map->items()) {
      if (!shard.is_string()) {
        throw error(fmt::format("{}: the shard of tensor '{}' is {}, expected a file name", label, detail::excerpt(tensor),
                                shard.type_name()));
      }
      const std::string file = shard.get<std::string>();
      const bool control =
          std::any_of(file.begin(), file.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x20U; });
      if (file.empty() || file == "." || file == ".." || control || file.find_first_of("/\\") != std::string::npos) {
        throw error(fmt::format("{}: the shard of tensor '{}' is \"{}\": shards are named by a file name in "
                                "the index's directory",
                                label, detail::excerpt(tensor), detail::excerpt(file)));
      }
      if (file == name) {
        throw error(fmt::format("{}: the shard of tensor '{}' is the index itself", label, detail::excerpt(tensor)));
      }
      auto it = shard_of_name.find(file);
      if (it == shard_of_name.end()) {
        it = shard_of_name.emplace(file, c.files_.size()).first;
        try {
          c.files_.push_back(safetensors_file::open(path.parent_path() / file));
        } catch (const error& e) {  // the shard's own message, and where it was named
          throw error(fmt::format("{}: the shard of tensor '{}': {}", label, detail::excerpt(tensor), e.what()));
        }
      }
      if (c.files_[it->second].find(tensor) == nullptr) {
        throw error(fmt::format("{}: tensor '{}' is mapped to {}, which does not hold it", label, detail::excerpt(tensor),
                                c.files_[it->second].path().string()));
      }
    }
    if (c.files_.empty()) throw error(fmt::format("{}: the weight_map names no tensor", label));
    c.index_tensors();
    return c;
  }

  /// The file, or the shard index, the checkpoint was opened from.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The files: the one, or the shards in the order of their first tensor in the index's
  /// weight_map (by tensor name: transformers' order of the shards).
  [[nodiscard]] std::span<const safetensors_file> files() const noexcept { return files_; }
  /// Every tensor of every file, sorted by name.
  [[nodiscard]] std::span<const tensor_view* const> tensors() const noexcept { return tensors_; }
  /// The tensor called `name`, or nullptr.
  [[nodiscard]] const tensor_view* find(std::string_view name) const noexcept {
    const auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                                     [](const tensor_view* t, std::string_view n) { return std::string_view(t->name) < n; });
    return it != tensors_.end() && (*it)->name == name ? *it : nullptr;
  }
  /// Whether a tensor called `name` exists.
  [[nodiscard]] bool contains(std::string_view name) const noexcept { return find(name) != nullptr; }
  /// The path of the file holding `t` (a view from `find` or `tensors`).
  [[nodiscard]] const std::filesystem::path& path_of(const tensor_view& t) const noexcept {
    const std::less<const tensor_view*> before;  // (a total order over pointers into different arrays)
    for (const safetensors_file& f : files_) {
      const auto ts = f.tensors();
      if (!before(&t, ts.data()) && before(&t, ts.data() + ts.size())) return f.path();
    }
    return path_;
  }

 private:
  safetensors_checkpoint() = default;

  // Every file's tensors in one sorted list; a name in two files is refused, naming them in the
  // order of files_ (a stable sort of the files' tensors taken in that order).
  void index_tensors() {
    tensors_.clear();
    for (const safetensors_file& f : files_) {
      for (const tensor_view& t : f.tensors()) tensors_.push_back(&t);
    }
    std::stable_sort(tensors_.begin(), tensors_.end(),
                     [](const tensor_view* a, const tensor_view* b) { return a->name < b->name; });
    for (std::size_t i = 1; i < tensors_.size(); ++i) {
      if (tensors_[i]->name == tensors_[i - 1]->name) {
        throw error(fmt::format("{}: tensor '{}' is in both {} and {}", path_.string(), detail::excerpt(tensors_[i]->name),
                                path_of(*tensors_[i - 1]).string(), path_of(*tensors_[i]).string()));
      }
    }
  }

  std::filesystem::path path_;
  std::vector<safetensors_file> files_;
  std::vector<const tensor_view*> tensors_;
};

/// Converts a F32/F16/BF16 tensor to float into `out` (`out.size()` must equal `t.numel()`).
/// Unaligned data is fine. Throws `specsample::error` for other dtypes or a size mismatch.
inline void to_float(const tensor_view& t, std::span<float> out) {
  const std::size_t n = t.numel();
  if (out.size() != n) {
    throw error(fmt::format("tensor '{}': output buffer holds {} floats, tensor has {}", detail::excerpt(t.name),
                            out.size(), n));
  }
  const std::byte* p = t.data.data();
  switch (t.dtype) {
    case dtype::f32:
      if (n != 0) std::memcpy(out.data(), p, n * sizeof(float));
      return;
    case dtype::f16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h = 0;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_float(h);
      }
      return;
    case dtype::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h = 0;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_float(h);
      }
      return;
    default:
      break;
  }
  throw error(fmt::format("tensor '{}' has dtype {}, expected a floating-point dtype (F32, F16, "
                          "BF16)",
                          detail::excerpt(t.name), dtype_name(t.dtype)));
}

/// Converts a F32/F16/BF16 tensor to a float vector (row-major).
[[nodiscard]] inline std::vector<float> to_float_vector(const tensor_view& t) {
  if (!is_floating(t.dtype)) {
    throw error(fmt::format("tensor '{}' has dtype {}, expected a floating-point dtype (F32, "
                            "F16, BF16)",
                            detail::excerpt(t.name), dtype_name(t.dtype)));
  }
  std::vector<float> out(t.numel());
  to_float(t, out);
  return out;
}

/// Reads an I32/I64 tensor as int64.
[[nodiscard]] inline std::vector<std::int64_t> to_int64_vector(const tensor_view& t) {
  const std::size_t n = t.numel();
  const std::byte* p = t.data.data();
  if (t.dtype == dtype::i32) {
    std::vector<std::int64_t> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      std::int32_t v = 0;
      std::memcpy(&v, p + 4 * i, 4);
      out[i] = v;
    }
    return out;
  }
  if (t.dtype == dtype::i64) {
    std::vector<std::int64_t> out(n);
    if (n != 0) std::memcpy(out.data(), p, n * 8);
    return out;
  }
  throw error(fmt::format("tensor '{}' has dtype {}, expected an integer dtype (I32, I64)",
                          detail::excerpt(t.name), dtype_name(t.dtype)));
}

/// Reads an I32/I64 tensor as int32; I64 values outside the int32 range are an error.
[[nodiscard]] inline std::vector<std::int32_t> to_int32_vector(const tensor_view& t) {
  const std::vector<std::int64_t> wide = to_int64_vector(t);
  std::vector<std::int32_t> out(wide.size());
  for (std::size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<std::int32_t>::min() ||
        wide[i] > std::numeric_limits<std::int32_t>::max()) {
      throw error(fmt::format("tensor '{}': element {} = {} does not fit in int32", detail::excerpt(t.name), i,
                              wide[i]));
    }
    out[i] = static_cast<std::int32_t>(wide[i]);
  }
  return out;
}

// --- writer ---------------------------------------------------------------------------------------

/// An owned tensor to write: raw little-endian bytes of `dtype` with row-major `shape`.
struct tensor_data {
  std::string name;
  io::dtype dtype = io::dtype::f32;
  std::vector<std::size_t> shape;
  std::vector<std::byte> data;
};

/// Makes a tensor from floats, stored as F32, F16 or BF16 (round to nearest even).
[[nodiscard]] inline tensor_data make_tensor(std::string name, std::vector<std::size_t> shape,
                                             std::span<const float> values,
                                             io::dtype type = io::dtype::f32) {
  if (!is_floating(type)) {
    throw error(fmt::format("make_tensor '{}': dtype {} is not a floating-point dtype", name,
                            dtype_name(type)));
  }
  tensor_data t{std::move(name), type, std::move(shape), {}};
  t.data.resize(values.size() * dtype_size(type));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (type == dtype::f32) {
      std::memcpy(t.data.data() + 4 * i, &values[i], 4);
    } else {
      const std::uint16_t h = type == dtype::f16 ? float_to_f16(values[i]) : float_to_bf16(values[i]);
      std::memcpy(t.data.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

/// Makes an I32 tensor.
[[nodiscard]] inline tensor_data make_tensor(std::string name, std::vector<std::size_t> shape,
                                             std::span<const std::int32_t> values) {
  tensor_data t{std::move(name), dtype::i32, std::move(shape), {}};
  t.data.resize(values.size() * 4);
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

/// Makes an I64 tensor.
[[nodiscard]] inline tensor_data make_tensor(std::string name, std::vector<std::size_t> shape,
                                             std::span<const std::int64_t> values) {
  tensor_data t{std::move(name), dtype::i64, std::move(shape), {}};
  t.data.resize(values.size() * 8);
  if (!values.empty()) std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

/// An owned copy of a view (e.g. to rewrite a file with some tensors changed).
[[nodiscard]] inline tensor_data to_tensor_data(const tensor_view& v) {
  return {v.name, v.dtype, v.shape, std::vector<std::byte>(v.data.begin(), v.data.end())};
}

namespace detail {

/// The JSON header of a safetensors file holding `tensors` (in the given order, contiguous) and
/// `metadata`, padded with spaces so the data section starts 8-byte aligned. Throws on a
/// duplicate or reserved name, a name or metadata string that is not UTF-8 (JSON text is), a
/// tensor whose bytes do not match its dtype and shape (or whose shape overflows a byte count), or
/// a header longer than readers accept (`max_header_bytes`): each a file that could not be read back.
[[nodiscard]] inline std::string safetensors_header(std::span<const tensor_data> tensors,
                                                    const std::map<std::string, std::string, std::less<>>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!valid_utf8(key) || !valid_utf8(value)) {
      throw error(fmt::format("write_safetensors: metadata entry '{}' = '{}' is not UTF-8", excerpt(key), excerpt(value)));
    }
  }
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  for (const tensor_data& t : tensors) {
    if (!valid_utf8(t.name)) throw error(fmt::format("write_safetensors: tensor name '{}' is not UTF-8", excerpt(t.name)));
    if (t.name == "__metadata__" || header.contains(t.name)) {
      throw error(fmt::format("write_safetensors: duplicate or reserved tensor name '{}'", excerpt(t.name)));
    }
    // Counted as the reader counts (elements, then bytes): a shape one accepts, so does the other.
    std::size_t numel = 1, bytes = 0;
    bool overflows = false;
    for (const std::size_t d : t.shape) overflows = overflows || mul_overflows(numel, d, numel);
    if (overflows || mul_overflows(numel, dtype_size(t.dtype), bytes)) {
      throw error(fmt::format("write_safetensors: tensor '{}' of dtype {} with shape {} overflows the byte count",
                              excerpt(t.name), dtype_name(t.dtype), shape_string(t.shape)));
    }
    if (bytes != t.data.size()) {
      throw error(fmt::format(
          "write_safetensors: tensor '{}' has {} bytes but dtype {} with shape {} needs {}",
          excerpt(t.name), t.data.size(), dtype_name(t.dtype), shape_string(t.shape), bytes));
    }
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');
  if (text.size() > max_header_bytes) {
    throw error(fmt::format("write_safetensors: the header of {} tensors would be {} bytes, more than the {} bytes "
                            "readers accept",
                            tensors.size(), text.size(), max_header_bytes));
  }
  return text;
}

}  // namespace detail

/// Serializes tensors (in the given order, contiguous) and optional metadata to safetensors bytes.
/// The header is padded with spaces so the data section starts 8-byte aligned. Throws
/// `specsample::error` on duplicate names, a name or metadata string that is not UTF-8, a tensor
/// whose bytes do not match its dtype and shape, or a header longer than readers accept.
[[nodiscard]] inline std::vector<std::byte> serialize_safetensors(
    std::span<const tensor_data> tensors,
    const std::map<std::string, std::string, std::less<>>& metadata = {}) {
  const std::string text = detail::safetensors_header(tensors, metadata);
  std::size_t bytes = 8 + text.size();
  for (const tensor_data& t : tensors) bytes += t.data.size();
  std::vector<std::byte> out(bytes);
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t pos = 8 + text.size();
  for (const tensor_data& t : tensors) {
    if (!t.data.empty()) std::memcpy(out.data() + pos, t.data.data(), t.data.size());
    pos += t.data.size();
  }
  return out;
}

/// Writes tensors (and optional metadata) to `path` as safetensors, as `serialize_safetensors`
/// lays them out but streamed: no copy of the tensors' bytes is made (a checkpoint of several GB
/// needs no second buffer). The bytes go to `path` + ".tmp", renamed to `path` once all are
/// written and the file closed: a failed write (a full disk) leaves any earlier file at `path` as
/// it was and removes its temporary. Throws `specsample::error` on I/O failure, and, before any
/// file is opened, on duplicate names, a name or metadata string that is not UTF-8, a tensor whose
/// bytes do not match its dtype and shape, or a header longer than readers accept.
inline void write_safetensors(const std::filesystem::path& path,
                              std::span<const tensor_data> tensors,
                              const std::map<std::string, std::string, std::less<>>& metadata = {}) {
  const std::string text = detail::safetensors_header(tensors, metadata);
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  const auto fail = [&](const char* what) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw error(fmt::format("{}: {}", path.string(), what));
  };
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("cannot open for writing");
    const std::uint64_t n = text.size();
    f.write(reinterpret_cast<const char*>(&n), 8);  // little-endian: the static_assert above
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const tensor_data& t : tensors) {
      if (!f) break;
      f.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    }
    f.close();
    if (!f) fail("write failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("cannot replace it with the written file");
}

}  // namespace specsample::io
