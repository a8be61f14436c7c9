// specsample-random-gpt2: a GPT-2 checkpoint directory of a released shape (gpt2, gpt2-medium,
// gpt2-large, gpt2-xl, or any n_layer x n_embd x n_head) with random weights, laid out as the
// released Hugging Face directories are: config.json, model.safetensors with the same tensor names
// and shapes (Conv1D weights [in, out], the h.N.attn.bias causal masks, no lm_head: tied), and
// GPT-2's vocab.json / merges.txt. The weights follow GPT-2's initialisation (normal, σ = 0.02;
// the residual projections σ = 0.02 / √(2 n_layer); biases 0, layer norms 1 and 0).
//
// What it is for: the real checkpoints cannot be downloaded here, and a forward pass costs the
// same whatever the weights' values, so specsample-bench on such a pair measures the kernels and
// the loop at the released models' sizes (docs/benchmarks.md, "GPT-2's sizes"). The acceptance of
// two random models says nothing about the real pair's.
//
//   specsample-random-gpt2 --shape gpt2-xl --out /tmp/gpt2-xl-random     # 6.43 GB, F32 as released
//   specsample-random-gpt2 --shape 2x64x4 --positions 128 --dtype f16 --out /tmp/tiny

#include "bench_util.hpp"

#include <specsample/io/bpe_tokenizer.hpp>
#include <specsample/io/safetensors.hpp>
#include <specsample/models/gpt2/config.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numbers>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
namespace io = specsample::io;

namespace {

struct shape {
  std::size_t n_layer, n_embd, n_head;
};

// The released sizes (their config.json files).
std::optional<shape> named_shape(std::string_view name) {
  if (name == "gpt2") return shape{12, 768, 12};
  if (name == "gpt2-medium") return shape{24, 1024, 16};
  if (name == "gpt2-large") return shape{36, 1280, 20};
  if (name == "gpt2-xl") return shape{48, 1600, 25};
  return std::nullopt;
}

// "LxCxH": n_layer x n_embd x n_head, each a positive integer.
std::optional<shape> custom_shape(std::string_view text) {
  std::size_t v[3] = {};
  const char* p = text.data();
  const char* const end = text.data() + text.size();
  for (std::size_t k = 0; k < 3; ++k) {
    const auto [next, ec] = std::from_chars(p, end, v[k]);
    if (ec != std::errc{} || v[k] == 0 || (k < 2 && (next == end || *next != 'x'))) return std::nullopt;
    p = k < 2 ? next + 1 : next;
  }
  if (p != end) return std::nullopt;
  return shape{v[0], v[1], v[2]};
}

// Normal deviates from splitmix64 and Box-Muller: fast (the gpt2-xl file is 1.6 G of them) and
// the same on every platform for a seed (std::normal_distribution is not).
class normal_source {
 public:
  explicit normal_source(std::uint64_t seed) : state_(seed) {}
  float operator()(float sigma) {
    if (have_) {
      have_ = false;
      return sigma * spare_;
    }
    const double u1 = (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(next() >> 11) * 0x1.0p-53;          // [0, 1)
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2.0 * std::numbers::pi * u2));
    have_ = true;
    return sigma * static_cast<float>(r * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t state_;
  float spare_ = 0.0f;
  bool have_ = false;
};

struct cli {
  shape s{};
  std::string shape_name;
  std::size_t positions = 1024, vocab = 50257;
  io::dtype dtype = io::dtype::f32;
  std::uint64_t seed = 1;
  std::optional<fs::path> out;
  std::optional<fs::path> tokenizer;  // --tokenizer; without it GPT-2's for vocab 50257, none otherwise
};

constexpr const char* usage =
    "usage: specsample-random-gpt2 --shape NAME --out DIR [options]\n"
    "  (an option's value follows it, or joins a long option after '=': --shape gpt2, --shape=gpt2;\n"
    "   a value that begins with -- must join it after '=')\n"
    "  Writes a GPT-2 checkpoint directory in the released layout with random weights; refuses one\n"
    "  larger than this machine's memory or than the space free at DIR before writing anything.\n"
    "  --shape NAME       gpt2, gpt2-medium, gpt2-large, gpt2-xl, or LxCxH (n_layer x n_embd x n_head)\n"
    "  --out DIR          the directory to write (created; existing files of the same names are replaced,\n"
    "                     and an earlier tokenizer's vocab.json, merges.txt and LICENSE* that this\n"
    "                     checkpoint does not write are removed)\n"
    "  --dtype f32|f16    the tensors' dtype (default f32, as the released model.safetensors)\n"
    "  --positions N      n_positions (default 1024)\n"
    "  --vocab N          vocab_size (default 50257)\n"
    "  --seed N           (default 1)\n"
    "  --tokenizer DIR    the vocab.json and merges.txt to copy beside the weights (and LICENSE* files),\n"
    "                     of --vocab's size; its EOS becomes the config's bos/eos (default: GPT-2's,\n"
    "                     the source tree's copy, for vocab 50257; none otherwise: eos = vocab - 1)\n"
    "  -h, --help         this text\n";

cli parse(int argc, char** argv) {
  cli c;
  try {  // what the reader refuses, and a flag's value out of its domain: usage errors
    for (specsample::io::argument_reader args(argc, argv); args.next();) {
      const std::string_view a = args.flag();
      if (a == "--shape") {
        c.shape_name = std::string(args.value());
        const std::optional<shape> s = named_shape(c.shape_name) ? named_shape(c.shape_name) : custom_shape(c.shape_name);
        if (!s) {
          throw specsample::error(fmt::format("--shape expects gpt2, gpt2-medium, gpt2-large, gpt2-xl or LxCxH "
                                              "(positive integers, e.g. 2x64x4), got '{}'", c.shape_name));
        }
        c.s = *s;
      } else if (a == "--out") {
        c.out = args.path_value();
      } else if (a == "--dtype") {
        const std::string_view v = args.value();
        if (v == "f32") c.dtype = io::dtype::f32;
        else if (v == "f16") c.dtype = io::dtype::f16;
        else throw specsample::error(fmt::format("--dtype expects f32 or f16, got '{}'", v));
      } else if (a == "--positions") {
        c.positions = args.number<std::size_t>();
      } else if (a == "--vocab") {
        c.vocab = args.number<std::size_t>();
      } else if (a == "--seed") {
        c.seed = args.number<std::uint64_t>();
      } else if (a == "--tokenizer") {
        c.tokenizer = args.path_value();
      } else if (a == "--help" || a == "-h") {
        args.refuse_value();
        fmt::print("{}", usage);
        std::exit(0);
      } else {
        throw specsample::error(fmt::format("unknown option '{}'{}", a, specsample::io::did_you_mean(a, usage)));
      }
    }
  } catch (const specsample::error& e) {
    specsample_bench::usage_error(e.what());
  }
  if (c.shape_name.empty() || !c.out) specsample_bench::usage_error("--shape and --out are required");
  // The library's own checks of a config (sizes, n_embd divisible by n_head), before any byte is written.
  specsample::gpt2::config cfg;
  cfg.n_layer = c.s.n_layer;
  cfg.n_head = c.s.n_head;
  cfg.n_embd = c.s.n_embd;
  cfg.n_positions = c.positions;
  cfg.vocab_size = c.vocab;
  cfg.n_inner = 4 * c.s.n_embd;
  cfg.validate(fmt::format("--shape {} --positions {} --vocab {}", c.shape_name, c.positions, c.vocab));
  return c;
}

// One tensor of the checkpoint: its name, shape and values — normal deviates of deviation
// `value`, the constant `value`, or the causal mask buffer.
struct tensor_plan {
  enum class fill : std::uint8_t { normal, constant, causal_mask };
  std::string name;
  std::vector<std::size_t> dims;
  fill how;
  float value;
};

// Every tensor of the released layout for this shape, in the released order.
std::vector<tensor_plan> checkpoint_plan(const cli& c) {
  using fill = tensor_plan::fill;
  const std::size_t L = c.s.n_layer, C = c.s.n_embd, P = c.positions, V = c.vocab;
  const float sigma = 0.02f, sigma_proj = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
  std::vector<tensor_plan> t;
  t.push_back({"wte.weight", {V, C}, fill::normal, sigma});
  t.push_back({"wpe.weight", {P, C}, fill::normal, sigma});
  for (std::size_t l = 0; l < L; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    t.push_back({h + "attn.bias", {1, 1, P, P}, fill::causal_mask, 0.0f});  // (the loader ignores it)
    t.push_back({h + "ln_1.weight", {C}, fill::constant, 1.0f});
    t.push_back({h + "ln_1.bias", {C}, fill::constant, 0.0f});
    t.push_back({h + "attn.c_attn.weight", {C, 3 * C}, fill::normal, sigma});
    t.push_back({h + "attn.c_attn.bias", {3 * C}, fill::constant, 0.0f});
    t.push_back({h + "attn.c_proj.weight", {C, C}, fill::normal, sigma_proj});
    t.push_back({h + "attn.c_proj.bias", {C}, fill::constant, 0.0f});
    t.push_back({h + "ln_2.weight", {C}, fill::constant, 1.0f});
    t.push_back({h + "ln_2.bias", {C}, fill::constant, 0.0f});
    t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}, fill::normal, sigma});
    t.push_back({h + "mlp.c_fc.bias", {4 * C}, fill::constant, 0.0f});
    t.push_back({h + "mlp.c_proj.weight", {4 * C, C}, fill::normal, sigma_proj});
    t.push_back({h + "mlp.c_proj.bias", {C}, fill::constant, 0.0f});
  }
  t.push_back({"ln_f.weight", {C}, fill::constant, 1.0f});
  t.push_back({"ln_f.bias", {C}, fill::constant, 0.0f});
  return t;
}

// Refuses, before anything is written, a checkpoint whose generation needs more than this
// machine's memory or than the space free where it would go: a shape the config checks pass can
// still ask for petabytes. The generator holds the whole checkpoint, the causal mask in F32 and
// its largest other tensor in F32 (as `run` builds them). Sizes in double: the element counts of
// absurd shapes overflow 64 bits.
void check_fits(const cli& c, const std::vector<tensor_plan>& plan) {
  double bytes = 0.0, mask_floats = 0.0, largest_floats = 0.0;
  for (const tensor_plan& t : plan) {
    double n = 1.0;
    for (const std::size_t d : t.dims) n *= static_cast<double>(d);
    bytes += n * static_cast<double>(io::dtype_size(c.dtype));
    if (t.how == tensor_plan::fill::causal_mask) {
      mask_floats = n;
    } else {
      largest_floats = std::max(largest_floats, n);
    }
  }
  const double held = bytes + 4.0 * (mask_floats + largest_floats);
  const auto gb = [](double b) { return b / 1e9; };
  const double memory = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (memory > 0.0 && held > memory) {
    throw specsample::error(fmt::format("--shape {}: the checkpoint would be {:.3g} GB of {}, and generating it holds "
                                        "{:.3g} GB (the checkpoint, its causal mask and its largest tensor in F32), "
                                        "more than this machine's {:.3g} GB of memory",
                                        c.shape_name, gb(bytes), io::dtype_name(c.dtype), gb(held), gb(memory)));
  }
  fs::path where = fs::absolute(*c.out);
  while (!fs::exists(where) && where.has_parent_path() && where != where.parent_path()) where = where.parent_path();
  if (fs::exists(where) && !fs::is_directory(where)) {
    throw specsample::error(fmt::format("--out {}: {} is a file, not a directory", c.out->string(), where.string()));
  }
  // Where nothing can be written (a read-only file system), that is the reason, not the free space.
  if (::access(where.c_str(), W_OK | X_OK) != 0) {
    throw specsample::error(fmt::format("--out {}: cannot write there: {} ({})", c.out->string(),
                                        std::strerror(errno), where.string()));
  }
  std::error_code ec;
  const fs::space_info space = fs::space(where, ec);
  // A capacity of 0 is a size the file system does not report (ramfs, /proc, some FUSE mounts):
  // unknown, not full.
  if (!ec && space.capacity > 0 && bytes > static_cast<double>(space.available)) {
    throw specsample::error(fmt::format("--shape {}: the checkpoint would be {:.3g} GB of {}, more than the {:.3g} GB "
                                        "free at {}",
                                        c.shape_name, gb(bytes), io::dtype_name(c.dtype),
                                        gb(static_cast<double>(space.available)), where.string()));
  }
}

// The tokenizer the checkpoint gets: --tokenizer's, else GPT-2's for vocab 50257, else none. Its
// files (vocab.json, merges.txt and any LICENSE*) and its EOS; checked before anything is written.
struct tokenizer_copy {
  std::vector<fs::path> files;
  std::optional<specsample::token> eos;
};

tokenizer_copy tokenizer_for(const cli& c) {
  const std::optional<fs::path> dir =
      c.tokenizer ? c.tokenizer : c.vocab == 50257 ? std::optional<fs::path>(SPECSAMPLE_GPT2_TOKENIZER) : std::nullopt;
  tokenizer_copy t;
  if (!dir) return t;
  const std::string flag = fmt::format("--tokenizer {}", dir->string());
  // Copied onto itself the files would fail after the weights were written (and --out's own
  // weights and config would replace those beside the tokenizer): refused first.
  std::error_code ec;
  if (fs::equivalent(*dir, *c.out, ec)) {
    throw specsample::error(fmt::format("{} is the --out directory {}: give a tokenizer directory apart from it", flag,
                                        c.out->string()));
  }
  for (const char* name : {"vocab.json", "merges.txt"}) {
    if (!fs::is_regular_file(*dir / name)) throw specsample::error(fmt::format("{}: no {} there", flag, name));
    t.files.push_back(*dir / name);
  }
  for (const fs::directory_entry& e : fs::directory_iterator(*dir)) {
    if (e.is_regular_file() && e.path().filename().string().starts_with("LICENSE")) t.files.push_back(e.path());
  }
  // The checkpoint's vocab_size is --vocab: a tokenizer of another size would make a checkpoint
  // no program could load.
  const auto tok = specsample::bpe_tokenizer::load(*dir);
  specsample::check_model_vocabulary(c.vocab, tok, fmt::format("{} (--vocab {})", flag, c.vocab));
  if (tok.has_eos()) t.eos = tok.eos();
  return t;
}

// The tokenizer files (vocab.json, merges.txt, LICENSE*) an earlier checkpoint left in `out` that
// `copy` does not write: a program would read them beside weights they do not belong to. Each must
// be a file (checked here, before anything is written; removed after).
std::vector<fs::path> earlier_tokenizer_files(const fs::path& out, const tokenizer_copy& copy) {
  std::vector<fs::path> stale;
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return stale;
  for (const fs::directory_entry& e : fs::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name != "vocab.json" && name != "merges.txt" && !name.starts_with("LICENSE")) continue;
    const bool written = std::any_of(copy.files.begin(), copy.files.end(),
                                     [&](const fs::path& f) { return f.filename() == e.path().filename(); });
    if (written) continue;
    if (!e.is_regular_file() && !e.is_symlink()) {
      throw specsample::error(fmt::format("--out {}: {} is an earlier tokenizer's name but not a file: remove it first",
                                          out.string(), e.path().string()));
    }
    stale.push_back(e.path());
  }
  if (ec) throw specsample::error(fmt::format("--out {}: cannot list it: {}", out.string(), ec.message()));
  std::sort(stale.begin(), stale.end());
  return stale;
}

int run(int argc, char** argv) {
  const cli c = parse(argc, argv);
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t L = c.s.n_layer, C = c.s.n_embd, P = c.positions, V = c.vocab;
  const std::vector<tensor_plan> plan = checkpoint_plan(c);
  check_fits(c, plan);
  const tokenizer_copy tokenizer = tokenizer_for(c);
  specsample_bench::check_output_directory(*c.out, "--out");
  const std::vector<fs::path> stale = earlier_tokenizer_files(*c.out, tokenizer);

  // The tokenizer's EOS (GPT-2's 50256) as bos and eos; without a tokenizer the last id.
  const std::size_t eos = tokenizer.eos ? static_cast<std::size_t>(*tokenizer.eos) : V - 1;
  nlohmann::ordered_json config = {
      {"activation_function", "gelu_new"}, {"architectures", {"GPT2LMHeadModel"}},
      {"attn_pdrop", 0.1},                 {"bos_token_id", eos},
      {"embd_pdrop", 0.1},                 {"eos_token_id", eos},
      {"initializer_range", 0.02},         {"layer_norm_epsilon", 1e-05},
      {"model_type", "gpt2"},              {"n_ctx", P},
      {"n_embd", C},                       {"n_head", c.s.n_head},
      {"n_inner", nullptr},                {"n_layer", L},
      {"n_positions", P},                  {"resid_pdrop", 0.1},
      {"torch_dtype", c.dtype == io::dtype::f16 ? "float16" : "float32"},
      {"vocab_size", V}};

  // One deviate stream per tensor (seeded by the seed and the tensor's index among those that are
  // not masks): a tensor's values do not depend on the others'.
  std::vector<io::tensor_data> tensors;
  std::vector<float> values, mask;
  std::uint64_t index = 0;
  for (const tensor_plan& t : plan) {
    if (t.how == tensor_plan::fill::causal_mask) {
      if (mask.empty()) {  // (P, P): 1 on and below the diagonal
        mask.assign(P * P, 0.0f);
        for (std::size_t i = 0; i < P; ++i) {
          const auto row = mask.begin() + static_cast<std::ptrdiff_t>(i * P);
          std::fill(row, row + static_cast<std::ptrdiff_t>(i + 1), 1.0f);
        }
      }
      tensors.push_back(io::make_tensor(t.name, t.dims, mask, c.dtype));
      continue;
    }
    std::size_t n = 1;
    for (const std::size_t d : t.dims) n *= d;
    values.assign(n, t.how == tensor_plan::fill::constant ? t.value : 0.0f);
    if (t.how == tensor_plan::fill::normal) {
      normal_source normal(c.seed * 0x100000001B3ull + index);
      for (float& v : values) v = normal(t.value);
    }
    ++index;
    tensors.push_back(io::make_tensor(t.name, t.dims, values, c.dtype));
  }
  io::write_safetensors(*c.out / "model.safetensors", tensors, {{"format", "pt"}});  // (may refuse: first)
  specsample_bench::write_file(*c.out, "config.json", config.dump(2) + "\n");

  for (const fs::path& file : tokenizer.files) {
    std::error_code ec;
    fs::copy_file(file, *c.out / file.filename(), fs::copy_options::overwrite_existing, ec);
    if (ec) throw specsample::error(fmt::format("cannot copy {}: {}", file.string(), ec.message()));
  }
  std::vector<std::string> removed;
  for (const fs::path& file : stale) {
    std::error_code ec;
    fs::remove(file, ec);
    if (ec) throw specsample::error(fmt::format("cannot remove the earlier {}: {}", file.string(), ec.message()));
    removed.push_back(file.filename().string());
  }
  if (!removed.empty()) {
    fmt::print("specsample-random-gpt2: removed the {} an earlier checkpoint's tokenizer left in {} ({})\n",
               fmt::join(removed, ", "), c.out->string(),
               tokenizer.files.empty() ? "this one has none: --tokenizer DIR gives it one" : "this one's has other files");
  }
  std::size_t bytes = 0;
  for (const io::tensor_data& t : tensors) bytes += t.data.size();
  fmt::print("specsample-random-gpt2: wrote {} ({} layers x {} channels x {} heads, {} positions, vocab {}, {}; "
             "{} tensors, {:.3g} GB) in {:.1f} s\n",
             c.out->string(), L, C, c.s.n_head, P, V, io::dtype_name(c.dtype), tensors.size(),
             static_cast<double>(bytes) / 1e9,
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return specsample_bench::guarded_main("specsample-random-gpt2", [&] { return run(argc, argv); }); }
