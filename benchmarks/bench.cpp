// specsample-bench: the speculative-sampling sweep behind docs/benchmarks.md.
//
//   specsample-bench [--target DIR] [--draft DIR] [--prompts FILE] [-n N] [--reps R] [--k-max K]
//                    [--temperatures 0,0.7,1] [--threads N] [--kernels LEVEL] [--weights F] [--kv F] [--matmul P] [--amx on|off] [--seed S]
//                    [--draft-matmul P] [--draft-temperature-ratio R] [--verify RULE] [--cost-samples N]
//                    [--out DIR] [--quick]
//
// For every temperature T and draft length K = 1..k-max it generates -n tokens from each prompt,
// --reps times, with plain autoregressive decoding and with speculative sampling, the two runs of
// a (prompt, seed) pair back to back (alternating which goes first) so machine drift hits both.
// Per cell it reports tokens/s, the paired speedup, acceptance (overall, α, per draft position),
// tokens per target call, the cost ratio c and the predicted speedup
// (1 − α^(K+1)) / ((1 − α)(cK + 1)); per temperature the best K and the time outside the models.
// It also measures the cost ratio directly (single-token appends, interleaved), the target's cost of
// verifying j tokens in one call, a streaming-read memory-bandwidth probe (and the single-token
// decode side by side with it), the FMA peak, and from them the machine floors of every call.
//
// At temperature 0 every speculative output must equal the autoregressive one (same prompt): the
// harness checks it for every run and exits with status 1 if any differs.
//
// Output: a markdown report on stdout; with --out DIR also DIR/sweep.md, DIR/sweep.json (every
// figure and every run) and DIR/speedup.dat, DIR/acceptance.dat (read by benchmarks/plot.gp).
// Progress goes to stderr. scripts/bench.sh builds Release, runs this and draws the plots.
//
// With --strategies it runs the strategy comparison instead of the sweep: autoregressive,
// token-wise, block verification, adaptive draft length, p_min early stop, auto-K (calibrate,
// then generate) and n-gram drafting on the same prompts and seeds, interleaved per prompt, then
// n-gram drafting on prompts that repeat their own text; DIR/strategies.md and strategies.json.

#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/io/prompt_list.hpp>
#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>
#include <specsample/tokenizer.hpp>

#include "bench_util.hpp"
#include "probes.hpp"

#include <Eigen/Core>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using specsample::token;
using json = nlohmann::json;

namespace {

using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point t0) { return std::chrono::duration<double>(steady::now() - t0).count(); }

// A report's JSON text; a byte that is not valid UTF-8 (paths need not be; --prompts files must)
// is written as U+FFFD instead of throwing away the run.
std::string dump_json(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

// The best measured K per temperature from a sweep.json (specsample-bench --out DIR).
struct sweep_best {
  double temperature = 0.0;
  std::size_t k = 0;
  double speedup = 0.0;
  bool block = false;  // the sweep ran with --verify block (a sweep.json without the field did not)
};

// The bundled checkpoints run without --target / --draft.
constexpr std::string_view default_target = "shakespeare-target", default_draft = "shakespeare-draft";

// A sweep.json's best K per temperature, and the configuration it ran (its "config" object).
struct sweep_file {
  json config;
  std::vector<sweep_best> best;
};

sweep_file read_sweep_best(const fs::path& path) {
  const std::string text = specsample::io::read_file(path);
  try {  // malformed JSON and a JSON without the fields read below alike
    // The parsed document must outlive the loop: a range-for over a member of the temporary
    // json::parse(...) iterates a destroyed object (it found no temperatures at all).
    const json sweep = json::parse(text);
    const std::string rule = sweep.at("config").value("verify", std::string("tokenwise"));
    const auto verify = specsample::verification_from_name(rule);
    if (!verify) {
      throw specsample::error(fmt::format("{}: config.verify is '{}', not tokenwise or block", path.string(), rule));
    }
    const bool block = *verify == specsample::verification::block;
    std::vector<sweep_best> b;
    const json& cells = sweep.at("per_temperature");
    if (!cells.is_array()) throw specsample::error(fmt::format("{}: per_temperature is not an array", path.string()));
    for (const auto& e : cells) {
      const double t = e.at("temperature").get<double>();  // (JSON holds no NaN, and nlohmann refuses 1e999)
      if (!(t >= 0.0)) {
        throw specsample::error(fmt::format("{}: temperature {} in per_temperature must be >= 0", path.string(), t));
      }
      if (std::any_of(b.begin(), b.end(), [&](const sweep_best& seen) { return seen.temperature == t; })) {
        throw specsample::error(fmt::format("{}: temperature {} appears twice in per_temperature", path.string(), t));
      }
      const json& k = e.at("best_k_measured");  // (get<std::size_t> would wrap -1 to 2^64 - 1)
      if (!k.is_number_unsigned() || k.get<std::uint64_t>() == 0 || k.get<std::uint64_t>() > specsample::max_draft_length) {
        throw specsample::error(fmt::format("{}: best_k_measured at temperature {} is {}, not a draft length (1..{})",
                                            path.string(), t, k.dump(), specsample::max_draft_length));
      }
      const double speedup = e.at("speedup").get<double>();
      if (!(speedup > 0.0)) {
        throw specsample::error(fmt::format("{}: speedup at temperature {} must be > 0, got {}", path.string(), t,
                                            speedup));
      }
      b.push_back({t, k.get<std::size_t>(), speedup, block && t > 0.0});
    }
    // A sweep of no temperature holds no best K (each temperature would fall back to K = 4, silently).
    if (b.empty()) throw specsample::error(fmt::format("{}: per_temperature is empty: no best K", path.string()));
    const json& config = sweep.at("config");  // (an object: value() above throws otherwise)
    for (const char* field : {"target", "draft"}) {  // (compared by directory name: a string)
      if (config.contains(field) && !config.at(field).is_string()) {
        throw specsample::error(fmt::format("{}: config.{} is {}, not a checkpoint directory", path.string(), field,
                                            config.at(field).dump()));
      }
    }
    return {config, b};
  } catch (const json::exception& e) {
    throw specsample::error(fmt::format("{}: not a specsample-bench sweep.json: {}", path.string(), e.what()));
  }
}

// ---------------------------------------------------------------------------------------------
// Command line

struct cli {
  std::optional<fs::path> target, draft, prompts, out;
  std::size_t n = 128, reps = 2, k_max = 8, threads = 1, cost_samples = 200, probe_reps = 9;
  std::size_t max_prompts = 0;  // 0 = all
  std::vector<double> temperatures{0.0, 0.7, 1.0};
  std::uint64_t seed = 20240601;
  specsample::gpt2::options model;  // --kernels, --weights, --kv, --matmul, --amx (gpt2::set_option)
  std::optional<specsample::gpt2::matmul_precision> draft_matmul;  // --draft-matmul
  double draft_temperature_ratio = 1.0;  // the draft samples at this × the cell's temperature
  specsample::verification verify = specsample::verification::token_wise;  // --verify: the sweep's rule
  std::vector<double> draft_temperature_scan;  // --draft-temperatures: the acceptance scan's ratios
  bool quick = false;
  // --strategies
  bool strategies = false;
  std::optional<fs::path> best_k_from;  // a sweep.json whose per-temperature best K is also run
  std::vector<sweep_best> best_k_sweep;  // read from it by parse
  std::size_t warmup_tokens = 64;       // auto-K: the calibration's warm-up generation
  std::size_t check_pairs = 5;          // auto-K: the calibration's timed check (0: none)
  std::vector<double> repetitive_temperatures{0.0, 0.7};
};

using specsample_bench::fmt_beside_goal;
using specsample_bench::load_average;
using specsample_bench::usage_error;

constexpr std::string_view help = R"(usage: specsample-bench [options]
  (an option's value follows it, or joins a long option after '=': -n 64, --k-max=6;
   a value that begins with -- must join it after '=')
  --target DIR          target checkpoint (default: the bundled models/shakespeare-target)
  --draft DIR           draft checkpoint (default: models/shakespeare-draft; try
                        models/shakespeare-draft-distilled)
  --prompts FILE        prompt file (default: benchmarks/prompts.txt of the source tree)
  -n N                  tokens generated per run, and per generation of the loop-cost
                        measurement (default 128)
  --reps R              repetitions of every (prompt, K, temperature) (default 2; 4 with --strategies)
  --k-max K             sweep K = 1..K (default 8)
  --temperatures LIST   comma-separated temperatures (default 0,0.7,1)
  --threads N           kernel threads, one pool shared by both models (default 1; 0: one per CPU
                        it may run on)
  --kernels LEVEL       kernel level: best (default), avx512, avx2 or generic (capped at what the
                        CPU has and the build compiled; the report names the level used)
  --weights F           hold both models' matmul weights as f32, f16 or bf16 (default: as the
                        checkpoints store them; options::weight_storage); the bandwidth probes
                        then cover the weights as held
  --kv F                hold both models' KV caches as f32 (default) or f16 (options::kv_storage)
  --matmul P            both models' matmuls in f32 (default) or bf16: weights and activations
                        rounded to BF16, vdpbf16ps where the CPU has AVX512_BF16
                        (options::matmul_precision); the FMA peak is then vdpbf16ps's; or int8:
                        weights per output and activations per row quantised to INT8, vpdpbusd
                        where the CPU has AVX512_VNNI (the peak is then vpdpbusd's)
  --amx on|off          bf16 and int8 matmuls on AMX tiles where the CPU has them (default on;
                        options::amx): the floors then take the tile dot product's peak too, a
                        call of up to 16 tokens at the cost of one
  --draft-matmul P      the draft's matmuls in P (f32, bf16 or int8) instead of --matmul's: a
                        draft's precision costs acceptance, never exactness
  --draft-temperature-ratio R   the draft samples its proposals at R × each cell's temperature
                        (speculative_params::draft_sampling; default 1, the target's; T = 0 stays
                        greedy): exact whatever R, it moves only the acceptance
  --verify RULE         the sweep's verification rule: tokenwise (default) or block (Sun et al.
                        2025; speculative_params::verify): both exact; block accepts at least as
                        many tokens per round in expectation
  --draft-temperatures LIST   instead of the sweep: the acceptance scan of draft temperatures. At
                        each T > 0 of --temperatures the target generates -n tokens from every
                        prompt (--reps seeds); per ratio R of LIST the mean over those positions of
                        sum min(p, q), q the draft's distribution at R × T: the expected acceptance
                        α of each --draft-temperature-ratio. Writes draft-temperatures.md to --out
  --seed S              base random seed (default 20240601)
  --cost-samples N      single-append timings for the cost ratio (default 200)
  --max-prompts N       use only the first N prompts (default, or 0: all)
  --out DIR             also write DIR/sweep.md, sweep.json, speedup.dat, acceptance.dat
  --quick               smoke test: -n 32, 1 rep, K <= 3, 2 prompts, few timing samples
                        (explicit options still win)

strategy comparison (instead of the sweep):
  --strategies          on the same prompts and seeds, interleaved per prompt: autoregressive,
                        token-wise K=4, block verification K=4, adaptive draft length (from K=8),
                        p_min=0.5 early stop (K=8), auto-K (calibrate on a warm-up, then generate),
                        n-gram drafting (no model); then a repetitive-input suite (each prompt
                        followed by its own first lines) for n-gram drafting. Writes
                        strategies.md / strategies.json to --out
  --best-k-from FILE    a sweep.json: also run token-wise (and at T > 0 block verification) at its
                        best measured K per temperature; refused when the sweep ran other
                        checkpoints (by directory name), precisions or threads than this run
  --warmup-tokens N     auto-K warm-up generation length, >= 2 (default 64; --quick: 16)
  --check-pairs N       auto-K: pairs of calibrate's timed check of its prediction, speculation
                        against autoregressive decoding (default 5; 0: the prediction alone)
  --repetitive-temperatures LIST   temperatures of the repetitive suite (default 0,0.7)
  -h, --help            this text
)";

/// The report's note on the matmul weights', KV caches' and matmuls' precision, the draft's
/// temperature and the verification rule: nothing when the weights are as the checkpoints store
/// them, the caches F32, the matmuls F32, the draft at the target's temperature and verification
/// token-wise (the defaults).
std::string setup_note(const cli& c) {
  std::string note;
  if (c.model.weight_storage) {
    note = fmt::format(", both models' matmul weights held in {} (--weights; the targets are set for the checkpoints "
                       "as stored)", specsample::gpt2::format_name(*c.model.weight_storage));
  }
  if (c.model.kv_storage != specsample::gpt2::weight_format::f32) {
    note += fmt::format(", KV caches in {} (--kv)", specsample::gpt2::format_name(c.model.kv_storage));
  }
  if (c.model.matmul_precision == specsample::gpt2::matmul_precision::bf16) {
    note += ", BF16 matmuls (--matmul bf16: weights and activations rounded to BF16; the targets are set for F32 "
            "matmuls of the checkpoints as stored)";
  }
  if (c.model.matmul_precision == specsample::gpt2::matmul_precision::int8) {
    note += ", INT8 matmuls (--matmul int8: weights and activations quantised to INT8; the targets are set for F32 "
            "matmuls of the checkpoints as stored)";
  }
  if (c.draft_matmul && *c.draft_matmul != c.model.matmul_precision) {
    note += fmt::format(", the draft's matmuls in {} (--draft-matmul)", specsample::gpt2::precision_name(*c.draft_matmul));
  }
  if (c.draft_temperature_ratio != 1.0) {
    note += fmt::format(", the draft sampling at {:g} × T (--draft-temperature-ratio)", c.draft_temperature_ratio);
  }
  if (c.verify == specsample::verification::block) note += ", block verification (--verify block)";
  return note;
}

// The kernels the models run: the level, and which models' matmuls run on AMX tiles (`model::amx`).
// (INT8 matmuls take the tiles from simd::amx_int8_rows rows.)
std::string kernels_note(const specsample::gpt2::model& target, const specsample::gpt2::model& draft) {
  const auto calls = [](const specsample::gpt2::model& m) {
    return m.matmul_precision() == specsample::gpt2::matmul_precision::int8
               ? fmt::format(" of {} or more tokens", specsample::gpt2::simd::amx_int8_rows)
               : std::string();
  };
  std::vector<std::string> on;
  if (target.amx()) on.push_back("the target's matmuls" + calls(target));
  if (draft.amx()) on.push_back("the draft's" + std::string(target.amx() ? "" : " matmuls") + calls(draft));
  return fmt::format("{} kernels{}", specsample::isa_name(target.kernels()),
                     on.empty() ? std::string() : fmt::format(" (AMX tiles for {})", fmt::join(on, " and ")));
}

// The draft's options: the models' (`cli::model`), with --draft-matmul's precision.
specsample::gpt2::options draft_options(const cli& c) {
  return c.draft_matmul ? specsample::gpt2::with_matmul_precision(c.model, *c.draft_matmul) : c.model;
}

// Refuses a --best-k-from sweep that ran other models, precisions or thread counts than this run
// (its best K is then another configuration's), naming each difference. The checkpoints are compared by their
// directories' names (a sweep.json holds the paths of the machine that wrote it); a field the file
// does not have (an older sweep.json) is not compared.
void check_sweep_configuration(const fs::path& path, const json& config, const cli& c) {
  const auto last_component = [](const fs::path& p) {  // (of "x/" too)
    return (p.has_filename() ? p : p.parent_path()).filename().string();
  };
  const auto name = [&](const fs::path& dir) { return last_component(fs::weakly_canonical(dir)); };  // ("." too)
  const json here = [&] {
    json j = specsample::gpt2::precision_json(c.model);
    j["target"] = c.target ? name(*c.target) : std::string(default_target);
    j["draft"] = c.draft ? name(*c.draft) : std::string(default_draft);
    j["draft_matmul"] = specsample::gpt2::precision_name(draft_options(c).matmul_precision);
    j["draft_temperature_ratio"] = c.draft_temperature_ratio;
    j["threads"] = specsample::gpt2::thread_pool::resolved_threads(c.threads);  // (as the pool's JSON records it)
    return j;
  }();
  std::string differences;
  for (const auto& [field, value] : here.items()) {
    if (!config.contains(field)) continue;
    json there = config.at(field);
    if (field == "target" || field == "draft") {  // (strings: read_sweep_best)
      there = last_component(fs::path(there.get<std::string>()).lexically_normal());  // (another machine's: not resolved)
    }
    if (there != value) {  // (a string against a number: the JSON of each, quotes and all)
      const bool strings = there.is_string() && value.is_string();
      differences += fmt::format("{}{} {} (this run: {})", differences.empty() ? "" : ", ", field,
                                 strings ? there.get<std::string>() : there.dump(),
                                 strings ? value.get<std::string>() : value.dump());
    }
  }
  if (!differences.empty()) {
    usage_error(fmt::format("--best-k-from {}: its sweep ran {}: its best K is another configuration's", path.string(),
                            differences));
  }
}

// Whether a model loaded with `o` holds its matmul weights otherwise than the checkpoint stores them.
bool held_otherwise(const specsample::gpt2::options& o) {
  return o.weight_storage || o.matmul_precision != specsample::gpt2::matmul_precision::f32;
}

// What a model's weight bytes count (see `held_otherwise`); `flag` sets its matmul precision.
std::string weights_basis(const specsample::gpt2::options& o, std::string_view flag = "--matmul") {
  namespace gpt2 = specsample::gpt2;
  if (o.weight_storage) return fmt::format("held in {} by --weights", gpt2::format_name(*o.weight_storage));
  if (o.matmul_precision == gpt2::matmul_precision::f32) return "as in the checkpoint";
  return fmt::format("held in {} by {} {}", o.matmul_precision == gpt2::matmul_precision::bf16 ? "BF16" : "INT8", flag,
                     gpt2::precision_name(o.matmul_precision));
}

// `weights_basis` of the draft.
std::string draft_weights_basis(const cli& c) {
  return weights_basis(draft_options(c), c.draft_matmul ? "--draft-matmul" : "--matmul");
}

// The parameters of a generation at `temperature`: -n new tokens, --verify's rule, the draft
// sampling at --draft-temperature-ratio × `temperature`.
specsample::speculative_params generation_params(const cli& c, double temperature) {
  specsample::speculative_params p;
  p.max_new_tokens = c.n;
  p.verify = c.verify;
  p.sampling.temperature = static_cast<float>(temperature);
  if (c.draft_temperature_ratio == 1.0) return p;
  return p.with_draft_temperature(static_cast<float>(temperature * c.draft_temperature_ratio));
}

std::vector<double> read_temperatures(specsample::io::argument_reader& args) {
  auto ts = args.list<double>();
  const std::string_view flag = args.flag();
  for (const double t : ts) {
    // Sampled as a float: 1e39 passes as a double and becomes inf.
    if (!(t >= 0.0) || !std::isfinite(static_cast<float>(t))) {
      throw specsample::error(fmt::format("{}: temperature {} must be >= 0 and finite as a float (at most {:g})", flag, t,
                                          static_cast<double>(std::numeric_limits<float>::max())));
    }
    // (a temperature's cells, its best K and its confirmation are one row of the reports)
    if (std::count(ts.begin(), ts.end(), t) > 1) {
      throw specsample::error(fmt::format("{}: temperature {} is listed twice", flag, t));
    }
  }
  return ts;
}

cli parse(int argc, char** argv) {
  cli c;
  std::vector<std::string> given;
  try {  // what the reader refuses, and a flag's value out of its domain: usage errors
    for (specsample::io::argument_reader args(argc, argv); args.next();) {
      const std::string_view a = args.flag();
      given.emplace_back(a);
      if (a == "--help" || a == "-h") {
        args.refuse_value();
        std::fputs(help.data(), stdout);
        std::exit(0);
      } else if (a == "--target") c.target = args.path_value();
      else if (a == "--draft") c.draft = args.path_value();
      else if (a == "--prompts") c.prompts = args.path_value();
      else if (a == "--out") c.out = args.path_value();
      else if (a == "-n") c.n = args.number<std::size_t>(1);
      else if (a == "--reps") c.reps = args.number<std::size_t>(1);
      else if (a == "--k-max") c.k_max = args.number<std::size_t>(1);
      else if (a == "--threads") c.threads = specsample::gpt2::threads_option(a, args.number<std::size_t>());
      else if (specsample::gpt2::is_option_flag(a)) {
        specsample::gpt2::set_option(c.model, a, args.value());
      }
      else if (a == "--draft-matmul") {
        c.draft_matmul = specsample::gpt2::precision_option(a, args.value());
      }
      else if (a == "--draft-temperature-ratio") {
        c.draft_temperature_ratio = args.number<double>();
        if (!(c.draft_temperature_ratio > 0.0) || !std::isfinite(c.draft_temperature_ratio)) {
          throw specsample::error(
              fmt::format("--draft-temperature-ratio must be finite and > 0, got {}", c.draft_temperature_ratio));
        }
      }
      else if (a == "--verify") {
        c.verify = specsample::verification_option(a, args.value());
      }
      else if (a == "--draft-temperatures") {
        c.draft_temperature_scan = args.list<double>();
        for (const double r : c.draft_temperature_scan) {
          if (!(r > 0.0) || !std::isfinite(r)) {
            throw specsample::error(fmt::format("--draft-temperatures: {} must be finite and > 0", r));
          }
        }
      }
      else if (a == "--seed") c.seed = args.number<std::uint64_t>();
      else if (a == "--cost-samples") c.cost_samples = args.number<std::size_t>(1);
      else if (a == "--max-prompts") c.max_prompts = args.number<std::size_t>();
      else if (a == "--temperatures") c.temperatures = read_temperatures(args);
      else if (a == "--repetitive-temperatures") c.repetitive_temperatures = read_temperatures(args);
      else if (a == "--strategies") c.strategies = true;
      else if (a == "--best-k-from") c.best_k_from = args.path_value();
      else if (a == "--warmup-tokens") c.warmup_tokens = args.number<std::size_t>(2);
      else if (a == "--check-pairs") c.check_pairs = args.number<std::size_t>();
      else if (a == "--quick") c.quick = true;
      else throw specsample::error(fmt::format("unknown argument '{}'{}", a, specsample::io::did_you_mean(a, help)));
    }
  } catch (const specsample::error& e) {
    usage_error(e.what());
  }
  const auto set = [&](std::string_view flag) { return std::find(given.begin(), given.end(), flag) != given.end(); };
  // The strategy comparison pairs ~10 strategies per prompt: 4 repetitions keep the median of its
  // paired speedups within a few percent (2 left ±0.1 between runs of the same command).
  if (c.strategies && !set("--reps")) c.reps = 4;
  if (c.quick) {
    if (!set("-n")) c.n = 32;
    if (!set("--reps")) c.reps = 1;
    if (!set("--k-max")) c.k_max = 3;
    if (!set("--max-prompts")) c.max_prompts = 2;
    if (!set("--cost-samples")) c.cost_samples = 20;
    if (!set("--warmup-tokens")) c.warmup_tokens = 16;
    c.probe_reps = 3;
  }
  try {
    specsample::gpt2::check_option_flags(c.model);
  } catch (const specsample::error& e) {
    usage_error(e.what());
  }
  if (c.k_max > specsample::max_draft_length) {
    usage_error(fmt::format("--k-max {} is above max_draft_length = {}", c.k_max, specsample::max_draft_length));
  }
  if (c.strategies && set("--verify")) usage_error("--strategies compares both verification rules; drop --verify");
  // The K sweep's own options: the strategy comparison and the draft temperature scan read neither.
  if (c.strategies || !c.draft_temperature_scan.empty()) {
    for (const std::string_view flag : {"--k-max", "--cost-samples"}) {
      if (set(flag)) {
        usage_error(fmt::format("{} sets up the K sweep; {} does not read it: drop it", flag,
                                c.strategies ? "--strategies" : "--draft-temperatures"));
      }
    }
  }
  if (!c.strategies) {
    for (const std::string_view flag : {"--best-k-from", "--warmup-tokens", "--check-pairs", "--repetitive-temperatures"}) {
      if (set(flag)) usage_error(fmt::format("{} sets up the strategy comparison: it needs --strategies", flag));
    }
  }
  if (c.best_k_from) {  // a bad file, or another configuration's best K, before hours of runs
    const sweep_file sweep = read_sweep_best(*c.best_k_from);
    check_sweep_configuration(*c.best_k_from, sweep.config, c);
    c.best_k_sweep = sweep.best;
  }
  if (!c.draft_temperature_scan.empty()) {
    if (c.strategies) usage_error("--draft-temperatures is a run of its own; drop --strategies");
    if (set("--verify")) usage_error("--draft-temperatures verifies nothing (it computes the expected α); drop --verify");
    if (set("--draft-temperature-ratio")) {
      usage_error("--draft-temperatures scans the ratios it lists; drop --draft-temperature-ratio");
    }
    if (std::none_of(c.temperatures.begin(), c.temperatures.end(), [](double t) { return t > 0.0; })) {
      usage_error("--draft-temperatures needs a temperature > 0 in --temperatures (at 0 both models are greedy)");
    }
  }
  // The draft samples at ratio × temperature, a float, for the ratios and temperatures this run
  // uses: the library's own check would come only after the cells before it had run.
  const bool scan = !c.draft_temperature_scan.empty();
  const std::string_view ratio_flag = scan ? "--draft-temperatures" : "--draft-temperature-ratio";
  const std::vector<double> ratios = scan ? c.draft_temperature_scan : std::vector<double>{c.draft_temperature_ratio};
  const auto check_draft_temperatures = [&](std::string_view temperature_flag, const std::vector<double>& ts) {
    for (const double t : ts) {
      for (const double r : ratios) {
        if (!std::isfinite(static_cast<float>(t * r))) {
          usage_error(fmt::format("{} {:g} × {} {:g} = {:g}, the draft's temperature, is not finite as a float",
                                  ratio_flag, r, temperature_flag, t, r * t));
        }
      }
    }
  };
  check_draft_temperatures("--temperatures", c.temperatures);
  if (c.strategies) check_draft_temperatures("--repetitive-temperatures", c.repetitive_temperatures);
  return c;
}

// The bundled models: $SPECSAMPLE_MODELS, next to an installed binary, or the source tree.
fs::path bundled_models() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("SPECSAMPLE_MODELS")) candidates.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "../share/specsample/models");
    candidates.push_back(exe.parent_path() / "../../models");
  }
#ifdef SPECSAMPLE_SOURCE_MODELS
  candidates.emplace_back(SPECSAMPLE_SOURCE_MODELS);
#endif
  for (const auto& c : candidates) {
    if (fs::exists(c / default_target / "config.json", ec)) return fs::weakly_canonical(c);
  }
  throw specsample::error("cannot find the bundled models (looked in $SPECSAMPLE_MODELS, next to the binary and "
                          "in the source tree); pass --target and --draft");
}

fs::path default_prompts() {
#ifdef SPECSAMPLE_BENCH_PROMPTS
  return fs::path(SPECSAMPLE_BENCH_PROMPTS);
#else
  throw specsample::error("no default prompt file compiled in; pass --prompts FILE");
#endif
}

// ---------------------------------------------------------------------------------------------
// Small statistics

struct summary {
  double median = 0.0, min = 0.0, max = 0.0;
};

summary summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

json to_json(const summary& s) { return {{"median", s.median}, {"min", s.min}, {"max", s.max}}; }

// ---------------------------------------------------------------------------------------------
// The sweep

struct run_pair {
  std::size_t prompt = 0, rep = 0;
  std::uint64_t seed = 0;
  bool ar_first = true;
  specsample::generation_stats ar, spec;
  bool identical = false;
  // Generation speed is timed over the decode phase (`generation_stats::decode_seconds`: the
  // whole call minus both models' prompt prefill, which the performance model does not cover and
  // speculation does not change, bar the draft's own prefill); `speedup_with_prefill` times the
  // whole call.
  [[nodiscard]] double ar_tps() const { return static_cast<double>(ar.tokens) / ar.decode_seconds(); }
  [[nodiscard]] double spec_tps() const { return static_cast<double>(spec.tokens) / spec.decode_seconds(); }
  [[nodiscard]] double speedup() const { return ar.decode_seconds() / spec.decode_seconds(); }
  [[nodiscard]] double speedup_with_prefill() const { return ar.total_seconds / spec.total_seconds; }
};

struct cell {
  double temperature = 0.0;
  std::size_t k = 0;
  std::vector<run_pair> runs;
  std::vector<std::size_t> pos_tested, pos_accepted;
  std::vector<std::size_t> histogram;

  // Derived figures (filled by finish()).
  summary ar_tps, spec_tps, speedup, speedup_with_prefill;
  // The throughput ratio over the cell's runs: all of its autoregressive decode time over all of
  // its speculative decode time (per token). The estimate the performance model's pooled α, c and
  // verification cost describe, so the one it is compared with (meas/pred, the Targets' shares)
  // and by which the best K is chosen; the median of the per-pair ratios (`speedup`) weighs each
  // prompt alike and reads higher where the speedup varies from prompt to prompt.
  double speedup_pooled = 0.0;
  double speedup_of_medians = 0.0;
  double acceptance = 0.0, alpha = 0.0, tokens_per_call = 0.0;
  double c_stats = 0.0, verify_ratio_stats = 0.0;
  double ar_call_seconds = 0.0, draft_call_seconds = 0.0;  // per call, in the cell's generations
  double predicted = 0.0, predicted_verify = 0.0;
  double overhead_spec = 0.0, overhead_ar = 0.0;
  std::size_t identical = 0;
  std::vector<double> position_acceptance;

  void finish() {
    std::vector<double> a, s, r, rp;
    std::size_t drafted = 0, accepted = 0, corrections = 0, tokens = 0, tcalls = 0, dcalls = 0, ar_calls = 0,
                ar_tokens = 0;
    double dsec = 0, tsec = 0, ar_tsec = 0, spec_over = 0, spec_total = 0, ar_over = 0, ar_total = 0;
    histogram.assign(k + 1, 0);
    for (const auto& p : runs) {
      a.push_back(p.ar_tps());
      s.push_back(p.spec_tps());
      r.push_back(p.speedup());
      rp.push_back(p.speedup_with_prefill());
      drafted += p.spec.drafted;
      accepted += p.spec.accepted;
      corrections += p.spec.corrections;
      tokens += p.spec.tokens;
      tcalls += p.spec.target_calls;
      dcalls += p.spec.draft_calls;
      dsec += p.spec.draft_seconds;
      tsec += p.spec.target_seconds;
      ar_tsec += p.ar.target_seconds;
      ar_calls += p.ar.target_calls;
      ar_tokens += p.ar.tokens;
      spec_over += p.spec.overhead_seconds();
      spec_total += p.spec.decode_seconds();
      ar_over += p.ar.overhead_seconds();
      ar_total += p.ar.decode_seconds();
      for (std::size_t i = 0; i < p.spec.accepted_histogram.size() && i <= k; ++i) histogram[i] += p.spec.accepted_histogram[i];
      identical += p.identical ? 1 : 0;
    }
    ar_tps = summarize(a);
    spec_tps = summarize(s);
    speedup = summarize(r);
    speedup_with_prefill = summarize(rp);
    speedup_of_medians = spec_tps.median / ar_tps.median;
    speedup_pooled = (static_cast<double>(tokens) / spec_total) / (static_cast<double>(ar_tokens) / ar_total);
    acceptance = drafted ? static_cast<double>(accepted) / static_cast<double>(drafted) : 0.0;
    alpha = accepted + corrections ? static_cast<double>(accepted) / static_cast<double>(accepted + corrections) : 0.0;
    tokens_per_call = tcalls ? static_cast<double>(tokens) / static_cast<double>(tcalls) : 0.0;
    ar_call_seconds = ar_tsec / static_cast<double>(ar_calls);
    draft_call_seconds = dsec / static_cast<double>(dcalls);
    c_stats = draft_call_seconds / ar_call_seconds;
    verify_ratio_stats = (tsec / static_cast<double>(tcalls)) / ar_call_seconds;
    // The performance model with the costs this cell's generations actually paid: c as the loop
    // pays it, and (second form) the measured cost of the (K+1)-token verification call.
    predicted = specsample::predicted_speedup(alpha, c_stats, k);
    const std::vector<double> constant_alpha(k, alpha);
    predicted_verify = specsample::expected_tokens_per_round(constant_alpha, k) /
                       (c_stats * static_cast<double>(k) + verify_ratio_stats);
    overhead_spec = spec_over / spec_total;
    overhead_ar = ar_over / ar_total;
    position_acceptance.clear();
    for (std::size_t i = 0; i < pos_tested.size(); ++i) {
      position_acceptance.push_back(pos_tested[i] ? static_cast<double>(pos_accepted[i]) / static_cast<double>(pos_tested[i])
                                                  : std::nan(""));
    }
  }
};

json stats_json(const specsample::generation_stats& s) {
  return {{"tokens", s.tokens},
          {"rounds", s.rounds},
          {"target_calls", s.target_calls},
          {"draft_calls", s.draft_calls},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"corrections", s.corrections},
          {"bonus", s.bonus},
          {"accepted_histogram", s.accepted_histogram},
          {"prefill_seconds", s.prefill_seconds},
          {"draft_seconds", s.draft_seconds},
          {"target_seconds", s.target_seconds},
          {"total_seconds", s.total_seconds},
          {"decode_seconds", s.decode_seconds()},
          {"overhead_seconds", s.overhead_seconds()},
          {"tokens_per_second", static_cast<double>(s.tokens) / s.decode_seconds()}};
}

// ---------------------------------------------------------------------------------------------
// Cost ratio: single-token appends of each model at the same context length, interleaved, and the
// target's cost of scoring j tokens in one call (what a verification round costs).

struct cost_result {
  std::size_t context = 0, samples = 0;
  summary draft_1;                  // seconds per single-token draft append
  std::vector<summary> target_j;    // target_j[j-1]: seconds per j-token target append, j = 1..k_max+1
  // Ratios are medians of per-sample ratios (the calls of a sample run back to back), so a slow
  // phase of the shared machine that hits part of the samples moves them less than it moves the
  // medians of the times.
  double c_paired = 0.0;                // median over samples of draft 1-token / target 1-token
  std::vector<double> verify_paired;    // [j-1]: median over samples of target j-token / target 1-token
  [[nodiscard]] double c() const { return c_paired; }
  [[nodiscard]] double verify_ratio(std::size_t j) const { return verify_paired[j - 1]; }
};

template <class Model>
double time_append(Model& m, std::span<const token> t, std::size_t keep) {
  const auto t0 = steady::now();
  const auto logits = m.append(t);
  const double s = seconds_since(t0);
  volatile float sink = logits(0, 0);
  (void)sink;
  m.truncate(keep);
  return s;
}

cost_result measure_costs(specsample::gpt2::model& draft, specsample::gpt2::model& target,
                          const std::vector<token>& stream, std::size_t context, std::size_t k_max,
                          std::size_t samples) {
  cost_result r;
  r.context = context;
  r.samples = samples;
  const std::span<const token> ctx(stream.data(), context);
  const std::span<const token> next(stream.data() + context, k_max + 1);
  draft.truncate(0);
  target.truncate(0);
  (void)draft.append(ctx);
  (void)target.append(ctx);
  std::vector<double> d;
  std::vector<std::vector<double>> t(k_max + 1);
  for (std::size_t s = 0; s < samples + 2; ++s) {  // the first two are warm-up
    const double ds = time_append(draft, next.first(1), context);
    // Untimed: the timed single-token call follows a single-token target call, as in autoregressive
    // decoding, not the draft's call and, before it, the previous sample's (K_max + 1)-token call
    // (on the Zen 4, target calls right after a 9-token call ran 4-15% slower: an inflated
    // denominator of every ratio below).
    (void)time_append(target, next.first(1), context);
    std::vector<double> ts(k_max + 1);
    for (std::size_t j = 1; j <= k_max + 1; ++j) ts[j - 1] = time_append(target, next.first(j), context);
    if (s < 2) continue;
    d.push_back(ds);
    for (std::size_t j = 0; j <= k_max; ++j) t[j].push_back(ts[j]);
  }
  r.draft_1 = summarize(d);
  for (auto& v : t) r.target_j.push_back(summarize(v));
  std::vector<double> ratio(d.size());
  for (std::size_t s = 0; s < d.size(); ++s) ratio[s] = d[s] / t[0][s];
  r.c_paired = summarize(ratio).median;
  for (std::size_t j = 0; j <= k_max; ++j) {
    for (std::size_t s = 0; s < d.size(); ++s) ratio[s] = t[j][s] / t[0][s];
    r.verify_paired.push_back(summarize(ratio).median);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Where the target's verification call goes: a single-token call and an n-token one, each
// operation timed (`gpt2::op_times`), interleaved as in measure_costs (each timed single-token call
// after an untimed one, the n-token call right after it).

struct op_split {
  std::size_t tokens = 0, samples = 0;
  summary whole_1, whole_n;  // seconds per call
  std::array<summary, specsample::gpt2::op_times::count> one, many;  // seconds per operation and call
};

op_split measure_op_split(specsample::gpt2::model& target, const std::vector<token>& stream, std::size_t context,
                          std::size_t tokens, std::size_t samples) {
  using specsample::gpt2::op_times;
  op_split r;
  r.tokens = tokens;
  r.samples = samples;
  const std::span<const token> next(stream.data() + context, tokens);
  target.truncate(0);
  (void)target.append(std::span<const token>(stream.data(), context));
  op_times times;
  target.time_ops(&times);
  std::vector<double> w1, wn;
  std::array<std::vector<double>, op_times::count> o1, on;
  for (std::size_t s = 0; s < samples + 2; ++s) {  // the first two are warm-up
    (void)time_append(target, next.first(1), context);
    times.clear();
    const double a = time_append(target, next.first(1), context);
    const op_times one = times;
    times.clear();
    const double b = time_append(target, next, context);
    if (s < 2) continue;
    w1.push_back(a);
    wn.push_back(b);
    for (std::size_t i = 0; i < op_times::count; ++i) {
      o1[i].push_back(one.seconds[i]);
      on[i].push_back(times.seconds[i]);
    }
  }
  target.time_ops(nullptr);
  r.whole_1 = summarize(w1);
  r.whole_n = summarize(wn);
  for (std::size_t i = 0; i < op_times::count; ++i) {
    r.one[i] = summarize(o1[i]);
    r.many[i] = summarize(on[i]);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// Thread scaling: the same target loaded with 1 and with 2+ kernel threads, j-token appends at
// the same context. The two models run in alternating blocks of calls (drift on a shared machine
// hits both) and the first call of a block is not counted: two 25 MB copies of the weights do not
// fit the last-level cache together, so a call right after the other model's would time a cold
// cache, which one model in real use never sees. A third block times the one-thread model beside
// busy neighbours: a thread per worker of the pool, each appending the same tokens over and over to
// a one-thread model sharing the weights (the same bytes in the shared caches and the same work as
// a worker's). How much they slow the caller gives, with the workers' speeds, an estimate of what
// a perfect split of a call over the threads would gain at the time (scaling_result::perfect_split).

struct scaling_result {
  std::size_t threads = 0, tokens = 0, samples = 0;
  summary one, many;  // seconds per append with 1 thread / `threads` threads
  summary beside;     // seconds per append with 1 thread, busy neighbours on the other CPUs
  specsample_bench::contention meanwhile;  // what else ran during the measurement
  // The many-thread pool's thread_pool::speed of workers 1.., medians over the blocks (each read
  // after a block of the many-thread model's calls).
  std::vector<double> speeds;
  // The calling thread's speed beside busy neighbours, relative to its speed alone.
  [[nodiscard]] double caller_beside() const { return one.median / beside.median; }
  // What a perfect split gains over one thread alone with the threads at these speeds: the workers'
  // are relative to the caller beside them, and beside busy neighbours the caller ran at
  // caller_beside() of its speed alone. An estimate from blocks measured apart, not a bound.
  [[nodiscard]] double perfect_split() const {
    double threads = 1.0;  // the caller, and each worker at its speed relative to the caller
    for (const double s : speeds) threads += s;
    return caller_beside() * threads;
  }
  [[nodiscard]] double ratio() const { return one.median / many.median; }
};

// "steal cpu0 0%, cpu1 12%; other processes 4% (of 64 ticks)" (or "not available").
std::string fmt_contention(const specsample_bench::contention& c) {
  if (c.steal.empty()) return "not available";
  std::string s = "steal";
  for (std::size_t i = 0; i < c.steal.size(); ++i) {
    s += fmt::format("{} cpu{} {:.0f}%", i ? "," : "", c.cpus[i], 100.0 * c.steal[i]);
  }
  return s + fmt::format("; other processes {:.0f}% (of {} ticks)", 100.0 * c.others, c.ticks);
}

// `pool`: the pool of the model with more threads (its speed estimates are reported); `neighbours`:
// one-thread models sharing the one-thread model's weights, one per worker of the pool.
scaling_result measure_thread_scaling(specsample::gpt2::model& a, specsample::gpt2::model& b,
                                      const specsample::gpt2::thread_pool& pool,
                                      std::vector<specsample::gpt2::model>& neighbours,
                                      const std::vector<token>& stream, std::size_t context, std::size_t tokens,
                                      std::size_t samples) {
  specsample::gpt2::model& one = a.threads() == 1 ? a : b;
  specsample::gpt2::model& many = a.threads() == 1 ? b : a;
  scaling_result r{many.threads(), tokens, samples, {}, {}, {}, {}, {}};
  const std::span<const token> ctx(stream.data(), context), next(stream.data() + context, tokens);
  const auto prefill = [&](specsample::gpt2::model& m) {
    m.truncate(0);
    (void)m.append(ctx);
  };
  prefill(one);
  prefill(many);
  for (auto& m : neighbours) prefill(m);
  constexpr std::size_t block = 10;  // calls per block; the first warms the caches
  const auto timed_block = [&](specsample::gpt2::model& m, std::vector<double>& out) {
    for (std::size_t i = 0; i < block; ++i) {
      const double s = time_append(m, next, context);
      if (i > 0) out.push_back(s);
    }
  };
  // A block of the one-thread model's calls beside the neighbours, each appending `next` over and
  // over on a thread of its own from before the first timed call to after the last (a jthread is
  // stopped and joined when `busy` goes, however the block ends).
  const auto beside_block = [&](std::vector<double>& out) {
    std::atomic<std::size_t> started{0};
    std::atomic<bool> failed{false};
    std::exception_ptr failure;
    {
      std::vector<std::jthread> busy;
      busy.reserve(neighbours.size());
      for (auto& nb : neighbours) {
        busy.emplace_back([&, &nb = nb](const std::stop_token& stop) {
          try {
            (void)time_append(nb, next, context);
            started.fetch_add(1);
            while (!stop.stop_requested()) (void)time_append(nb, next, context);
          } catch (...) {
            if (!failed.exchange(true)) failure = std::current_exception();
          }
        });
      }
      while (started.load() < neighbours.size() && !failed.load()) std::this_thread::yield();
      if (!failed.load()) timed_block(one, out);
    }
    if (failure) std::rethrow_exception(failure);
  };
  std::vector<double> t1, tn, tb;
  const auto ticks = specsample_bench::read_cpu_ticks();
  std::vector<std::vector<double>> speeds(pool.size() - 1);
  while (t1.size() < samples) {
    timed_block(one, t1);
    timed_block(many, tn);
    for (std::size_t w = 1; w < pool.size(); ++w) speeds[w - 1].push_back(pool.speed(w));
    beside_block(tb);
  }
  r.one = summarize(t1);
  r.many = summarize(tn);
  r.beside = summarize(tb);
  r.meanwhile = specsample_bench::contention_between(ticks, specsample_bench::read_cpu_ticks());
  for (const auto& s : speeds) r.speeds.push_back(summarize(s).median);
  return r;
}

// ---------------------------------------------------------------------------------------------
// The loop's own cost per round (warping, verification, sampling, bookkeeping) at a given
// vocabulary size, with synthetic models whose forward pass is a column copy: the statistics
// split draft / target seconds from the rest, exactly as in the real runs.

/// A model over V tokens whose next-token logits depend on the last token only: column
/// (last token mod 64) of a random table, `noise` perturbing the table for a draft that is close
/// to, not equal to, the target. Wrapped in toy::callable_model (the forward pass is a copy).
auto synthetic_model(std::size_t V, float noise, std::uint64_t seed) {
  Eigen::MatrixXf table(static_cast<Eigen::Index>(V), 64);
  std::mt19937_64 rng(20240601);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (Eigen::Index j = 0; j < table.cols(); ++j) {
    for (Eigen::Index i = 0; i < table.rows(); ++i) table(i, j) = n(rng);
  }
  std::mt19937_64 perturb(seed);
  std::normal_distribution<float> e(0.0f, noise);
  if (noise > 0.0f) table = table.unaryExpr([&](float x) { return x + e(perturb); });
  return specsample::toy::callable_model(V, [table = std::move(table)](std::span<const token> ctx) {
    return Eigen::VectorXf(table.col(static_cast<Eigen::Index>(static_cast<std::size_t>(ctx.back()) % 64)));
  });
}

struct overhead_result {
  std::size_t vocab = 0, k = 0, rounds = 0;
  double temperature = 0.0;
  summary seconds_per_round;  // outside the models, per round, over the generations
};

/// The loop's own cost per round at V = `target.vocab_size()`, over `generations` of `tokens`
/// tokens (after one warm-up) at draft length k.
template <class Model>
overhead_result measure_loop_overhead(Model& draft, Model& target, std::size_t k, double temperature,
                                      std::size_t tokens, std::size_t generations, std::uint64_t seed,
                                      specsample::verification rule) {
  specsample::speculative_params params;
  params.max_new_tokens = tokens;
  params.draft_length = k;
  params.sampling.temperature = static_cast<float>(temperature);
  params.verify = rule;
  const std::vector<token> prompt{1, 2, 3};
  overhead_result r{target.vocab_size(), k, 0, temperature, {}};
  std::vector<double> per_round;
  for (std::size_t g = 0; g < generations + 1; ++g) {  // the first is warm-up
    std::mt19937_64 rng(seed + g);
    const auto out = specsample::speculative_sample(draft, target, prompt, params, rng);
    if (g == 0) continue;
    r.rounds += out.stats.rounds;
    per_round.push_back(out.stats.overhead_seconds() / static_cast<double>(out.stats.rounds));
  }
  r.seconds_per_round = summarize(per_round);
  return r;
}

// ---------------------------------------------------------------------------------------------
// ---------------------------------------------------------------------------------------------
// Memory bandwidth probe: `specsample_bench::stream_sum` (probes.hpp) over a buffer allocated as
// the weights are, split across `threads` threads; GB/s = bytes read / seconds (1 GB = 1e9 bytes).
// The threads are a `gpt2::thread_pool` of the probe's own, started once, woken per call as the
// kernels' pool is for a decode: starting them per call (~27 µs a thread here) sat inside a block
// of 10 passes over the draft's 1.8 MB and read 13% low with one helper thread (a reviewer,
// 2026-12-04; one-thread probes never started any).

class stream_probe {
 public:
  stream_probe(std::size_t bytes, std::size_t threads, specsample::isa level)
      : n_(std::max<std::size_t>(bytes / sizeof(float), 1024)), threads_(threads), level_(level), buf_(n_),
        sinks_(threads * 16, 0.0f), pool_(std::make_unique<specsample::gpt2::thread_pool>(threads)) {
    std::fill(buf_.get(), buf_.get() + n_, 1.0f);
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return n_ * sizeof(float); }
  /// Seconds for `passes` reads of the whole buffer.
  double seconds(std::size_t passes) {
    const std::size_t chunk = (n_ + threads_ - 1) / threads_;
    const auto t0 = steady::now();
    auto work = [&](std::size_t w) {
      const std::size_t lo = std::min(n_, w * chunk), hi = std::min(n_, lo + chunk);
      float acc = 0.0f;
      for (std::size_t p = 0; p < passes; ++p) acc += specsample_bench::stream_sum(level_, buf_.get() + lo, hi - lo);
      sinks_[w * 16] = acc;
    };
    pool_->parallel_for(threads_, [&](std::size_t b, std::size_t e, std::size_t) {  // (one index per thread)
      for (std::size_t w = b; w < e; ++w) work(w);
    });
    return seconds_since(t0);
  }
  [[nodiscard]] double gb_per_s(std::size_t passes, double seconds) const {
    return static_cast<double>(bytes()) * static_cast<double>(passes) / seconds / 1e9;
  }
  ~stream_probe() {
    volatile float sink = std::accumulate(sinks_.begin(), sinks_.end(), 0.0f);
    (void)sink;
  }
  stream_probe(const stream_probe&) = delete;
  stream_probe& operator=(const stream_probe&) = delete;

 private:
  std::size_t n_, threads_;
  specsample::isa level_;
  specsample_bench::float_buffer buf_;
  std::vector<float> sinks_;
  std::unique_ptr<specsample::gpt2::thread_pool> pool_;
};

struct probe_result {
  std::string label;
  std::size_t bytes = 0, threads = 0;
  summary gbs;
};

/// `reps` samples of repeated passes, each ~30 ms.
probe_result probe_bandwidth(std::string label, std::size_t bytes, std::size_t threads, std::size_t reps,
                             specsample::isa level) {
  stream_probe probe(bytes, threads, level);
  (void)probe.seconds(1);  // warm caches and pages
  const double one = probe.seconds(1);
  const std::size_t passes = std::max<std::size_t>(1, static_cast<std::size_t>(0.03 / std::max(one, 1e-7)));
  std::vector<double> gbs;
  for (std::size_t r = 0; r < reps; ++r) gbs.push_back(probe.gb_per_s(passes, probe.seconds(passes)));
  return {std::move(label), probe.bytes(), threads, summarize(gbs)};
}

// Decode bandwidth side by side with the probe: alternating blocks of single-token appends of a
// model (at `context`) and of probe passes over a buffer of the bytes such an append reads of the
// model's weights (`weights::decode_bytes`), with the
// model's thread count. Each block first runs `block` untimed calls or passes, then times `block`
// more: right after the other side's data has gone through the caches both run ~30% slower and
// take 5-10 calls to reach the steady state of repeated calls (part of the 25 MB of weights stays
// in the last-level cache from one call to the next), which is what the probe table and a decode
// loop see. fraction = median over block pairs of (decode GB/s / probe GB/s): drift of the shared
// machine, which moves the separate probe table by 10% between runs, hits both sides of a pair.
// A third block streams a buffer of the decode's whole working set — the file plus the keys and
// values its attention reads at `context` — for the working-set fraction: the decode's GB/s
// counting those bytes too over that probe's GB/s. Beside the weights-only fraction it says how
// much of the gap is the working set rather than the kernels: above the weights' size the
// last-level cache starts to miss (the target's 27 MB working set fits the 32 MiB L3 of this
// project's machine only in part, shared as it is), so the KV cache costs the decode more than
// its own bytes.

struct decode_bandwidth {
  std::size_t bytes = 0, kv_bytes = 0, blocks = 0, block = 0;
  summary seconds_per_token, decode_gbs, probe_gbs, working_set_gbs;
  double fraction = 0.0, working_set_fraction = 0.0;
};

/// Bytes of keys and values a single-token append at `context` reads from a cache of format `kv`:
/// every layer's values of its context + 1 positions and its keys in whole 16-position blocks (the
/// attention layout: `simd::key_elements`, what the attention kernel prefetches).
std::size_t kv_bytes_read(const specsample::gpt2::config& cfg, std::size_t context, specsample::gpt2::weight_format kv) {
  const std::size_t len = context + 1, HS = cfg.head_dim();
  return cfg.n_layer * cfg.n_head * (specsample::gpt2::simd::key_elements(len, HS) + len * HS) *
         specsample::gpt2::format_bytes(kv);
}

decode_bandwidth measure_decode_bandwidth(specsample::gpt2::model& m, std::size_t bytes, const std::vector<token>& stream,
                                          std::size_t context, std::size_t samples) {
  constexpr std::size_t block = 10;
  decode_bandwidth r;
  r.bytes = bytes;
  r.kv_bytes = kv_bytes_read(m.config(), context, m.kv_storage());
  r.block = block;
  r.blocks = std::max<std::size_t>(3, samples / block);
  stream_probe probe(bytes, m.threads(), m.kernels());
  stream_probe working_set(bytes + r.kv_bytes, m.threads(), m.kernels());
  const std::span<const token> ctx(stream.data(), context), next(stream.data() + context, 1);
  m.truncate(0);
  (void)m.append(ctx);
  // A probe block: `block` untimed passes, then GB/s over `block` timed ones.
  const auto steady_gbs = [](stream_probe& pr) {
    (void)pr.seconds(block);
    return pr.gb_per_s(block, pr.seconds(block));
  };
  std::vector<double> per_token, dec, prb, ratio, ws, ws_ratio;
  for (std::size_t b = 0; b < r.blocks; ++b) {
    for (std::size_t i = 0; i < block; ++i) (void)time_append(m, next, context);
    double s = 0.0;
    for (std::size_t i = 0; i < block; ++i) {
      const double t = time_append(m, next, context);
      per_token.push_back(t);
      s += t;
    }
    const double d = static_cast<double>(bytes) * static_cast<double>(block) / s / 1e9;
    const double p = steady_gbs(probe);
    const double w = steady_gbs(working_set);
    dec.push_back(d);
    prb.push_back(p);
    ratio.push_back(d / p);
    ws.push_back(w);
    ws_ratio.push_back(static_cast<double>(bytes + r.kv_bytes) * static_cast<double>(block) / s / 1e9 / w);
  }
  r.seconds_per_token = summarize(per_token);
  r.decode_gbs = summarize(dec);
  r.probe_gbs = summarize(prb);
  r.working_set_gbs = summarize(ws);
  r.fraction = summarize(ratio).median;
  r.working_set_fraction = summarize(ws_ratio).median;
  return r;
}

json bandwidth_json(const decode_bandwidth& b) {
  return {{"weight_bytes", b.bytes}, {"blocks", b.blocks}, {"calls_per_block", b.block},
          {"seconds_per_token", to_json(b.seconds_per_token)}, {"effective_gb_per_s", to_json(b.decode_gbs)},
          {"probe_gb_per_s", to_json(b.probe_gbs)}, {"fraction", b.fraction}, {"kv_bytes", b.kv_bytes},
          {"working_set_probe_gb_per_s", to_json(b.working_set_gbs)}, {"working_set_fraction", b.working_set_fraction}};
}

// ---------------------------------------------------------------------------------------------
// FMA peak probe: `specsample_bench::fma_loop_for` (probes.hpp) on `threads` threads at once (the
// kernels' thread count: the floors below divide a call's multiply-adds by it), timed until a
// sample takes ~20 ms. GMAC/s = multiply-adds per second of all the threads / 1e9.

/// One loop's peak (`fma_loop`): what multiplies, how many rows an instruction takes at once, and
/// GMAC/s counted that way.
struct fma_peak {
  const char* instruction = "";  // fma_loop::instruction
  std::size_t rows = 1;          // fma_loop::rows
  summary gmacs;

  /// Seconds of the multiply-adds of a call of j tokens, `macs` per token, at this peak: j rows, or
  /// for tiles whole instructions of `rows` rows.
  [[nodiscard]] double seconds(std::size_t j, double macs) const {
    return static_cast<double>((j + rows - 1) / rows * rows) * macs / (gmacs.median * 1e9);
  }
};

/// The peaks of a model's matmuls: its level's vector instruction, and where it runs on AMX tiles
/// (`model::amx`) the tile dot product too. The floor of a call's multiply-adds is the lower of the
/// two (an INT8 matmul of fewer than `simd::amx_int8_rows` rows runs on vectors; either way the
/// lower one bounds what any path could reach).
struct fma_probe_result {
  specsample::isa level = specsample::isa::generic;
  fma_peak vectors;
  std::optional<fma_peak> tiles;

  [[nodiscard]] double seconds(std::size_t j, double macs) const {
    const double v = vectors.seconds(j, macs);
    return tiles ? std::min(v, tiles->seconds(j, macs)) : v;
  }
};

fma_peak probe_loop(const specsample_bench::fma_loop& loop, std::size_t reps, std::size_t threads) {
  volatile float sink = loop.run(1000);  // warm up (and wake the wide vector units)
  // `iters` iterations on every thread at once: this one and threads - 1 others (a pool's, as the
  // stream probe's: one index per thread).
  specsample::gpt2::thread_pool pool(threads);
  const auto run_all = [&](std::size_t iters) {
    pool.parallel_for(threads, [&](std::size_t b, std::size_t e, std::size_t) {
      for (std::size_t t = b; t < e; ++t) {
        const float r = loop.run(iters);
        if (t == 0) sink = r;
      }
    });
  };
  std::size_t iters = std::size_t{1} << 16;
  for (;;) {  // ~20 ms per sample
    const auto t0 = steady::now();
    run_all(iters);
    if (seconds_since(t0) >= 0.02) break;
    iters *= 2;
  }
  std::vector<double> gmacs;
  for (std::size_t r = 0; r < reps; ++r) {
    const auto t0 = steady::now();
    run_all(iters);
    gmacs.push_back(static_cast<double>(threads * iters * loop.macs_per_iteration) / seconds_since(t0) / 1e9);
  }
  (void)sink;
  return {loop.instruction, loop.rows, summarize(gmacs)};
}

fma_probe_result probe_fma(const specsample::gpt2::model& m, std::size_t reps, std::size_t threads) {
  fma_probe_result r{m.kernels(), probe_loop(specsample_bench::fma_loop_for(m.kernels(), m.matmul_precision()), reps, threads),
                     std::nullopt};
  if (m.amx()) r.tiles = probe_loop(specsample_bench::fma_loop_for(m.kernels(), m.matmul_precision(), true), reps, threads);
  return r;
}

/// Multiply-adds of the GPT-2 matmuls for one token (the four matmuls of every block and the
/// output projection): the floor of a j-token call's compute is j times this over the FMA peak.
double matmul_macs_per_token(const specsample::gpt2::config& cfg) {
  const double C = static_cast<double>(cfg.n_embd), I = static_cast<double>(cfg.n_inner);
  return static_cast<double>(cfg.n_layer) * (3 * C * C + C * C + 2 * C * I) + static_cast<double>(cfg.vocab_size) * C;
}

// ---------------------------------------------------------------------------------------------
// Machine description

// The CPU's model name with its family and model numbers (/proc/cpuinfo of the first CPU): a
// hypervisor may show only "AMD EPYC", and those numbers tell the generations apart (family 25 is
// Zen 3/Zen 4, with half the FMA width of family 26, Zen 5).
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name = "unknown", family, model;
  const auto value = [&] {
    const auto colon = line.find(':');
    return colon == std::string::npos ? std::string() : line.substr(std::min(colon + 2, line.size()));
  };
  while (std::getline(in, line) && !line.empty()) {
    if (line.rfind("model name", 0) == 0) {
      name = value();
    } else if (line.rfind("cpu family", 0) == 0) {
      family = value();
    } else if (line.rfind("model", 0) == 0 && line.find_first_not_of(" \t", 5) == line.find(':')) {
      model = value();
    }
  }
  if (family.empty()) return name;
  return fmt::format("{} (family {}{})", name, family, model.empty() ? "" : ", model " + model);
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

std::string compile_flags() {
  std::string s;
#ifdef __OPTIMIZE__
  s += "optimised";
#else
  s += "NOT optimised";
#endif
#ifdef NDEBUG
  s += ", NDEBUG";
#endif
#ifdef __AVX512F__
  s += ", AVX-512F";
#endif
#ifdef __AVX2__
  s += ", AVX2";
#endif
#ifdef __FMA__
  s += ", FMA";
#endif
#ifdef __F16C__
  s += ", F16C";
#endif
#if !defined(__AVX2__) && !defined(__AVX__)
  s += ", baseline x86-64 ISA (SSE2)";
#endif
  return s;
}

// The source revision, as scripts/bench.sh passes it (git commit, "+dirty" for local changes).
std::string revision() {
  const char* r = std::getenv("SPECSAMPLE_BENCH_REVISION");
  return r && *r ? r : "unknown";
}

json machine_json(const std::string& date, const std::string& load_start, const std::string& load_end,
                  double run_seconds) {
  return {{"cpu", cpu_model()},
          {"hardware_threads", std::thread::hardware_concurrency()},
          {"compiler", "g++ " __VERSION__},
          {"build", compile_flags()},
          {"date", date},
          {"revision", revision()},
          {"load_average_start", load_start},
          {"load_average_end", load_end},
          {"run_seconds", run_seconds}};
}

std::string fmt_t(double t) { return fmt::format("{:g}", t); }

std::string fmt_range(const summary& s, int precision = 0) {
  return fmt::format("{:.{}f} ({:.{}f}–{:.{}f})", s.median, precision, s.min, precision, s.max, precision);
}

std::string fmt_duration(double s) {
  const auto m = static_cast<int>(s / 60.0);
  return m > 0 ? fmt::format("{}m{:02d}s", m, static_cast<int>(s) % 60) : fmt::format("{:.1f}s", s);
}

// ---------------------------------------------------------------------------------------------
// Strategy comparison (--strategies): the same prompts and seeds through every strategy,
// interleaved per prompt (the order rotates from one prompt to the next), so drift hits all.

enum class method { autoregressive, token_wise, block, adaptive, p_min, auto_k, ngram, ngram_then_draft };

struct strategy {
  std::string name;
  method how = method::autoregressive;
  std::size_t k = 0;  // K; the maximum for adaptive and p_min, k_max for auto-K
  std::size_t min_n = 1;  // n-gram: the shortest suffix match that proposes
};

struct strategy_run {
  std::size_t prompt = 0, rep = 0, position = 0;  // position: when it ran within its group
  std::uint64_t seed = 0;
  specsample::generation_stats stats;
  double warmup_seconds = 0.0;  // auto-K: calibrate() (warm-up generation, single-call timing, the check)
  bool calibrated = false;      // auto-K ran
  std::size_t chosen_k = 0;     // auto-K: the K calibrate() picked, 0 when no K pays (autoregressive)
  double predicted = 0.0;       // auto-K: its predicted speedup
  std::optional<double> checked;  // auto-K: the speedup its check measured (where predicted > 1)
  bool identical = false;       // same tokens as the autoregressive run of the group
  double speedup = 0.0;         // AR seconds / these seconds (same prompt and seed)
  double speedup_with_warmup = 0.0;
  [[nodiscard]] double tps() const { return static_cast<double>(stats.tokens) / stats.decode_seconds(); }
};

struct strategy_cell {
  std::string suite;
  double temperature = 0.0;
  strategy s;
  std::vector<strategy_run> runs;
  summary tps, speedup, speedup_with_warmup, warmup, chosen_k;
  std::vector<std::size_t> chosen_k_counts;
  std::size_t vetoed = 0;  // auto-K: autoregressive runs whose K was predicted to pay but failed the check
  double tokens_per_round = 0.0, acceptance = 0.0, alpha = 0.0, drafted_per_round = 0.0;
  std::size_t identical = 0;

  void finish() {
    std::vector<double> t, sp, spw, w, ks;
    std::size_t tokens = 0, rounds = 0, drafted = 0, accepted = 0, corrections = 0;
    for (const auto& r : runs) {
      t.push_back(r.tps());
      sp.push_back(r.speedup);
      spw.push_back(r.speedup_with_warmup);
      w.push_back(r.warmup_seconds);
      ks.push_back(static_cast<double>(r.chosen_k));
      if (r.calibrated) {
        if (chosen_k_counts.size() <= r.chosen_k) chosen_k_counts.resize(r.chosen_k + 1, 0);
        ++chosen_k_counts[r.chosen_k];
        if (r.chosen_k == 0 && r.checked) ++vetoed;
      }
      tokens += r.stats.tokens;
      rounds += r.stats.rounds;
      drafted += r.stats.drafted;
      accepted += r.stats.accepted;
      corrections += r.stats.corrections;
      identical += r.identical ? 1 : 0;
    }
    tps = summarize(t);
    speedup = summarize(sp);
    speedup_with_warmup = summarize(spw);
    warmup = summarize(w);
    chosen_k = summarize(ks);
    const auto ratio = [](std::size_t a, std::size_t b) { return b ? static_cast<double>(a) / static_cast<double>(b) : 0.0; };
    tokens_per_round = ratio(tokens, rounds);
    drafted_per_round = ratio(drafted, rounds);
    acceptance = ratio(accepted, drafted);
    alpha = ratio(accepted, accepted + corrections);
  }
};

// One generation with strategy `s`; the tokens go to `tokens`.
strategy_run run_strategy(const strategy& s, specsample::gpt2::model& draft, specsample::gpt2::model& target,
                          std::span<const token> prompt, specsample::speculative_params params, std::uint64_t seed,
                          std::size_t warmup_tokens, std::size_t check_pairs, std::vector<token>& tokens) {
  strategy_run r;
  r.seed = seed;
  std::mt19937_64 rng(seed);
  params.draft_length = std::max<std::size_t>(s.k, 1);
  specsample::generation_result g;
  switch (s.how) {
    case method::autoregressive: g = specsample::autoregressive_sample(target, prompt, params, rng); break;
    case method::token_wise: g = specsample::speculative_sample(draft, target, prompt, params, rng); break;
    case method::block:
      params.verify = specsample::verification::block;
      g = specsample::speculative_sample(draft, target, prompt, params, rng);
      break;
    case method::adaptive:
      params.adaptive_draft_length = true;
      g = specsample::speculative_sample(draft, target, prompt, params, rng);
      break;
    case method::p_min:
      params.draft_min_probability = 0.5f;
      g = specsample::speculative_sample(draft, target, prompt, params, rng);
      break;
    case method::auto_k: {
      std::mt19937_64 warm_rng(seed ^ 0x9e3779b97f4a7c15ULL);  // the generation itself uses `seed`
      const auto t0 = steady::now();
      const auto cal = specsample::calibrate(draft, target, prompt, params, warm_rng, s.k, warmup_tokens, check_pairs);
      r.warmup_seconds = seconds_since(t0);
      r.calibrated = true;
      r.chosen_k = cal.pays() ? cal.best_k : 0;
      r.predicted = cal.predicted;
      if (cal.measured) r.checked = cal.measured->speedup();
      if (cal.pays()) {
        params.draft_length = cal.best_k;
        g = specsample::speculative_sample(draft, target, prompt, params, rng);
      } else {  // as a user would: no K pays (predicted, or checked by timing)
        g = specsample::autoregressive_sample(target, prompt, params, rng);
      }
      break;
    }
    case method::ngram: {
      auto ngram = specsample::drafters::ngram::from_shortest(static_cast<std::size_t>(target.vocab_size()), s.min_n);
      g = specsample::speculative_sample(ngram, target, prompt, params, rng);
      break;
    }
    case method::ngram_then_draft: {
      specsample::drafters::fallback lookup(
          specsample::drafters::ngram::from_shortest(static_cast<std::size_t>(target.vocab_size()), s.min_n),
          specsample::model_drafter(draft, params.draft_warping()));
      g = specsample::speculative_sample(lookup, target, prompt, params, rng);
      break;
    }
  }
  r.stats = g.stats;
  tokens = std::move(g.tokens);
  return r;
}

// A prompt that repeats itself: the passage, a blank line, then its own first two lines again
// (the speaker line and the first verse line), so a faithful continuation copies the passage.
std::string repeating_prompt(const std::string& passage) {
  std::size_t end = passage.find('\n');
  if (end != std::string::npos) end = passage.find('\n', end + 1);
  const std::string head = end == std::string::npos ? passage : passage.substr(0, end + 1);
  std::string p = passage;
  if (p.empty() || p.back() != '\n') p += '\n';
  return p + '\n' + head;
}

struct suite {
  std::string name, description;
  std::vector<std::vector<token>> prompts;
  std::vector<double> temperatures;
  std::vector<strategy> strategies;  // the first is autoregressive
};

struct bench_setup {
  const cli& c;
  specsample::gpt2::model& target;
  specsample::gpt2::model& draft;
  const specsample::bpe_tokenizer& tok;
  const std::vector<std::string>& prompt_text;
  const std::vector<std::vector<token>>& prompts;
  fs::path target_dir, draft_dir, prompts_file;
  std::string load_start, date, command;
  steady::time_point t_start;
};

// The acceptance scan of draft temperatures (--draft-temperatures): `scan_draft_temperature` at
// each T > 0 over the prompts, each --reps times: per ratio R the α each --draft-temperature-ratio
// would give. No timing.
int run_draft_temperature_scan(const bench_setup& b) {
  const cli& c = b.c;
  const auto& ratios = c.draft_temperature_scan;
  std::string md = fmt::format(
      "### Draft temperature scan: {} drafting for {}\n\n`{}` — {} prompts × {} seeds × {} tokens of the target's own "
      "generations per temperature{}; {}; source {}; {}.\n\nMean over positions of Σ min(p, q), q the draft at R × T "
      "(the expected acceptance α at --draft-temperature-ratio R); the best R of each row in bold. T = 0 has no row: "
      "there both models are greedy, whatever R.\n\n| T |",
      b.draft_dir.filename().string(), b.target_dir.filename().string(), b.command, b.prompts.size(), c.reps, c.n,
      setup_note(c), cpu_model(), revision(), b.date);
  for (const double r : ratios) md += fmt::format(" R = {:g} |", r);
  md += "\n|---|";
  for (std::size_t i = 0; i < ratios.size(); ++i) md += "---|";
  md += "\n";
  // Each prompt --reps times: the target's generations differ by the generator's state.
  std::vector<std::vector<token>> texts;
  for (std::size_t rep = 0; rep < c.reps; ++rep) texts.insert(texts.end(), b.prompts.begin(), b.prompts.end());
  json rows = json::array();
  for (std::size_t ti = 0; ti < c.temperatures.size(); ++ti) {
    const double temp = c.temperatures[ti];
    if (temp == 0.0) continue;  // greedy: the draft's argmax whatever its temperature
    std::mt19937_64 rng(c.seed + 1000003ULL * ti);
    const auto scan = specsample::scan_draft_temperature(b.draft, b.target, std::span<const std::vector<token>>(texts),
                                                         generation_params(c, temp), std::span<const double>(ratios),
                                                         rng, c.n);
    md += fmt::format("| {:g} |", temp);
    for (std::size_t ri = 0; ri < ratios.size(); ++ri) {
      md += scan.ratios[ri] == scan.best_ratio() ? fmt::format(" **{:.4f}** |", scan.alpha[ri])
                                                 : fmt::format(" {:.4f} |", scan.alpha[ri]);
    }
    md += "\n";
    rows.push_back({{"temperature", temp}, {"positions", scan.positions}, {"ratios", scan.ratios}, {"alpha", scan.alpha},
                    {"best_ratio", scan.best_ratio()}});
  }
  fmt::print("{}", md);
  if (c.out) {
    specsample_bench::write_file(*c.out, "draft-temperatures.md", md);
    json j;
    j["command"] = b.command;
    j["machine"] = machine_json(b.date, b.load_start, load_average(), seconds_since(b.t_start));
    j["config"] = {{"target", b.target_dir.string()}, {"draft", b.draft_dir.string()},
                   {"prompts_file", b.prompts_file.string()}, {"n", c.n}, {"reps", c.reps}, {"seed", c.seed},
                   {"quick", c.quick}};
    j["config"].update(specsample::gpt2::precision_json(c.model));
    j["config"]["draft_matmul"] = specsample::gpt2::precision_name(draft_options(c).matmul_precision);
    j["rows"] = rows;
    specsample_bench::write_file(*c.out, "draft-temperatures.json", dump_json(j, 2) + "\n");
  }
  return 0;
}

// Auto-K's choices: "autoregressive: 31 (28 by the check), K=1: 4, ...".
std::string fmt_k_counts(const std::vector<std::size_t>& counts, std::size_t vetoed) {
  std::vector<std::string> parts;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    if (counts[k] == 0) continue;
    parts.push_back(k == 0 ? fmt::format("autoregressive: {} ({} by the check)", counts[k], vetoed)
                           : fmt::format("K={}: {}", k, counts[k]));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

int run_strategies(const bench_setup& b) {
  const cli& c = b.c;
  const std::size_t limit = std::min(b.target.max_size(), b.draft.max_size());
  const auto sweep_at = [&](double t) -> const sweep_best* {
    for (const auto& s : c.best_k_sweep) {
      if (s.temperature == t) return &s;
    }
    return nullptr;
  };
  // The sweep's best K at temperature t when it is not the fixed K = 4 every run has: the strategy
  // runs add it, and the block-vs-token-wise table reports it.
  const auto extra_k = [&](double t) -> std::optional<std::size_t> {
    if (const auto* best = sweep_at(t); best && best->k != 4) return best->k;
    return std::nullopt;
  };

  // Suite 1: the held-out prompts.
  suite held;
  held.name = "held-out";
  held.description = "benchmarks/prompts.txt";
  held.prompts = b.prompts;
  held.temperatures = c.temperatures;
  held.strategies = {{"autoregressive", method::autoregressive, 0},
                     {"token-wise K=4", method::token_wise, 4},
                     {"block K=4", method::block, 4},
                     {"adaptive K≤8", method::adaptive, 8},
                     {"p_min=0.5 K≤8", method::p_min, 8},
                     {"auto-K (≤8)", method::auto_k, 8},
                     {"n-gram K=4", method::ngram, 4},
                     {"n-gram K=4, min_n=3", method::ngram, 4, 3},
                     {"n-gram (min_n=3), else draft K=4", method::ngram_then_draft, 4, 3}};
  // Suite 2: prompts that repeat their own text.
  suite rep;
  rep.name = "repetitive";
  rep.description = "each held-out prompt, a blank line, then its own first two lines again";
  for (std::size_t i = 0; i < b.prompt_text.size(); ++i) {
    auto p = b.tok.encode(repeating_prompt(b.prompt_text[i]));
    if (c.n > specsample::max_new_tokens_within(limit, p.size())) {
      fmt::print(stderr, "specsample-bench: repetitive prompt {} has {} tokens, too long for -n {}: skipped\n", i,
                 p.size(), c.n);
      continue;
    }
    rep.prompts.push_back(std::move(p));
  }
  rep.temperatures = c.repetitive_temperatures;
  rep.strategies = {{"autoregressive", method::autoregressive, 0},
                    {"n-gram K=4", method::ngram, 4},
                    {"n-gram K=8", method::ngram, 8},
                    {"n-gram K=4, min_n=3", method::ngram, 4, 3},
                    {"n-gram (min_n=3), else draft K=4", method::ngram_then_draft, 4, 3},
                    {"token-wise K=4 (draft model)", method::token_wise, 4}};

  std::vector<suite> suites{held, rep};
  std::size_t total_groups = 0;
  for (const auto& s : suites) total_groups += s.temperatures.size() * c.reps * s.prompts.size();
  std::size_t done = 0;
  std::vector<strategy_cell> cells;
  std::size_t greedy_runs = 0, greedy_identical = 0;
  const auto start = steady::now();

  for (const auto& su : suites) {
    for (std::size_t ti = 0; ti < su.temperatures.size(); ++ti) {
      const double temp = su.temperatures[ti];
      std::vector<strategy> strategies = su.strategies;
      if (su.name == "held-out") {
        // At the sweep's best K also token-wise (when that K is not 4) and block verification (at
        // T > 0: at T = 0 the two are the same rule).
        if (const auto k = extra_k(temp)) {
          strategies.insert(strategies.begin() + 2, {fmt::format("token-wise K={} (sweep's best)", *k),
                                                     method::token_wise, *k});
          if (temp > 0.0) {
            strategies.insert(strategies.begin() + 4, {fmt::format("block K={} (sweep's best)", *k),
                                                       method::block, *k});
          }
        }
      }
      std::vector<strategy_cell> group(strategies.size());
      for (std::size_t si = 0; si < strategies.size(); ++si) {
        group[si].suite = su.name;
        group[si].temperature = temp;
        group[si].s = strategies[si];
      }
      const specsample::speculative_params params = generation_params(c, temp);
      for (std::size_t r = 0; r < c.reps; ++r) {
        for (std::size_t pi = 0; pi < su.prompts.size(); ++pi) {
          const std::uint64_t seed = c.seed + 1000003ULL * ti + 1009ULL * r + pi;
          const std::size_t shift = (pi + r * su.prompts.size()) % strategies.size();
          std::vector<strategy_run> runs(strategies.size());
          std::vector<std::vector<token>> outputs(strategies.size());
          for (std::size_t o = 0; o < strategies.size(); ++o) {
            const std::size_t si = (o + shift) % strategies.size();
            runs[si] = run_strategy(strategies[si], b.draft, b.target, su.prompts[pi], params, seed, c.warmup_tokens,
                                    c.check_pairs, outputs[si]);
            runs[si].prompt = pi;
            runs[si].rep = r;
            runs[si].position = o;
          }
          const double ar_seconds = runs[0].stats.decode_seconds();
          for (std::size_t si = 0; si < strategies.size(); ++si) {
            auto& run = runs[si];
            run.identical = outputs[si] == outputs[0];
            run.speedup = ar_seconds / run.stats.decode_seconds();
            run.speedup_with_warmup = ar_seconds / (run.stats.decode_seconds() + run.warmup_seconds);
            if (temp == 0.0 && si > 0) {
              ++greedy_runs;
              greedy_identical += run.identical ? 1 : 0;
              if (!run.identical) {
                fmt::print(stderr, "specsample-bench: GUARD FAILED: {} suite, T=0, {}, prompt {} rep {}: output differs "
                                   "from autoregressive\n", su.name, strategies[si].name, pi, r);
              }
            }
            group[si].runs.push_back(std::move(run));
          }
          ++done;
        }
      }
      for (auto& g : group) g.finish();
      const double elapsed = seconds_since(start);
      fmt::print(stderr, "[{} T={}] ", su.name, fmt_t(temp));
      for (std::size_t si = 1; si < group.size(); ++si) {
        fmt::print(stderr, "{} {:.2f}x{}", group[si].s.name, group[si].speedup.median, si + 1 < group.size() ? ", " : "");
      }
      fmt::print(stderr, " | {}/{} groups, {} elapsed, ~{} left\n", done, total_groups, fmt_duration(elapsed),
                 fmt_duration(elapsed / static_cast<double>(done) * static_cast<double>(total_groups - done)));
      for (auto& g : group) cells.push_back(std::move(g));
    }
  }
  const bool guard_ok = greedy_runs == greedy_identical;
  const double total_seconds = seconds_since(b.t_start);
  const std::string load_end = load_average();

  const auto find = [&](const std::string& su, double t, method how, std::size_t k) -> const strategy_cell* {
    for (const auto& cl : cells) {
      if (cl.suite == su && cl.temperature == t && cl.s.how == how && cl.s.k == k && cl.s.min_n == 1) return &cl;
    }
    return nullptr;
  };

  // ---- markdown report ------------------------------------------------------------------------
  std::string md;
  auto out = [&md]<class... A>(fmt::format_string<A...> f, A&&... args) {
    md += fmt::format(f, std::forward<A>(args)...);
  };
  out("### Strategies: {} drafting for {}\n\n", b.draft_dir.filename().string(), b.target_dir.filename().string());
  out("`{}` — {} tokens per run, {} rep(s), {} kernel thread(s) shared by the models, {}{}, seed {}; {}; {} cores; {}; {}; "
      "source {}; {}; load average {} at start, {} at end; run time {}.\n\n",
      b.command, c.n, c.reps, b.target.threads(), kernels_note(b.target, b.draft), setup_note(c), c.seed, cpu_model(), std::thread::hardware_concurrency(),
      "g++ " __VERSION__, compile_flags(), revision(), b.date, b.load_start, load_end, fmt_duration(total_seconds));
  out("Correctness guard (T = 0): every strategy's tokens == autoregressive tokens in {}/{} runs: **{}**\n\n",
      greedy_identical, greedy_runs, greedy_runs == 0 ? "not run (no T = 0)" : guard_ok ? "PASS" : "FAIL");
  out("Tokens/s, speedups and time ratios time the decode phase: each generation call minus its prompt prefill, "
      "as in the sweep.\n\n");
  for (const auto& su : suites) {
    out("#### {} prompts ({} prompts: {})\n\n", su.name, su.prompts.size(), su.description);
    out("| T | strategy | tok/s med (min–max) | speedup vs AR med (min–max) | tokens/round | drafted/round | accept | α "
        "| auto-K: chosen K (runs) · warm-up s med · speedup incl. warm-up |\n|---|---|---|---|---|---|---|---|---|\n");
    for (const auto& cl : cells) {
      if (cl.suite != su.name) continue;
      const bool ar = cl.s.how == method::autoregressive;
      const std::string extra = cl.s.how == method::auto_k
                                    ? fmt::format("{} · {:.2f} · {:.2f}x", fmt_k_counts(cl.chosen_k_counts, cl.vetoed),
                                                  cl.warmup.median, cl.speedup_with_warmup.median)
                                    : "";
      out("| {} | {} | {} | {} | {:.2f} | {:.2f} | {} | {} | {} |\n", fmt_t(cl.temperature), cl.s.name, fmt_range(cl.tps),
          ar ? std::string("1 (reference)") : fmt_range(cl.speedup, 2), cl.tokens_per_round, cl.drafted_per_round,
          ar ? std::string("–") : fmt::format("{:.3f}", cl.acceptance), ar ? std::string("–") : fmt::format("{:.3f}", cl.alpha),
          extra);
    }
    out("\n");
  }
  out("#### Block vs token-wise verification (K = 4 and the sweep's best K, held-out prompts)\n\n");
  out("| T | K | tokens/round token-wise | tokens/round block | block gain | speedup token-wise | speedup block "
      "| paired time, token-wise / block, med (min–max) |\n|---|---|---|---|---|---|---|---|\n");
  for (const double t : c.temperatures) {
    std::vector<std::size_t> ks{4};
    if (const auto k = extra_k(t)) ks.push_back(*k);
    for (const std::size_t k : ks) {
      const auto* tw = find("held-out", t, method::token_wise, k);
      const auto* bl = find("held-out", t, method::block, k);
      if (!tw || !bl) continue;
      std::vector<double> ratio;
      for (std::size_t i = 0; i < tw->runs.size(); ++i) ratio.push_back(tw->runs[i].stats.decode_seconds() / bl->runs[i].stats.decode_seconds());
      out("| {} | {} | {:.3f} | {:.3f} | {:+.1f}% | {:.2f}x | {:.2f}x | {} |\n", fmt_t(t), k, tw->tokens_per_round,
          bl->tokens_per_round, 100.0 * (bl->tokens_per_round / tw->tokens_per_round - 1.0), tw->speedup.median,
          bl->speedup.median, fmt_range(summarize(ratio), 3));
    }
  }
  out("\n#### Auto-K vs the best fixed K (held-out prompts)\n\n");
  out("| T | best fixed K (source) | its speedup here | sweep's speedup there | auto-K chosen K (runs) | auto-K speedup "
      "| auto / best fixed | incl. warm-up | auto / best fixed, incl. warm-up |\n|---|---|---|---|---|---|---|---|---|\n");
  for (const double t : c.temperatures) {
    const auto* best_s = sweep_at(t);
    const std::size_t k = best_s ? best_s->k : 4;
    const auto* fixed = find("held-out", t, method::token_wise, k);
    const auto* au = find("held-out", t, method::auto_k, 8);
    if (!fixed || !au) continue;
    out("| {} | {} ({}) | {:.2f}x | {} | {} | {:.2f}x | {:.3f} | {:.2f}x | {:.3f} |\n", fmt_t(t), k,
        best_s ? (best_s->block ? "sweep.json, a block-verification sweep" : "sweep.json") : "no sweep: K = 4",
        fixed->speedup.median,
        best_s ? fmt::format("{:.2f}x", best_s->speedup) : std::string("–"), fmt_k_counts(au->chosen_k_counts, au->vetoed),
        au->speedup.median, au->speedup.median / fixed->speedup.median, au->speedup_with_warmup.median,
        au->speedup_with_warmup.median / fixed->speedup.median);
  }
  out("\n");
  fmt::print("{}", md);

  if (c.out) {
    specsample_bench::write_file(*c.out, "strategies.md", md);
    json j;
    j["command"] = b.command;
    j["machine"] = machine_json(b.date, b.load_start, load_end, total_seconds);
    j["config"] = {{"target", b.target_dir.string()}, {"draft", b.draft_dir.string()},
                   {"prompts_file", b.prompts_file.string()}, {"n", c.n}, {"reps", c.reps},
                   {"threads", b.target.threads()}, {"kernels", specsample::isa_name(b.target.kernels())},
                   {"seed", c.seed}, {"warmup_tokens", c.warmup_tokens}, {"check_pairs", c.check_pairs},
                   {"best_k_from", c.best_k_from ? c.best_k_from->string() : std::string()}, {"quick", c.quick}};
    j["config"].update(specsample::gpt2::precision_json(c.model));
    j["config"]["draft_matmul"] = specsample::gpt2::precision_name(draft_options(c).matmul_precision);
    j["config"]["draft_temperature_ratio"] = c.draft_temperature_ratio;
    j["config"]["amx"] = {{"target", b.target.amx()}, {"draft", b.draft.amx()}};
    j["guard"] = {{"greedy_runs", greedy_runs}, {"identical", greedy_identical}, {"pass", guard_ok}};
    json cj = json::array();
    for (const auto& cl : cells) {
      json runs = json::array();
      for (const auto& r : cl.runs) {
        runs.push_back({{"prompt", r.prompt}, {"rep", r.rep}, {"seed", r.seed}, {"position", r.position},
                        {"identical_to_autoregressive", r.identical}, {"speedup", r.speedup},
                        {"speedup_with_warmup", r.speedup_with_warmup}, {"warmup_seconds", r.warmup_seconds},
                        {"chosen_k", r.chosen_k}, {"predicted", r.predicted},
                        {"checked", r.checked ? nlohmann::json(*r.checked) : nlohmann::json(nullptr)},
                        {"autoregressive_fallback", r.calibrated && r.chosen_k == 0},  // auto-K: no K paid
                        {"stats", stats_json(r.stats)}});
      }
      cj.push_back({{"suite", cl.suite}, {"temperature", cl.temperature}, {"strategy", cl.s.name}, {"k", cl.s.k},
                    {"tokens_per_second", to_json(cl.tps)}, {"speedup_paired", to_json(cl.speedup)},
                    {"speedup_paired_with_warmup", to_json(cl.speedup_with_warmup)},
                    {"warmup_seconds", to_json(cl.warmup)}, {"chosen_k_counts", cl.chosen_k_counts}, {"check_vetoes", cl.vetoed},
                    {"tokens_per_round", cl.tokens_per_round}, {"drafted_per_round", cl.drafted_per_round},
                    {"acceptance_rate", cl.acceptance}, {"alpha", cl.alpha}, {"identical_runs", cl.identical},
                    {"runs", runs}});
    }
    j["cells"] = cj;
    specsample_bench::write_file(*c.out, "strategies.json", dump_json(j, 1) + '\n');
    fmt::print(stderr, "specsample-bench: wrote {}/strategies.md, strategies.json\n", c.out->string());
  }
  fmt::print(stderr, "specsample-bench: done in {}\n", fmt_duration(total_seconds));
  if (!guard_ok) {
    fmt::print(stderr, "specsample-bench: FAILED: at temperature 0, {} of {} runs differ from autoregressive decoding\n",
               greedy_runs - greedy_identical, greedy_runs);
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------

int run(int argc, char** argv) {
  const auto t_start = steady::now();
  const cli c = parse(argc, argv);
  if (const std::string note = specsample::gpt2::oversubscription_note("--threads", c.threads); !note.empty()) {
    fmt::print(stderr, "specsample-bench: note: {}\n", note);
  }
  const std::string load_start = load_average();
  const std::string date = utc_now();

  const fs::path models = (c.target && c.draft) ? fs::path() : bundled_models();
  const fs::path target_dir = c.target.value_or(models / default_target);
  const fs::path draft_dir = c.draft.value_or(models / default_draft);
  const fs::path prompts_file = c.prompts.value_or(default_prompts());

  specsample::gpt2::require_model_directory(target_dir);  // (before the tokenizer is read from it)
  specsample::gpt2::require_model_directory(draft_dir);
  std::vector<std::string> prompt_text = specsample::io::read_prompt_list(prompts_file);  // (before the models load)
  if (c.max_prompts != 0 && prompt_text.size() > c.max_prompts) prompt_text.resize(c.max_prompts);
  fmt::print(stderr, "specsample-bench: loading {} and {}\n", target_dir.string(), draft_dir.string());
  const auto tok = specsample::bpe_tokenizer::load(target_dir);
  specsample::check_same_vocabulary(specsample::bpe_tokenizer::load(draft_dir), tok, draft_dir.string(),
                                    target_dir.string());
  specsample::gpt2::options opts = c.model;
  opts.pool = std::make_shared<specsample::gpt2::thread_pool>(c.threads);  // shared by the two models
  opts.batch_capacity = std::max<std::size_t>(16, c.k_max + 2);
  auto target = specsample::gpt2::model::load(target_dir, opts);
  specsample::check_model_vocabulary(target.vocab_size(), tok, target_dir.string());
  specsample::gpt2::options draft_opts = draft_options(c);
  draft_opts.pool = opts.pool;
  draft_opts.batch_capacity = opts.batch_capacity;
  auto draft = specsample::gpt2::model::load(draft_dir, draft_opts);
  specsample::check_model_vocabulary(draft.vocab_size(), tok, draft_dir.string());  // (its tokenizer is tok's)
  const bool target_held = held_otherwise(c.model);  // (its weights × 2 are then not its F32 bytes)

  std::vector<std::vector<token>> prompts;
  const std::size_t limit = std::min(target.max_size(), draft.max_size());
  if (c.k_max + 2 > limit) {  // the cost measurement appends K + 1 tokens after a context of at least one
    throw specsample::error(fmt::format("--k-max {}: a verification call of {} tokens does not fit the models' context "
                                        "of {} tokens after any prompt",
                                        c.k_max, c.k_max + 1, limit));
  }
  for (std::size_t i = 0; i < prompt_text.size(); ++i) {
    prompts.push_back(tok.encode(prompt_text[i]));
    if (prompts.back().empty()) throw specsample::error(fmt::format("prompt {} encodes to no tokens", i));
    const std::size_t fits = specsample::max_new_tokens_within(limit, prompts.back().size());
    if (fits == 0) {  // no -n helps
      throw specsample::error(fmt::format("prompt {} has {} tokens, more than the models' context of {} tokens "
                                          "leaves room for: shorten it to at most {} tokens or drop it",
                                          i, prompts.back().size(), limit, limit));
    }
    if (c.n > fits) {
      throw specsample::error(fmt::format("prompt {} has {} tokens: with -n {} the models need a context of more "
                                          "than their {} tokens; lower -n (at most {} here)",
                                          i, prompts.back().size(), c.n, limit, fits));
    }
  }
  std::vector<double> prompt_lengths;
  for (const auto& p : prompts) prompt_lengths.push_back(static_cast<double>(p.size()));

  // The output directory, after the setup's checks and before the runs (which can take hours).
  if (c.out) specsample_bench::check_output_directory(*c.out, "--out");

  // Warm-up: one generation of each kind, untimed.
  {
    specsample::speculative_params params = generation_params(c, 0.0);
    params.draft_length = std::min<std::size_t>(4, c.k_max);
    std::mt19937_64 rng(c.seed);
    (void)specsample::autoregressive_sample(target, prompts[0], params, rng);
    (void)specsample::speculative_sample(draft, target, prompts[0], params, rng);
  }

  std::string command = "specsample-bench";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  if (!c.draft_temperature_scan.empty()) {
    return run_draft_temperature_scan({c, target, draft, tok, prompt_text, prompts, target_dir, draft_dir, prompts_file,
                                       load_start, date, command, t_start});
  }
  if (c.strategies) {
    return run_strategies({c, target, draft, tok, prompt_text, prompts, target_dir, draft_dir, prompts_file, load_start,
                           date, command, t_start});
  }

  // Cost ratio at a typical mid-generation context length: the median prompt plus n/2 tokens.
  std::vector<token> stream;
  for (const auto& p : prompts) stream.insert(stream.end(), p.begin(), p.end());
  while (stream.size() < limit) stream.insert(stream.end(), prompts[0].begin(), prompts[0].end());
  const std::size_t context = std::min(static_cast<std::size_t>(summarize(prompt_lengths).median) + c.n / 2,
                                       limit - c.k_max - 1);
  fmt::print(stderr, "specsample-bench: cost ratio ({} samples at context {})\n", c.cost_samples, context);
  const cost_result costs_before = measure_costs(draft, target, stream, context, c.k_max, c.cost_samples);

  // The sweep, then at each temperature its best K once more on fresh seeds (`confirmations`): the
  // best of c.k_max noisy cells reads high by selection, so the Targets take the best K's speedup
  // from runs that did not choose it.
  std::vector<cell> cells, confirmations;
  const std::size_t total_pairs = c.temperatures.size() * (c.k_max + 1) * c.reps * prompts.size();
  std::size_t done = 0;
  const auto sweep_start = steady::now();
  // One cell: reps [rep0, rep0 + c.reps) of every prompt at (temperature index ti, K = k); a
  // pair's seed depends on its temperature, rep and prompt, not on K (the cells of a temperature
  // share their autoregressive generations' random numbers).
  const auto run_cell = [&](std::size_t ti, std::size_t k, std::size_t rep0, const char* label) {
    const double temp = c.temperatures[ti];
    cell cl;
    cl.temperature = temp;
    cl.k = k;
    specsample::position_acceptance positions(k);
    specsample::speculative_params params = generation_params(c, temp);
    params.draft_length = k;
    for (std::size_t rep = rep0; rep < rep0 + c.reps; ++rep) {
      for (std::size_t pi = 0; pi < prompts.size(); ++pi) {
        run_pair p;
        p.prompt = pi;
        p.rep = rep;
        p.seed = c.seed + 1000003ULL * ti + 1009ULL * rep + pi;
        p.ar_first = (rep + pi + k) % 2 == 0;
        std::vector<token> ar_tokens, spec_tokens;
        auto run_ar = [&] {
          std::mt19937_64 rng(p.seed);
          auto r = specsample::autoregressive_sample(target, prompts[pi], params, rng);
          p.ar = r.stats;
          ar_tokens = std::move(r.tokens);
        };
        auto run_spec = [&] {
          std::mt19937_64 rng(p.seed);
          auto r = specsample::speculative_sample(draft, target, prompts[pi], params, rng, positions);
          p.spec = r.stats;
          spec_tokens = std::move(r.tokens);
        };
        if (p.ar_first) {
          run_ar();
          run_spec();
        } else {
          run_spec();
          run_ar();
        }
        p.identical = ar_tokens == spec_tokens;
        if (temp == 0.0 && !p.identical) {
          fmt::print(stderr, "specsample-bench: GUARD FAILED: T=0 K={} prompt {} rep {}: speculative output differs "
                             "from autoregressive\n", k, pi, rep);
        }
        cl.runs.push_back(std::move(p));
        ++done;
      }
    }
    for (std::size_t i = 0; i < k; ++i) {
      cl.pos_tested.push_back(positions.reached(i));
      cl.pos_accepted.push_back(positions.accepted(i));
    }
    cl.finish();
    const double elapsed = seconds_since(sweep_start);
    fmt::print(stderr,
               "[T={} K={}{}] AR {:.0f} tok/s, speculative {:.0f} tok/s, speedup {:.2f}x pooled, {:.2f}x median "
               "(predicted {:.2f}x), alpha {:.3f} | {}/{} pairs, {} elapsed, ~{} left\n",
               fmt_t(temp), k, label, cl.ar_tps.median, cl.spec_tps.median, cl.speedup_pooled, cl.speedup.median,
               cl.predicted, cl.alpha, done, total_pairs, fmt_duration(elapsed),
               fmt_duration(elapsed / static_cast<double>(done) * static_cast<double>(total_pairs - done)));
    return cl;
  };
  std::vector<std::size_t> best_cell;  // per temperature, the index in cells of the highest pooled speedup
  for (std::size_t ti = 0; ti < c.temperatures.size(); ++ti) {
    const std::size_t first = cells.size();
    for (std::size_t k = 1; k <= c.k_max; ++k) cells.push_back(run_cell(ti, k, 0, ""));
    const auto chosen = std::max_element(cells.begin() + static_cast<std::ptrdiff_t>(first), cells.end(),
                                         [](const cell& a, const cell& b) { return a.speedup_pooled < b.speedup_pooled; });
    best_cell.push_back(static_cast<std::size_t>(chosen - cells.begin()));
    confirmations.push_back(run_cell(ti, chosen->k, c.reps, ", confirmation"));
  }

  fmt::print(stderr, "specsample-bench: cost ratio again (drift check) and memory bandwidth probe\n");
  const cost_result costs_after = measure_costs(draft, target, stream, context, c.k_max, c.cost_samples);
  // The figures below (machine floors, c, targets) use the quieter of the two cost
  // measurements: the one whose single-token target call has the lower median (a slow phase of
  // the shared machine during one of them shows as a slower median).
  const bool before_quieter = costs_before.target_j.front().median <= costs_after.target_j.front().median;
  const cost_result& costs = before_quieter ? costs_before : costs_after;
  const char* costs_name = before_quieter ? "before" : "after";

  // A model's weight bytes: what a single-token pass reads of its weights, as held
  // (`weights::decode_bytes`; the checkpoint file also holds the whole wpe, the attention masks
  // the loader ignores and its header).
  const std::size_t target_bytes = target.weights().decode_bytes();
  const std::size_t draft_bytes = draft.weights().decode_bytes();
  const std::size_t threads = target.threads();
  std::vector<probe_result> probes;
  const std::size_t beyond_llc = std::size_t{256} << 20;
  std::vector<std::pair<std::string, std::size_t>> sizes{
      {fmt::format("draft weights ({})", draft_weights_basis(c)), draft_bytes},
      {fmt::format("target weights ({})", weights_basis(c.model)), target_bytes}};
  // Twice a target's weights shows the step past the last-level cache only while it is below the
  // 256 MiB row; for a GPT-2-sized target (0.5-6.4 GB) it would only hold gigabytes more memory.
  if (2 * target_bytes < beyond_llc) {
    sizes.emplace_back(target_held ? "target weights × 2" : "target weights × 2 (as float32)", 2 * target_bytes);
  }
  sizes.emplace_back("256 MiB (> last-level cache)", beyond_llc);
  std::vector<std::size_t> thread_counts{1};
  if (threads > 1) thread_counts.push_back(threads);
  for (const auto& [label, bytes] : sizes) {
    for (const std::size_t th : thread_counts) probes.push_back(probe_bandwidth(label, bytes, th, c.probe_reps, target.kernels()));
  }
  const auto probe_at = [&](std::size_t bytes) {
    for (const auto& p : probes) {
      if (p.threads == threads && p.bytes == bytes / sizeof(float) * sizeof(float)) return p.gbs.median;
    }
    return std::nan("");
  };
  // Machine floors: a j-token target call takes at least the longer of streaming its matmul
  // weights at the probe's bandwidth and its matmuls' multiply-adds at the FMA peak (attention,
  // norms and everything else counted as free). v_floor(j) = floor(j) / floor(1).
  fmt::print(stderr, "specsample-bench: FMA peak probe ({})\n", specsample::isa_name(target.kernels()));
  const fma_probe_result fma = probe_fma(target, c.probe_reps, threads);
  const double macs_token = matmul_macs_per_token(target.config());
  const double stream_floor = static_cast<double>(target.weights().matmul_bytes()) / (probe_at(target_bytes) * 1e9);
  const auto floor_seconds = [&](std::size_t j) {
    return std::max(stream_floor, fma.seconds(j, macs_token));
  };
  const auto v_floor = [&](std::size_t j) { return floor_seconds(j) / floor_seconds(1); };
  // The draft's single-token call has the same kind of floor, its weight stream taken at the
  // probe's bandwidth at the draft's size (the last-level cache's: faster than the memory a cold
  // draft call really reads from, so the floor stays a lower bound). c_floor = the ratio of the
  // two models' floors.
  // (A draft that multiplies otherwise, --draft-matmul, at its own precision's peak.)
  const double macs_draft = matmul_macs_per_token(draft.config());
  const fma_probe_result draft_fma =
      draft.matmul_precision() == target.matmul_precision() && draft.amx() == target.amx()
          ? fma
          : probe_fma(draft, c.probe_reps, threads);
  const double draft_floor =
      std::max(static_cast<double>(draft.weights().matmul_bytes()) / (probe_at(draft_bytes) * 1e9),
               draft_fma.seconds(1, macs_draft));
  const double c_floor = draft_floor / floor_seconds(1);
  // The floors are lower bounds only if no measured call beat them (a probe run in a slow phase
  // of the machine would make them too high): where one did, no goal is called beyond the limits.
  bool floors_hold = costs.draft_1.median >= draft_floor;
  for (std::size_t j = 1; j <= costs.target_j.size(); ++j) floors_hold = floors_hold && costs.target_j[j - 1].median >= floor_seconds(j);
  // The speedup a cell could reach with its measured tokens per call if its calls cost only their
  // floors: tokens per call / (c·K + v_floor(K + 1)), with the draft's measured calls over the
  // target's floor (`ceiling`: the target's calls at their floors) or with c_floor (`ceiling_all`:
  // the draft's too). Tokens per call come
  // from the acceptance, a property of the two models, not of the kernels: at this acceptance no
  // kernel of this level (its FMA peak, its probes) that reads the weights once per call beats
  // ceiling_all (up to the probes' noise).
  const auto ceiling = [&](const cell& cl) {
    return cl.tokens_per_call / (cl.draft_call_seconds / floor_seconds(1) * static_cast<double>(cl.k) + v_floor(cl.k + 1));
  };
  const auto ceiling_all = [&](const cell& cl) {
    return cl.tokens_per_call / (c_floor * static_cast<double>(cl.k) + v_floor(cl.k + 1));
  };
  // The best of `f` over the cells of one temperature, and its K.
  const auto best_of = [&](double temp, const auto& f) {
    std::pair<double, std::size_t> top{0.0, 0};
    for (const auto& cl : cells) {
      if (cl.temperature == temp && f(cl) > top.first) top = {f(cl), cl.k};
    }
    return top;
  };
  fmt::print(stderr, "specsample-bench: decode bandwidth beside the probe\n");
  const decode_bandwidth target_bw = measure_decode_bandwidth(target, target_bytes, stream, context, c.cost_samples);
  const decode_bandwidth draft_bw = measure_decode_bandwidth(draft, draft_bytes, stream, context, c.cost_samples);

  // Thread scaling of the target's (K+1)-token verification call and single-token decode.
  std::optional<scaling_result> scaling5, scaling1;
  const std::size_t scale_tokens = std::min<std::size_t>(5, c.k_max + 1);
  const std::size_t usable_cpus = specsample::gpt2::usable_hardware_threads();  // (taskset -c 0: 1)
  if (usable_cpus >= 2) {
    fmt::print(stderr, "specsample-bench: thread scaling (target with 1 and 2 threads)\n");
    specsample::gpt2::options other = opts;
    other.pool = std::make_shared<specsample::gpt2::thread_pool>(threads == 1 ? 2 : 1);
    other.threads = 0;
    auto target2 = specsample::gpt2::model::load(target_dir, other);
    const specsample::gpt2::thread_pool& many = threads == 1 ? *other.pool : *opts.pool;
    // The busy neighbours of the one-thread model: one-thread models on its matmul weights (shared).
    const specsample::gpt2::model& solo = threads == 1 ? target : target2;
    specsample::gpt2::options alone = threads == 1 ? opts : other;
    alone.pool = nullptr;
    alone.threads = 1;
    std::vector<specsample::gpt2::model> neighbours;
    for (std::size_t w = 1; w < many.size(); ++w) neighbours.emplace_back(solo.config(), solo.weights(), alone);
    scaling5 = measure_thread_scaling(target, target2, many, neighbours, stream, context, scale_tokens, c.cost_samples);
    scaling1 = measure_thread_scaling(target, target2, many, neighbours, stream, context, 1, c.cost_samples);
  }
  fmt::print(stderr, "specsample-bench: the target's calls of 1 and {} tokens, per operation\n", scale_tokens);
  const op_split split = measure_op_split(target, stream, context, scale_tokens, c.cost_samples);
  // The loop's own cost per round at the bundled vocabulary and at GPT-2's, generations as long as
  // the sweep's (-n).
  fmt::print(stderr, "specsample-bench: loop cost per round (synthetic models, V = 4096 and 50257)\n");
  std::vector<overhead_result> loop_costs;
  const std::size_t loop_generations = c.quick ? 2 : 10;
  for (const std::size_t V : {std::size_t{4096}, std::size_t{50257}}) {
    auto synthetic_target = synthetic_model(V, 0.0f, c.seed);
    auto synthetic_draft = synthetic_model(V, 0.7f, c.seed + 1);
    for (const double temp : {0.0, 1.0}) {
      loop_costs.push_back(measure_loop_overhead(synthetic_draft, synthetic_target, 4, temp, c.n, loop_generations,
                                                 c.seed, c.verify));
    }
  }

  // Summaries per temperature.
  struct best {
    double temperature;
    const cell* measured;   // the sweep's cell of the highest pooled speedup
    const cell* predicted;  // the sweep's cell of the highest prediction
    const cell* confirmed;  // the measured cell's K run again on fresh seeds
  };
  std::vector<best> bests;
  for (std::size_t ti = 0; ti < c.temperatures.size(); ++ti) {
    const double temp = c.temperatures[ti];
    best b{temp, &cells[best_cell[ti]], nullptr, &confirmations[ti]};
    for (const auto& cl : cells) {
      if (cl.temperature == temp && (!b.predicted || cl.predicted > b.predicted->predicted)) b.predicted = &cl;
    }
    bests.push_back(b);
  }
  std::size_t greedy_runs = 0, greedy_identical = 0;
  for (const auto* group : {&cells, &confirmations}) {
    for (const auto& cl : *group) {
      if (cl.temperature != 0.0) continue;
      greedy_runs += cl.runs.size();
      greedy_identical += cl.identical;
    }
  }
  const bool guard_ok = greedy_runs == greedy_identical;
  double prefill_ar = 0.0, prefill_spec = 0.0, decode_ar = 0.0;
  {
    std::vector<double> pa, ps, da;
    for (const auto& cl : cells) {
      for (const auto& p : cl.runs) {
        pa.push_back(p.ar.prefill_seconds);
        ps.push_back(p.spec.prefill_seconds);
        da.push_back(p.ar.decode_seconds());
      }
    }
    prefill_ar = summarize(pa).median;
    prefill_spec = summarize(ps).median;
    decode_ar = summarize(da).median;
  }
  const double total_seconds = seconds_since(t_start);
  const std::string load_end = load_average();

  // ---- markdown report --------------------------------------------------------------------------
  std::string md;
  auto out = [&md]<class... A>(fmt::format_string<A...> f, A&&... args) {
    md += fmt::format(f, std::forward<A>(args)...);
  };
  out("### Sweep: {} drafting for {}\n\n", draft_dir.filename().string(), target_dir.filename().string());
  out("`{}` — {} prompts × {} reps × {} tokens, K = 1..{}, T ∈ {{{}}}, {} kernel thread(s) shared by the models, {}{}; {}; "
      "{} cores; {}; {}; source {}; {}; load average {} at start, {} at end; run time {}.\n\n",
      command, prompts.size(), c.reps, c.n, c.k_max, fmt::join(c.temperatures, ", "), threads,
      kernels_note(target, draft), setup_note(c), cpu_model(),
      std::thread::hardware_concurrency(), "g++ " __VERSION__, compile_flags(), revision(), date, load_start,
      load_end, fmt_duration(total_seconds));
  out("Correctness guard (T = 0): speculative == autoregressive tokens in {}/{} runs: **{}**\n\n", greedy_identical,
      greedy_runs, greedy_runs == 0 ? "not run (no T = 0)" : guard_ok ? "PASS" : "FAIL");
  out("Tokens/s and speedups time the decode phase: each generation call minus both models' prompt prefill "
      "(the performance model covers decoding only); the median prefill is {:.1f} ms for the target alone and "
      "{:.1f} ms for both models, against {:.0f} ms of autoregressive decoding. *incl. prefill* times the whole "
      "call.\n\n", prefill_ar * 1e3, prefill_spec * 1e3, decode_ar * 1e3);
  out("| T | K | AR tok/s med (min–max) | spec tok/s med (min–max) | speedup med (min–max) | pooled | incl. prefill "
      "| accept | α | tok/call | c | c stats | verify | predicted | meas/pred | pred. w/ verify | overhead |\n");
  out("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto& cl : cells) {
    out("| {} | {} | {} | {} | {} | {:.2f} | {:.2f} | {:.3f} | {:.3f} | {:.2f} | {:.3f} | {:.3f} | {:.2f} | {:.2f} | "
        "{:.3f} | {:.2f} | {:.1f}% |\n",
        fmt_t(cl.temperature), cl.k, fmt_range(cl.ar_tps), fmt_range(cl.spec_tps), fmt_range(cl.speedup, 2),
        cl.speedup_pooled, cl.speedup_with_prefill.median,
        cl.acceptance, cl.alpha, cl.tokens_per_call, costs.c(), cl.c_stats, cl.verify_ratio_stats, cl.predicted,
        cl.speedup_pooled / cl.predicted, cl.predicted_verify, 100.0 * cl.overhead_spec);
  }
  out("\n#### Per temperature\n\n");
  out("| T | best K (measured, pooled) | speedup there, pooled (median) | predicted there | best K (predicted) | "
      "predicted max | overhead, spec at best K | overhead, AR |\n|---|---|---|---|---|---|---|---|\n");
  for (const auto& b : bests) {
    out("| {} | {} | {:.2f}x ({:.2f}x) | {:.2f}x | {} | {:.2f}x | {:.1f}% | {:.1f}% |\n", fmt_t(b.temperature),
        b.measured->k, b.measured->speedup_pooled, b.measured->speedup.median, b.measured->predicted, b.predicted->k,
        b.predicted->predicted,
        100.0 * b.measured->overhead_spec, 100.0 * b.measured->overhead_ar);
  }
  out("\n#### The best K confirmed on fresh runs\n\nThe best of {} noisy cells reads high by its selection: at "
      "each temperature the sweep's best K ran once more, {} rep{} of every prompt on seeds the sweep did not use "
      "(its autoregressive side too), right after that temperature's cells. The Targets below take the best K's "
      "speedup, α, c and verification cost from these runs.{}\n\n"
      "| T | K | the sweep's cell, pooled (median) | confirmed, pooled (median) | α | tok/call | c stats | verify "
      "| predicted | meas/pred | pred. w/ verify | overhead |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      c.k_max, c.reps, c.reps == 1 ? "" : "s",
      std::ranges::any_of(bests, [](const best& b) { return b.temperature == 0.0; })
          ? " At T = 0 the seeds change nothing (greedy): those runs repeat the cell's generations, so their α and "
            "tokens per call are the cell's, and only the times are measured afresh."
          : "");
  for (const auto& b : bests) {
    const cell& f = *b.confirmed;
    out("| {} | {} | {:.2f}x ({:.2f}x) | {:.2f}x ({:.2f}x) | {:.3f} | {:.2f} | {:.3f} | {:.2f} | {:.2f} | {:.3f} | "
        "{:.2f} | {:.1f}% |\n", fmt_t(b.temperature), f.k, b.measured->speedup_pooled, b.measured->speedup.median,
        f.speedup_pooled, f.speedup.median, f.alpha, f.tokens_per_call, f.c_stats, f.verify_ratio_stats, f.predicted,
        f.speedup_pooled / f.predicted, f.predicted_verify, 100.0 * f.overhead_spec);
  }
  out("\n#### Acceptance by draft position: P(draft i accepted | drafts 1..i−1 accepted)\n\n| T | K |");
  for (std::size_t i = 1; i <= c.k_max; ++i) out(" {} |", i);
  out("\n|---|---|");
  for (std::size_t i = 1; i <= c.k_max; ++i) out("---|");
  out("\n");
  for (const auto& cl : cells) {
    out("| {} | {} |", fmt_t(cl.temperature), cl.k);
    for (std::size_t i = 0; i < c.k_max; ++i) {
      if (i < cl.position_acceptance.size() && !std::isnan(cl.position_acceptance[i])) {
        out(" {:.3f} |", cl.position_acceptance[i]);
      } else {
        out("  |");
      }
    }
    out("\n");
  }
  out("\n#### Cost of one forward call (context {} tokens, median of {} interleaved samples)\n\n", context,
      c.cost_samples);
  out("Ratios are medians of per-sample ratios (a sample's calls run back to back); *after* repeats the "
      "measurement after the sweep, as a drift check. The machine floors, the c column of "
      "the sweep table and the targets use the quieter of the two (the lower single-token median): **{}**.\n\n",
      costs_name);
  out("| call | before sweep, ms (min–max) | after sweep, ms | ratio to target 1-token (after) |\n|---|---|---|---|\n");
  out("| draft, 1 token | {} | {:.3f} | c = {:.3f} (after: {:.3f}) |\n", fmt_range({costs_before.draft_1.median * 1e3,
      costs_before.draft_1.min * 1e3, costs_before.draft_1.max * 1e3}, 3), costs_after.draft_1.median * 1e3,
      costs_before.c(), costs_after.c());
  for (std::size_t j = 1; j <= c.k_max + 1; ++j) {
    const auto& s = costs_before.target_j[j - 1];
    out("| target, {} token{} | {} | {:.3f} | {:.2f} ({:.2f}) |\n", j, j == 1 ? "" : "s",
        fmt_range({s.median * 1e3, s.min * 1e3, s.max * 1e3}, 3), costs_after.target_j[j - 1].median * 1e3,
        costs_before.verify_ratio(j), costs_after.verify_ratio(j));
  }
  out("\n#### Memory bandwidth (streaming float sums, median of {} reps)\n\n", c.probe_reps);
  out("| working set | bytes | threads | GB/s med (min–max) |\n|---|---|---|---|\n");
  for (const auto& p : probes) out("| {} | {} | {} | {} |\n", p.label, p.bytes, p.threads, fmt_range(p.gbs, 1));
  out("\nDecode beside the probe: {} alternating blocks of {} timed single-token appends (context {}), {} timed "
      "probe passes over a buffer of the bytes a single-token pass reads of the model's weights and as many over one "
      "of its working set (those bytes plus the KV cache the append reads), each block after as many untimed ones (the steady state of repeated "
      "calls); fraction = median over block pairs of decode GB/s / probe GB/s; working-set fraction = the same "
      "with the KV bytes counted in the decode's GB/s and the working-set probe's GB/s (GB/s: medians over "
      "blocks).\n\n"
      "| model | weight bytes ({}) | 1-token append, ms med (min–max) | effective GB/s | probe GB/s beside it | "
      "fraction | KV bytes read | working-set probe GB/s | working-set fraction |\n|---|---|---|---|---|---|---|---|---|\n",
      target_bw.blocks, target_bw.block, context, target_bw.block,
      fmt::format("read per token; target: {}; draft: {}", weights_basis(c.model), draft_weights_basis(c)));
  for (const auto& [name, bw] : {std::pair{"target", &target_bw}, std::pair{"draft", &draft_bw}}) {
    out("| {} | {} | {} | {:.2f} | {:.1f} | {:.1f}% | {} | {:.1f} | {:.1f}% |\n", name, bw->bytes,
        fmt_range({bw->seconds_per_token.median * 1e3, bw->seconds_per_token.min * 1e3, bw->seconds_per_token.max * 1e3}, 3),
        bw->decode_gbs.median, bw->probe_gbs.median, 100.0 * bw->fraction, bw->kv_bytes,
        bw->working_set_gbs.median, 100.0 * bw->working_set_fraction);
  }
  const std::string tile_peak =
      fma.tiles ? fmt::format("; on AMX tiles ({}, tiles of one row, each instruction counted as {} rows' multiply-adds: "
                              "it takes up to {} at about the same time), {} GMAC/s",
                              fma.tiles->instruction, fma.tiles->rows, fma.tiles->rows, fmt_range(fma.tiles->gmacs, 1))
                : std::string();
  const std::string fma_calls =
      fma.tiles ? fmt::format("the fewer seconds of j × {0:.2f} M multiply-adds at the vector peak and ceil(j / {1}) × {1} × "
                              "{0:.2f} M at the tiles'", macs_token * 1e-6, fma.tiles->rows)
                : fmt::format("j × {:.2f} M multiply-adds at the FMA peak", macs_token * 1e-6);
  out("\n#### Machine floors\n\nFMA peak (register-only multiply-adds: {}, {} vectors, on {} thread(s) at once, "
      "median (min–max) of {} reps): {} GMAC/s{}. One token of the target is {:.2f} M multiply-adds in its matmuls. A j-token call takes at "
      "least the longer of streaming the {:.1f} MB of matmul weights at the probe's {:.1f} GB/s ({:.3f} ms) and "
      "{}; attention, norms and the rest count as free.\n\n",
      fma.vectors.instruction, specsample::isa_name(fma.level), threads, c.probe_reps, fmt_range(fma.vectors.gmacs, 1),
      tile_peak, macs_token * 1e-6, static_cast<double>(target.weights().matmul_bytes()) * 1e-6, probe_at(target_bytes),
      stream_floor * 1e3, fma_calls);
  out("| target call | floor, ms (bound) | measured, ms | measured / floor | ratio to 1 token: floor | measured |\n"
      "|---|---|---|---|---|---|\n");
  for (std::size_t j = 1; j <= c.k_max + 1; ++j) {
    const double f = floor_seconds(j), m = costs.target_j[j - 1].median;
    out("| {} token{} | {:.3f} ({}) | {:.3f} | {:.2f} | {:.2f} | {:.2f} |\n", j, j == 1 ? "" : "s", f * 1e3,
        f > stream_floor ? "FMA" : "bandwidth", m * 1e3, m / f, v_floor(j), costs.verify_ratio(j));
  }
  out("\nThe draft's single-token call: at least the longer of streaming its {:.2f} MB of matmul weights at the "
      "probe's {:.1f} GB/s at its size and {:.2f} M multiply-adds at the peak of its {} ({:.1f} GMAC/s{}): {:.1f} µs, "
      "c_floor = {:.3f} of "
      "the target's floor.\n\nSpeedup with the calls at the machine floors — each cell's measured tokens per call, "
      "the single-token and the (K + 1)-token target calls at their floors: tokens per call / (c·K + "
      "v_floor(K + 1)), with c the draft's measured time per call in the loop over the target's single-token floor, "
      "or with c_floor as well: what-ifs, not bounds on the measured speedup (a ratio, whose two terms the floors "
      "both move: docs/benchmarks.md, Targets); the best K per temperature:\n\n"
      "| T | measured best | target calls at their floors | draft's calls too |\n|---|---|---|---|\n",
      static_cast<double>(draft.weights().matmul_bytes()) * 1e-6, probe_at(draft_bytes), macs_draft * 1e-6,
      draft_fma.vectors.instruction, draft_fma.vectors.gmacs.median,
      draft_fma.tiles ? fmt::format("; on tiles, {}: {:.1f}", draft_fma.tiles->instruction, draft_fma.tiles->gmacs.median)
                      : std::string(),
      draft_floor * 1e6, c_floor);
  for (const auto& b : bests) {
    const auto [at_floors, k_floors] = best_of(b.temperature, ceiling);
    const auto [at_all, k_all] = best_of(b.temperature, ceiling_all);
    out("| {} | {:.2f}x (K = {}) | {:.2f}x (K = {}) | {:.2f}x (K = {}) |\n", fmt_t(b.temperature),
        b.measured->speedup_pooled, b.measured->k, at_floors, k_floors, at_all, k_all);
  }
  {
    using specsample::gpt2::op_times;
    out("\n#### Where the target's call goes: {} tokens against 1 (context {}, medians of {} interleaved samples)\n\n"
        "Each operation of the forward pass timed on its own (`gpt2::model::time_ops`), in a single-token call and "
        "in a {}-token one, the {}-token call right after the single-token one; the last column is each operation's "
        "share of what the {} tokens cost more. Rows are medians over the samples, so they need not add up to the "
        "sums below them; the whole call also holds what lies between the operations (argument checks, the clock "
        "reads).\n\n"
        "| operation | 1 token, µs | {} tokens, µs | difference, µs | share of the difference |\n|---|---|---|---|---|\n",
        split.tokens, context, split.samples, split.tokens, split.tokens, split.tokens, split.tokens);
    double sum1 = 0.0, sumn = 0.0;
    for (std::size_t i = 0; i < op_times::count; ++i) {
      sum1 += split.one[i].median;
      sumn += split.many[i].median;
    }
    for (std::size_t i = 0; i < op_times::count; ++i) {
      const double a = split.one[i].median, b = split.many[i].median;
      out("| {} | {:.1f} | {:.1f} | {:+.1f} | {:.0f}% |\n", op_times::names[i], a * 1e6, b * 1e6, (b - a) * 1e6,
          100.0 * (b - a) / (sumn - sum1));
    }
    out("| the operations (sum of the rows) | {:.1f} | {:.1f} | {:+.1f} | 100% |\n", sum1 * 1e6, sumn * 1e6,
        (sumn - sum1) * 1e6);
    out("| the whole call | {:.1f} | {:.1f} | {:+.1f} | ratio {:.2f} |\n", split.whole_1.median * 1e6,
        split.whole_n.median * 1e6, (split.whole_n.median - split.whole_1.median) * 1e6,
        split.whole_n.median / split.whole_1.median);
  }
  if (scaling5) {
    out("\n#### Threads: the target with 1 and with {} kernel threads (context {}, median of {} interleaved "
        "samples)\n\nMeanwhile: steal, the share of each virtual CPU's time that the hypervisor gave to something "
        "else, and the share of all CPUs' time that other processes of this machine used (/proc/stat, /proc/self/stat), "
        "counted in clock ticks over all CPUs (shown): the fewer, the coarser. A neighbour on the other hyperthread "
        "of the same physical core slows a thread without showing in either; the pool sees it: *worker speeds* "
        "is its estimate of each worker's speed relative to the calling thread (`thread_pool::speed`, by which it "
        "sizes their chunks; 1: as fast), the median of its values after each block. However a call is split, the threads "
        "together gain at most 1 + the sum of the workers' speeds over the calling thread running as fast as "
        "it did beside them. *Beside busy neighbours* times the one-thread call while a thread per worker appends "
        "the same tokens over and over to a one-thread model on the same weights (interleaved with the other two "
        "blocks): the calling thread's speed there, relative to alone, times 1 + the workers' speeds is what a perfect "
        "split would gain over one thread alone with the threads at those speeds (*perfect split*): an estimate, "
        "not a bound, from blocks measured apart, which a phase of the machine changing between them moves either "
        "way (and the neighbours never rest, where a worker waits at the end of each loop).\n\n"
        "| call | 1 thread, ms | {} threads, ms | speedup | meanwhile | worker speeds | 1 thread beside busy "
        "neighbours, ms | caller's speed there | perfect split |\n|---|---|---|---|---|---|---|---|---|\n",
        scaling5->threads, context, scaling5->samples, scaling5->threads);
    for (const auto* sc : {&*scaling1, &*scaling5}) {
      out("| append {} token{} | {} | {} | {:.2f}x | {} | {:.2f} | {} | {:.2f} | {:.2f}x |\n", sc->tokens,
          sc->tokens == 1 ? "" : "s", fmt_range({sc->one.median * 1e3, sc->one.min * 1e3, sc->one.max * 1e3}, 3),
          fmt_range({sc->many.median * 1e3, sc->many.min * 1e3, sc->many.max * 1e3}, 3), sc->ratio(),
          fmt_contention(sc->meanwhile), fmt::join(sc->speeds, ", "),
          fmt_range({sc->beside.median * 1e3, sc->beside.min * 1e3, sc->beside.max * 1e3}, 3), sc->caller_beside(),
          sc->perfect_split());
    }
  }
  const std::size_t verify_tokens = std::min<std::size_t>(5, c.k_max + 1);  // K + 1 = 5, or the most the cost table has
  out("\n#### The loop's own cost per round (synthetic models, K = 4{}, {} tokens, median (min–max) over {} "
      "generations)\n\n| vocabulary | T | µs per round outside the models | share of this target's "
      "verification call of {} tokens |\n|---|---|---|---|\n",
      c.verify == specsample::verification::block ? ", block verification" : "", c.n, loop_generations, verify_tokens);
  const double verify5 = costs.target_j[verify_tokens - 1].median;
  for (const auto& lc : loop_costs) {
    out("| {} | {} | {} | {:.1f}% |\n", lc.vocab, fmt_t(lc.temperature),
        fmt_range({lc.seconds_per_round.median * 1e6, lc.seconds_per_round.min * 1e6, lc.seconds_per_round.max * 1e6}, 1),
        100.0 * lc.seconds_per_round.median / verify5);
  }

  // Targets of the speed work (docs/benchmarks.md, "Targets"), each from this run.
  double max_overhead = 0.0;
  for (const auto& cl : cells) max_overhead = std::max(max_overhead, cl.overhead_spec);
  const auto best_at = [&](double temp) -> const best* {
    for (const auto& b : bests) {
      if (b.temperature == temp) return &b;
    }
    return nullptr;
  };
  const auto verdict = [](bool ok) { return ok ? "**met**" : "**not met**"; };
  // A goal this machine's floors put out of reach (`within_limits` false; "Machine floors" above),
  // while no measured call beat its floor (`floors_hold`): for the speedups, missed even with every
  // call of both models at its floor, the autoregressive baseline's single-token call included; for
  // the append ratio, 5 tokens at their floor against the measured single token, and for c, the
  // draft's call at its floor against the target's as measured (a faster target call only raises
  // either ratio).
  const auto verdict_or_limit = [&](bool ok, bool within_limits) {
    return ok ? verdict(true) : within_limits || !floors_hold ? verdict(false) : "**beyond this machine's limits**";
  };
  out("\n#### Targets\n\n");
  if (!floors_hold) {
    out("A call in the cost table ran faster than its machine floor in this run (the probes read low): no goal is "
        "called beyond this machine's limits.\n\n");
  }
  out("| target | measured in this run | verdict |\n|---|---|---|\n");
  // The same figures and verdicts for sweep.json (the verdict without its markdown).
  json targets_json = {{"floors_hold", floors_hold}};
  const auto plain = [](std::string_view v) {
    std::string r(v);
    std::erase(r, '*');
    return r;
  };
  const double fraction = target_bw.fraction;
  const char* const decode_verdict = verdict(fraction >= 0.7);
  out("| single-token decode reads the target's weights at ≥ 70% of the probe's bandwidth at that size | {}% "
      "({:.1f} of {:.1f} GB/s, side by side; {:.1f}% of a probe over its working set, the KV cache's bytes "
      "counted) | {} |\n",
      fmt_beside_goal(100.0 * fraction, 100.0 * 0.7, 1), target_bw.decode_gbs.median, target_bw.probe_gbs.median,
      100.0 * target_bw.working_set_fraction, decode_verdict);
  targets_json["decode_fraction"] = {{"fraction", fraction}, {"working_set_fraction", target_bw.working_set_fraction},
                                     {"goal", 0.7}, {"verdict", plain(decode_verdict)}};
  if (c.k_max >= 4) {
    const double r5 = costs.verify_ratio(5);
    // Impossible only if 5 tokens at their floor (the longer of the weight stream and the FMA peak)
    // already cost more than 1.3 × the measured single token; the ratio of the two floors says what
    // a kernel at both limits would show.
    const double bound = floor_seconds(5) / costs.target_j.front().median;
    const char* const append_verdict = verdict_or_limit(r5 <= 1.3, bound <= 1.3);
    out("| target append of 5 tokens ≤ 1.3 × append of 1 | {}× (with both calls at the machine floors: {:.2f}×; "
        "5 tokens at their floor against the measured single token: {}×) | {} |\n", fmt_beside_goal(r5, 1.3, 2),
        v_floor(5), fmt_beside_goal(bound, 1.3, 2),
        append_verdict);
    targets_json["append_5_over_1"] = {{"ratio", r5}, {"at_floors", v_floor(5)}, {"floor_5_over_measured_1", bound},
                                       {"goal", 1.3}, {"verdict", plain(append_verdict)}};
  }
  {
    // c as the loop pays it: draft seconds per draft call over target seconds per autoregressive
    // call, in the confirmation runs of the best K at T = 0 (or the first temperature).
    const best* b = best_at(0.0) != nullptr ? best_at(0.0) : &bests.front();
    const cell& f = *b->confirmed;
    const double c_loop = f.c_stats;
    const double c_reach = draft_floor / f.ar_call_seconds;  // the draft alone at its floor
    const char* const c_verdict = verdict_or_limit(c_loop <= 0.08, c_reach <= 0.08);
    out("| draft / target cost ratio c ≤ 0.08 | {} in the generation loop (T = {}, K = {}); {:.3f} when every "
        "draft call follows a target call (the cold-cache cost table above); {:.3f} with both calls at their floors, "
        "{} with the draft's at its floor beside the target's as measured in the loop | {} |\n",
        fmt_beside_goal(c_loop, 0.08, 3), fmt_t(b->temperature), f.k, costs.c(), c_floor,
        fmt_beside_goal(c_reach, 0.08, 3), c_verdict);
    targets_json["cost_ratio"] = {{"c_loop", c_loop}, {"temperature", b->temperature}, {"k", f.k},
                                  {"c_cold", costs.c()}, {"c_floor", c_floor}, {"c_draft_at_floor", c_reach},
                                  {"goal", 0.08}, {"verdict", plain(c_verdict)}};
  }
  constexpr double formula_share = 0.9;  // of the classic formula's prediction, the loop's goal
  for (const auto& [temp, goal] : {std::pair{0.0, 1.8}, std::pair{1.0, 1.9}}) {
    if (const best* b = best_at(temp)) {
      const cell& f = *b->confirmed;  // (the sweep's best K, on fresh runs)
      const double ratio = f.speedup_pooled / f.predicted;
      const double top = best_of(temp, ceiling).first, top_all = best_of(temp, ceiling_all).first;
      const double measured = f.speedup_pooled;
      // At T = 0 the two rules decide alike; under block verification α is the rounds' accepted /
      // (accepted + corrections), the constant-α model's reading of the block's counts.
      const bool block = temp > 0.0 && c.verify == specsample::verification::block;
      // No "beyond this machine's limits" here: the speedup is a ratio, and the figures at the floors
      // move both its terms (the baseline's single token to its bandwidth floor, the (K + 1)-token
      // call to its FMA floor), so they bound nothing (published cells measured above them).
      const char* const speedup_verdict = verdict(measured >= goal);
      out("| best-K speedup at T = {} ≥ {:.1f}x{} | {}x pooled (K = {}, the sweep's best at {:.2f}x, confirmed on "
          "fresh runs; the median of their pairs {:.2f}x; {:.2f}x with every target call at its machine floor, {:.2f}x "
          "with the draft's too) | {} |\n", fmt_t(temp), goal, block ? ", block verification" : "",
          fmt_beside_goal(measured, goal, 2), f.k,
          b->measured->speedup_pooled, f.speedup.median, top, top_all, speedup_verdict);
      // The formula takes the (K + 1)-token verification call to cost one single token. A loop that
      // wastes nothing measures the same tokens per round over cK + v instead, so 90% of the
      // formula needs (cK + 1) / (cK + v) ≥ formula_share: v ≤ (cK + 1) / formula_share − cK (less
      // the time outside the models, which the loop spends besides).
      const double ck = f.c_stats * static_cast<double>(f.k);
      const double verify_needed = (ck + 1.0) / formula_share - ck;
      const double goal_pct = 100.0 * formula_share;
      const char* const share_verdict = verdict(ratio >= formula_share);
      out("| … and ≥ {:.0f}% of the formula's prediction from the measured α{} and c | {}% of {:.2f}x (with the "
          "measured verification cost: {:.1f}% of {:.2f}x; {:.0f}% needs the {}-token verification call at ≤ {:.2f} "
          "single tokens: {:.2f} in the loop, {:.2f} at the machine floors) | {} |\n",
          goal_pct, block ? " (accepted / (accepted + corrections) of the block rounds)" : "",
          fmt_beside_goal(100.0 * ratio, goal_pct, 1), f.predicted,
          100.0 * f.speedup_pooled / f.predicted_verify, f.predicted_verify, goal_pct, f.k + 1, verify_needed,
          f.verify_ratio_stats, v_floor(f.k + 1), share_verdict);
      targets_json["speedup"].push_back(
          {{"temperature", temp}, {"k", f.k}, {"block", block}, {"pooled", measured},
           {"sweep_pooled", b->measured->speedup_pooled},
           {"paired_median", f.speedup.median}, {"target_calls_at_floors", top}, {"all_calls_at_floors", top_all},
           {"goal", goal}, {"verdict", plain(speedup_verdict)},
           {"predicted", f.predicted}, {"share_of_predicted", ratio},
           {"predicted_with_verify_cost", f.predicted_verify},
           {"share_of_predicted_with_verify_cost", measured / f.predicted_verify},
           {"verify_needed", verify_needed}, {"verify_in_loop", f.verify_ratio_stats},
           {"verify_at_floors", v_floor(f.k + 1)}, {"share_goal", formula_share},
           {"share_verdict", plain(share_verdict)}});
    }
  }
  {
    double at_best = 0.0;
    for (const auto& b : bests) at_best = std::max(at_best, b.confirmed->overhead_spec);
    const char* const outside_verdict = verdict(std::max(at_best, max_overhead) <= 0.03);
    out("| time outside model forward passes ≤ 3% of decode time (V = {}) | {}% at worst over the best K's "
        "confirmation runs, {}% in the worst cell of the sweep | {} |\n", target.vocab_size(),
        fmt_beside_goal(100.0 * at_best, 100.0 * 0.03, 1), fmt_beside_goal(100.0 * max_overhead, 100.0 * 0.03, 1),
        outside_verdict);
    targets_json["outside_models"] = {{"at_best_k", at_best}, {"worst_cell", max_overhead}, {"goal", 0.03},
                                      {"verdict", plain(outside_verdict)}};
  }
  if (scaling5) {
    // The perfect split is a note, not a verdict: an estimate from blocks measured apart.
    // (With --threads N > 2 the row times N threads against one: the goal, for two, is not measured.)
    const bool two = scaling5->threads == 2;
    const std::string threads_verdict = two ? verdict(scaling5->ratio() >= 1.6) : "**not measured** (not two threads)";
    out("| two threads ≥ 1.6x on the target's append of {} tokens | {}x{} (meanwhile: {}; the worker{} at {:.2f} of the "
        "caller's speed, the caller beside busy neighbours at {:.2f} of its speed alone: a perfect split at those "
        "speeds ~{:.2f}x) | {} |\n",
        scaling5->tokens, fmt_beside_goal(scaling5->ratio(), 1.6, 2), two ? std::string() : fmt::format(" with {} threads", scaling5->threads),
        fmt_contention(scaling5->meanwhile), scaling5->speeds.size() == 1 ? "" : "s",
        fmt::join(scaling5->speeds, ", "), scaling5->caller_beside(), scaling5->perfect_split(), threads_verdict);
    targets_json["threads"] = {{"threads", scaling5->threads}, {"tokens", scaling5->tokens}, {"speedup", scaling5->ratio()},
                               {"perfect_split", scaling5->perfect_split()}, {"goal", 1.6},
                               {"verdict", plain(threads_verdict)}};
  } else {
    targets_json["threads"] = {{"tokens", scale_tokens}, {"usable_cpus", usable_cpus}, {"verdict", "not measured"}};
    out("| two threads ≥ 1.6x on the target's append of {} tokens | not measured: this process may run on {} CPU "
        "(its affinity) | **not measured** |\n", scale_tokens, usable_cpus);
  }
  fmt::print("{}", md);

  // ---- files ----------------------------------------------------------------------------------
  if (c.out) {
    specsample_bench::write_file(*c.out, "sweep.md", md);
    json j;
    j["command"] = command;
    j["machine"] = machine_json(date, load_start, load_end, total_seconds);
    j["targets"] = targets_json;
    j["config"] = {{"target", target_dir.string()},
                   {"draft", draft_dir.string()},
                   {"prompts_file", prompts_file.string()},
                   {"prompt_tokens", prompt_lengths},
                   {"n", c.n},
                   {"reps", c.reps},
                   {"k_max", c.k_max},
                   {"temperatures", c.temperatures},
                   {"threads", threads}, {"kernels", specsample::isa_name(target.kernels())},
                   {"seed", c.seed},
                   {"quick", c.quick}};
    j["config"].update(specsample::gpt2::precision_json(c.model));
    j["config"]["draft_matmul"] = specsample::gpt2::precision_name(draft_options(c).matmul_precision);
    j["config"]["draft_temperature_ratio"] = c.draft_temperature_ratio;
    j["config"]["verify"] = specsample::verification_name(c.verify);
    j["config"]["amx"] = {{"target", target.amx()}, {"draft", draft.amx()}};
    const auto cost_json = [](const cost_result& r) {
      json t = json::array();
      for (std::size_t jj = 0; jj < r.target_j.size(); ++jj) {
        t.push_back({{"tokens", jj + 1}, {"seconds", to_json(r.target_j[jj])}, {"ratio_to_1", r.verify_ratio(jj + 1)}});
      }
      return json{{"context", r.context},
                  {"samples", r.samples},
                  {"draft_1_seconds", to_json(r.draft_1)},
                  {"target_seconds", t},
                  {"c", r.c()}};
    };
    j["cost"] = {{"before_sweep", cost_json(costs_before)}, {"after_sweep", cost_json(costs_after)},
                 {"used_for_targets", costs_name}};
    {
      using specsample::gpt2::op_times;
      json ops = json::array();
      for (std::size_t i = 0; i < op_times::count; ++i) {
        ops.push_back({{"operation", op_times::names[i]}, {"one_token_seconds", to_json(split.one[i])},
                       {"n_tokens_seconds", to_json(split.many[i])}});
      }
      j["op_split"] = {{"tokens", split.tokens}, {"samples", split.samples}, {"context", context},
                       {"whole_one_token_seconds", to_json(split.whole_1)},
                       {"whole_n_tokens_seconds", to_json(split.whole_n)}, {"operations", ops}};
    }

    {
      json fj = json::array();
      for (std::size_t jj = 1; jj <= c.k_max + 1; ++jj) {
        fj.push_back({{"tokens", jj}, {"floor_seconds", floor_seconds(jj)}, {"v_floor", v_floor(jj)},
                      {"measured_seconds", costs.target_j[jj - 1].median}});
      }
      json cj = json::array();
      for (const auto& cl : cells) {
        cj.push_back({{"temperature", cl.temperature}, {"k", cl.k}, {"ceiling", ceiling(cl)},
                      {"ceiling_draft_at_floor", ceiling_all(cl)}});
      }
      j["machine_floors"] = {{"fma_isa", specsample::isa_name(fma.level)},
                             {"fma_instruction", fma.vectors.instruction},
                             {"fma_gmacs", to_json(fma.vectors.gmacs)}, {"fma_threads", threads},
                             {"tile_instruction", fma.tiles ? json(fma.tiles->instruction) : json()},
                             {"tile_gmacs_at_16_rows", fma.tiles ? to_json(fma.tiles->gmacs) : json()},
                             {"matmul_macs_per_token", macs_token},
                             {"matmul_weight_bytes", target.weights().matmul_bytes()},
                             {"stream_floor_seconds", stream_floor},
                             {"draft_floor_seconds", draft_floor},
                             {"c_floor", c_floor},
                             {"calls", fj},
                             {"speedup_ceiling", cj}};
    }
    json pj = json::array();
    for (const auto& p : probes) {
      pj.push_back({{"label", p.label}, {"bytes", p.bytes}, {"threads", p.threads}, {"gb_per_s", to_json(p.gbs)}});
    }
    j["bandwidth"] = {
        {"probe", pj},
        {"note", "weight bytes = the bytes a single-token pass reads of the model's weights as held (--weights, "
                 "--matmul, --draft-matmul): the matmul weights, the layer norms and biases, one row of wpe "
                 "(weights::decode_bytes)"},
        {"target", bandwidth_json(target_bw)},
        {"draft", bandwidth_json(draft_bw)}};
    if (scaling5) {
      json sj = json::array();
      for (const auto* sc : {&*scaling1, &*scaling5}) {
        sj.push_back({{"tokens", sc->tokens}, {"threads", sc->threads}, {"samples", sc->samples},
                      {"one_thread_seconds", to_json(sc->one)}, {"threads_seconds", to_json(sc->many)},
                      {"speedup", sc->ratio()}, {"worker_speeds", sc->speeds},
                      {"one_thread_beside_busy_neighbours_seconds", to_json(sc->beside)},
                      {"caller_speed_beside", sc->caller_beside()}, {"perfect_split_speedup", sc->perfect_split()},
                      {"meanwhile", sc->meanwhile.steal.empty()
                                           ? json(nullptr)
                                           : json{{"cpus", sc->meanwhile.cpus},
                                                  {"steal_fraction_per_cpu", sc->meanwhile.steal},
                                                  {"other_processes_fraction", sc->meanwhile.others},
                                                  {"ticks", sc->meanwhile.ticks}}}});
      }
      j["thread_scaling"] = sj;
    }
    json lj = json::array();
    for (const auto& lc : loop_costs) {
      lj.push_back({{"vocab", lc.vocab}, {"k", lc.k}, {"temperature", lc.temperature}, {"rounds", lc.rounds},
                    {"seconds_per_round", to_json(lc.seconds_per_round)}});
    }
    j["loop_cost_per_round"] = lj;
    j["guard"] = {{"greedy_runs", greedy_runs}, {"identical", greedy_identical}, {"pass", guard_ok}};
    const auto cell_json = [&](const cell& cl) {
      json runs = json::array();
      for (const auto& p : cl.runs) {
        runs.push_back({{"prompt", p.prompt}, {"rep", p.rep}, {"seed", p.seed}, {"ar_first", p.ar_first},
                        {"identical", p.identical}, {"speedup", p.speedup()},
                        {"speedup_with_prefill", p.speedup_with_prefill()},
                        {"autoregressive", stats_json(p.ar)}, {"speculative", stats_json(p.spec)}});
      }
      json pos = json::array();
      for (const double v : cl.position_acceptance) pos.push_back(std::isnan(v) ? json(nullptr) : json(v));
      return json{{"temperature", cl.temperature},
                  {"k", cl.k},
                  {"ar_tokens_per_second", to_json(cl.ar_tps)},
                  {"spec_tokens_per_second", to_json(cl.spec_tps)},
                  {"speedup_paired", to_json(cl.speedup)},
                  {"speedup_paired_with_prefill", to_json(cl.speedup_with_prefill)},
                  {"speedup_pooled", cl.speedup_pooled},
                  {"speedup_of_medians", cl.speedup_of_medians},
                  {"acceptance_rate", cl.acceptance},
                  {"alpha", cl.alpha},
                  {"tokens_per_target_call", cl.tokens_per_call},
                  {"accepted_histogram", cl.histogram},
                  {"position_tested", cl.pos_tested},
                  {"position_accepted", cl.pos_accepted},
                  {"position_acceptance", pos},
                  {"c_micro", costs.c()},
                  {"c_stats", cl.c_stats},
                  {"verify_ratio_micro", costs.verify_ratio(cl.k + 1)},
                  {"verify_ratio_stats", cl.verify_ratio_stats},
                  {"predicted_speedup", cl.predicted},
                  {"measured_over_predicted", cl.speedup_pooled / cl.predicted},
                  {"predicted_speedup_with_verify_cost", cl.predicted_verify},
                  {"overhead_fraction_speculative", cl.overhead_spec},
                  {"overhead_fraction_autoregressive", cl.overhead_ar},
                  {"identical_runs", cl.identical},
                  {"runs", runs}};
    };
    json cj = json::array(), confirmed_json = json::array();
    for (const auto& cl : cells) cj.push_back(cell_json(cl));
    for (const auto& cl : confirmations) confirmed_json.push_back(cell_json(cl));
    j["cells"] = cj;
    j["confirmations"] = confirmed_json;  // per temperature, the best K's runs on fresh seeds
    json bj = json::array();
    for (const auto& b : bests) {
      bj.push_back({{"temperature", b.temperature}, {"best_k_measured", b.measured->k},
                    {"speedup", b.measured->speedup.median}, {"speedup_pooled", b.measured->speedup_pooled},
                    {"predicted_there", b.measured->predicted}, {"confirmed_pooled", b.confirmed->speedup_pooled},
                    {"best_k_predicted", b.predicted->k},
                    {"predicted", b.predicted->predicted}, {"overhead_fraction_speculative", b.measured->overhead_spec},
                    {"overhead_fraction_autoregressive", b.measured->overhead_ar}});
    }
    j["per_temperature"] = bj;
    specsample_bench::write_file(*c.out, "sweep.json", dump_json(j, 1) + '\n');
    // gnuplot data: one index block per temperature, its first line a column header.
    std::string speedup = "# K measured_median measured_min measured_max predicted predicted_with_verify_cost\n";
    for (const double temp : c.temperatures) {
      const std::string t = fmt_t(temp);
      speedup += fmt::format("K \"T={0} measured\" min max \"T={0} predicted\" \"T={0} pred., verify cost\"\n", t);
      for (const auto& cl : cells) {
        if (cl.temperature != temp) continue;
        speedup += fmt::format("{} {:.4f} {:.4f} {:.4f} {:.4f} {:.4f}\n", cl.k, cl.speedup.median, cl.speedup.min,
                               cl.speedup.max, cl.predicted, cl.predicted_verify);
      }
      speedup += "\n\n";
    }
    specsample_bench::write_file(*c.out, "speedup.dat", speedup);
    std::string acceptance = fmt::format(
        "# draft position i (1-based), P(draft i accepted | drafts 1..i-1 accepted), at K = {}; "
        "last column: the cell's alpha\n", c.k_max);
    for (const double temp : c.temperatures) {
      acceptance += fmt::format("i \"T={0}\" \"T={0} α (pooled)\"\n", fmt_t(temp));
      for (const auto& cl : cells) {
        if (cl.temperature != temp || cl.k != c.k_max) continue;
        for (std::size_t i = 0; i < cl.position_acceptance.size(); ++i) {
          if (!std::isnan(cl.position_acceptance[i])) {
            acceptance += fmt::format("{} {:.4f} {:.4f}\n", i + 1, cl.position_acceptance[i], cl.alpha);
          }
        }
      }
      acceptance += "\n\n";
    }
    specsample_bench::write_file(*c.out, "acceptance.dat", acceptance);
    fmt::print(stderr, "specsample-bench: wrote {}/sweep.md, sweep.json, speedup.dat, acceptance.dat\n",
               c.out->string());
  }
  fmt::print(stderr, "specsample-bench: done in {}\n", fmt_duration(total_seconds));
  if (!guard_ok) {
    fmt::print(stderr, "specsample-bench: FAILED: at temperature 0, {} of {} speculative runs differ from "
                       "autoregressive decoding\n", greedy_runs - greedy_identical, greedy_runs);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return specsample_bench::guarded_main("specsample-bench", [&] { return run(argc, argv); });
}
