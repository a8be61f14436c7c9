// specsample-generate: speculative (or plain) generation with GPT-2 checkpoints.
//
//   specsample-generate [--target DIR] [--draft DIR] [--prompt TEXT | --prompt-file F]
//                       [-n N] [--eos ID|none] [-k K|auto] [--p-min P] [--adaptive] [--temperature T] [--top-k N] [--top-p P] [--min-p P]
//                       [--draft-temperature T|auto]
//                       [--seed S] [--threads N] [--kernels LEVEL] [--weights f32|f16|bf16] [--kv f32|f16] [--matmul f32|bf16|int8] [--amx on|off]
//                       [--draft-matmul f32|bf16|int8] [--prompt-lookup N] [--calibration-prompts F]
//                       [--mode speculative|autoregressive|compare]
//                       [--verify tokenwise|block] [--leniency B] [--repeat R] [--stream]
//                       [--verbose] [--json]
//
// Defaults: the bundled Tiny Shakespeare pair (models/shakespeare-target, -draft), compare mode,
// generation stopping after the target's eos_token_id (config.json) or -n tokens.
// --draft ngram drafts by prompt lookup (no draft model); --draft a,b,c measures each candidate on
// a warm-up and keeps the one with the best predicted speedup at the K given, or at its best K
// with -k auto (among those whose check pays: check_prediction times speculation at that K
// against autoregressive decoding, in order of prediction until one pays; none: the best
// predicted); -k auto picks K the
// same way (and, in speculative mode, decodes autoregressively when that K does not pay);
// --draft-temperature auto gives each candidate, before that, the temperature with the highest
// expected acceptance along the target's own text (scan_draft_temperature).
// Before generating it checks that the draft's and target's tokenizers are identical.

#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>
#include <specsample/io/argument.hpp>
#include <specsample/io/number.hpp>
#include <specsample/io/prompt_list.hpp>
#include <specsample/tokenizer.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using specsample::token;

namespace {

constexpr std::string_view default_prompt = "BAPTISTA:\nHow now, my friend! why dost thou look so pale?\n\nHORTENSIO:\n";

struct cli {
  std::optional<fs::path> target;
  std::optional<std::string> draft;  // a directory, "ngram", or a comma-separated list to choose from
  std::size_t prompt_lookup = 0;     // > 0: prompt lookup (suffix matches of this many tokens up) first
  bool auto_k = false;
  std::optional<fs::path> calibration_prompts;  // warm-up prompts for -k auto / a draft choice
  std::string prompt{default_prompt};
  std::optional<fs::path> prompt_file;  // --prompt-file: read into prompt once every flag is checked ("-": stdin)
  specsample::speculative_params params{};
  std::optional<float> draft_temperature;  // --draft-temperature: the draft's warping at its own temperature
  bool auto_draft_temperature = false;     // --draft-temperature auto: scan_draft_temperature picks it
  std::uint64_t seed = 42;
  // --eos: stop after this token; none: never; unset: the target's config.json eos_token_id.
  std::optional<token> eos;
  bool no_eos = false;
  std::size_t threads = 0;
  specsample::gpt2::options model;  // --kernels, --weights, --kv, --matmul, --amx (gpt2::set_option)
  std::optional<specsample::gpt2::matmul_precision> draft_matmul;  // --draft-matmul: the draft models' instead
  std::string mode = "compare";
  std::size_t repeat = 1;
  bool stream = false, verbose = false, json = false;
};

[[noreturn]] void usage_error(const std::string& message) {
  throw specsample::error(message + " (see specsample-generate --help)");
}

constexpr std::string_view help = R"(usage: specsample-generate [options]
  (an option's value follows it, or joins a long option after '=': -n 64, --temperature=0.7;
   a value that begins with -- must join it after '=')
  --target DIR          target checkpoint (config.json, model.safetensors or its shards,
                        vocab.json, merges.txt); default: the bundled models/shakespeare-target
                        ($SPECSAMPLE_MODELS, next to the binary, or the source tree)
  --draft DIR           draft checkpoint with the same tokenizer (default: the bundled
                        models/shakespeare-draft); "ngram" for prompt-lookup drafting
                        (no model); DIR1,DIR2,... to measure each and keep the best predicted
                        at -k (each at its best K with -k auto) among those whose timed check
                        pays, checked in order of prediction until one does (none: the best
                        predicted)
  --prompt-lookup N     each round, draft by prompt lookup first (a suffix of N to max(N, 4)
                        tokens that occurred before) and by the draft model only where none did
  -k auto               pick K from a warm-up (acceptance by position, cost ratio c), checked
                        by timing it against autoregressive decoding; with --mode speculative,
                        decode autoregressively if that K does not pay
  --calibration-prompts F   warm up -k auto, a draft choice and --draft-temperature auto on the
                        prompts of F (one per line, \n escapes, # comments; e.g.
                        benchmarks/prompts.txt) instead of the prompt
  --p-min P             stop drafting a round when the draft's top probability (at its own
                        temperature, --draft-temperature) is below P
  --adaptive            adapt K between rounds (+2 after a full acceptance, -1 after a rejection)
  --prompt TEXT         prompt text (default: a held-out Tiny Shakespeare line)
  --prompt-file F       read the prompt from a file ('-': standard input; ./- for a file of
                        that name)
  -n, --max-new-tokens  tokens to generate (default 128), fewer when EOS comes first
  --eos ID              stop right after token ID (default: the target's eos_token_id in
                        config.json, <|endoftext|> for GPT-2 and the bundled models); none:
                        always -n tokens
  -k, --draft-length    K, tokens drafted per round (default 4), or auto
  --temperature T       0 = greedy (default 0)
  --top-k N, --top-p P, --min-p P   filters (default off; refused at temperature 0 unless a
                        draft samples at --draft-temperature above 0, as is --seed)
  --draft-temperature T the draft models' temperature (default: --temperature): the draft samples
                        its proposals at T, with the same filters; exact whatever T, it moves only
                        the acceptance (a draft sharper than the target accepts more with T above
                        the target's; docs/algorithm.md); or auto: per draft, the ratio to
                        --temperature in 0.8..1.5 with the highest expected acceptance along the
                        target's own 64 tokens from each warm-up prompt (scan_draft_temperature)
  --seed S              random seed (default 42)
  --threads N           kernel threads, one pool shared by all models (default: one per CPU
                        it may run on)
  --kernels LEVEL       best (default), avx512, avx2 or generic (capped at what the CPU has
                        and the build compiled)
  --weights F           hold every model's matmul weights as f32, f16 or bf16 (default: as the
                        checkpoint stores them); f16 / bf16 halve an F32 checkpoint's bytes per
                        token, rounding each weight (a slightly different model; docs/gpt2.md)
  --kv F                hold every model's KV cache as f32 (default) or f16: half the cache's
                        memory and bytes per token, each key and value rounded once (docs/gpt2.md)
  --matmul P            every model's matmuls in f32 (default) or bf16: weights and activations
                        rounded to BF16, products summed in F32 (vdpbf16ps where the CPU has
                        AVX512_BF16: cheaper calls of several tokens; docs/gpt2.md); or int8:
                        weights per output and activations per row quantised to INT8, exact
                        integer sums (vpdpbusd where the CPU has AVX512_VNNI)
  --amx on|off          bf16 and int8 matmuls on AMX tiles where the CPU has them (default on):
                        a call of up to 16 tokens costs about what one does; int8 the same bits,
                        bf16 its own last bits (docs/gpt2.md)
  --draft-matmul P      the draft models' matmuls in P instead (f32, bf16 or int8): e.g. int8
                        drafts at half the bytes of BF16; a draft's precision costs acceptance,
                        never exactness
  --mode M              speculative | autoregressive | compare (default compare)
  --verify V            tokenwise | block (Sun et al. 2025; both exact; default tokenwise)
  --leniency B          LOSSY if < 1: token-wise acceptance uniform from U[0, B) (default 1, exact)
  --repeat R            compare: run both R times, report min and median (default 1)
  --stream              print text as it is generated, under its section header
                        (compare: the first run of each mode)
  --verbose             per-round trace on stderr: drafts with q and p, accepted or not, emitted
  --json                print all statistics as JSON on stdout: per mode the text (each byte
                        that is not valid UTF-8 there, e.g. of a character cut by -n, as U+FFFD)
                        and its token_ids
  -h, --help            this text
)";

cli parse(int argc, char** argv) {
  cli c;
  c.params.max_new_tokens = 128;
  c.params.sampling.temperature = 0.0f;
  std::vector<std::pair<std::string_view, std::string_view>> given;  // (long name, as typed) of each flag
  try {  // what the reader refuses, and a flag's value out of its domain: usage errors
    for (specsample::io::argument_reader args(argc, argv); args.next();) {
      const std::string_view a = args.flag();
      given.emplace_back(a == "-k" ? "--draft-length" : a == "-n" ? "--max-new-tokens" : a, a);
      if (a == "--help" || a == "-h") {
        args.refuse_value();
        std::fputs(help.data(), stdout);
        std::exit(specsample::io::written("specsample-generate", 0));
      } else if (a == "--target") c.target = args.path_value();
      else if (a == "--draft") c.draft = std::string(args.value());
      else if (a == "--prompt-lookup") {
        c.prompt_lookup = args.number<std::size_t>(1);
      }
      else if (a == "--prompt") c.prompt = specsample::io::check_prompt_argument(args.value(), a);
      else if (a == "--prompt-file") c.prompt_file = args.path_value();
      else if (a == "--calibration-prompts") c.calibration_prompts = args.path_value();
      else if (a == "-n" || a == "--max-new-tokens") c.params.max_new_tokens = args.number<std::size_t>(1);
      else if (a == "-k" || a == "--draft-length") {
        const std::string_view v = args.value();
        c.auto_k = v == "auto";
        if (!c.auto_k) c.params.draft_length = specsample::io::parse_number<std::size_t>(a, v, std::size_t{1});
      } else if (a == "--p-min") c.params.draft_min_probability = args.number<float>();
      else if (a == "--adaptive") c.params.adaptive_draft_length = true;
      else if (a == "--temperature") c.params.sampling.temperature = args.number<float>();
      else if (a == "--top-k") c.params.sampling.top_k = args.number<int>();
      else if (a == "--top-p") c.params.sampling.top_p = args.number<float>();
      else if (a == "--min-p") c.params.sampling.min_p = args.number<float>();
      else if (a == "--draft-temperature") {
        const std::string_view v = args.value();
        c.auto_draft_temperature = v == "auto";
        c.draft_temperature.reset();  // (the last one given counts)
        if (!c.auto_draft_temperature) c.draft_temperature = specsample::io::parse_number<float>(a, v);
      }
      else if (a == "--seed") c.seed = args.number<std::uint64_t>();
      else if (a == "--eos") {
        const std::string_view v = args.value();
        c.no_eos = v == "none";
        c.eos.reset();
        if (!c.no_eos) {
          token id = -1;
          const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), id);
          if (ec != std::errc{} || end != v.data() + v.size() || id < 0) {
            throw specsample::error(fmt::format("--eos expects a token id (0 to {}) or none, got '{}'",
                                                std::numeric_limits<token>::max(), v));
          }
          c.eos = id;
        }
      }
      else if (specsample::gpt2::is_option_flag(a)) {
        specsample::gpt2::set_option(c.model, a, args.value());
      }
      else if (a == "--draft-matmul") {
        c.draft_matmul = specsample::gpt2::precision_option(a, args.value());
      }
      else if (a == "--threads") c.threads = specsample::gpt2::threads_option(a, args.number<std::size_t>());
      else if (a == "--mode") {
        c.mode = args.value();
        if (c.mode != "speculative" && c.mode != "autoregressive" && c.mode != "compare") {
          throw specsample::error(
              fmt::format("--mode must be speculative, autoregressive or compare, got '{}'", c.mode));
        }
      } else if (a == "--verify") {
        c.params.verify = specsample::verification_option(a, args.value());
      } else if (a == "--leniency") c.params.leniency = args.number<double>();
      else if (a == "--repeat") {
        c.repeat = args.number<std::size_t>(1);
      } else if (a == "--stream") c.stream = true;
      else if (a == "--verbose") c.verbose = true;
      else if (a == "--json") c.json = true;
      else throw specsample::error(fmt::format("unknown argument '{}'{}", a, specsample::io::did_you_mean(a, help)));
    }
  } catch (const specsample::error& e) {
    usage_error(e.what());
  }
  try {
    specsample::gpt2::check_option_flags(c.model);
  } catch (const specsample::error& e) {
    usage_error(e.what());
  }
  // An option the run would not read is a mistake to report, not to ignore.
  const auto typed = [&](std::string_view flag) -> std::optional<std::string_view> {  // as typed, if given
    for (const auto& [name, as_typed] : given) {
      if (name == flag) return as_typed;
    }
    return std::nullopt;
  };
  const auto has = [&](std::string_view flag) { return typed(flag).has_value(); };
  if (has("--prompt") && has("--prompt-file")) usage_error("--prompt and --prompt-file both give the prompt: use one");
  if (c.stream && c.json) usage_error("--stream prints the text as it comes, --json one document at the end: use one");
  // Each value in its domain first: a NaN --p-min is refused as such, not for the greedy draft
  // it would meet below.
  try {
    if (c.draft_temperature) {
      c.params = c.params.with_draft_temperature(*c.draft_temperature);  // the target's filters
    }
    specsample::validate(c.params, std::numeric_limits<std::size_t>::max());
  } catch (const specsample::parameter_error& e) {
    // The library names its fields; the message names the option, as typed, that set the field.
    static constexpr std::pair<std::string_view, std::string_view> set_by[] = {
        {"speculative_params.draft_length", "--draft-length"},
        {"speculative_params.draft_min_probability", "--p-min"},
        {"speculative_params.leniency", "--leniency"},
        {"speculative_params.sampling.temperature", "--temperature"},
        {"speculative_params.sampling.top_k", "--top-k"},
        {"speculative_params.sampling.top_p", "--top-p"},
        {"speculative_params.sampling.min_p", "--min-p"},
        {"speculative_params.draft_sampling.temperature", "--draft-temperature"}};
    for (const auto& [field, flag] : set_by) {
      if (e.field() == field) usage_error(fmt::format("{}{}", typed(flag).value_or(flag), e.reason()));
    }
    throw;
  }
  if (has("--repeat") && c.mode != "compare") {
    usage_error(fmt::format("--repeat runs both modes R times: it needs --mode compare, not {}", c.mode));
  }
  // What each drafting option does, for the messages refusing it where nothing drafts.
  static constexpr std::pair<std::string_view, std::string_view> drafting[] = {
      {"--draft", "names the draft"},
      {"--draft-length", "sets K, the tokens drafted per round"},
      {"--prompt-lookup", "drafts by prompt lookup"},
      {"--p-min", "stops drafting on a draft model's top probability"},
      {"--adaptive", "adapts K between rounds"},
      {"--verify", "chooses how drafts are verified"},
      {"--leniency", "sets how drafts are accepted"},
      {"--draft-temperature", "warps a draft model's logits"},
      {"--draft-matmul", "sets a draft model's matmuls"},
      {"--calibration-prompts", "warms up the choice of K or of the draft"}};
  const auto what = [&](std::string_view flag) {
    return std::find_if(std::begin(drafting), std::end(drafting), [&](const auto& d) { return d.first == flag; })->second;
  };
  if (c.mode == "autoregressive") {
    for (const auto& [flag, does] : drafting) {
      if (const auto t = typed(flag)) usage_error(fmt::format("{} {}; --mode autoregressive drafts nothing", *t, does));
    }
  }
  if (c.draft == "ngram") {
    if (c.prompt_lookup > 0) {
      usage_error("--prompt-lookup falls back to a draft model; --draft ngram drafts by prompt lookup alone");
    }
    if (c.auto_k) usage_error("-k auto calibrates a draft model; --draft ngram has none: give K");
    for (const std::string_view flag : {"--draft-temperature", "--p-min", "--draft-matmul"}) {
      if (has(flag)) usage_error(fmt::format("{} {}; --draft ngram has none", flag, what(flag)));
    }
  }
  // Greedy decoding (--temperature 0, the default) reads no filter and draws no random number,
  // unless a draft model samples at a temperature of its own.
  if (c.params.sampling.temperature == 0.0f && !(c.draft_temperature && *c.draft_temperature > 0.0f)) {
    for (const std::string_view flag : {"--top-k", "--top-p", "--min-p", "--seed"}) {
      if (const auto t = typed(flag)) {
        usage_error(fmt::format("{} {} the sampling, but --temperature 0 (the default) decodes greedily: give a "
                                "temperature above 0",
                                *t, flag == "--seed" ? "seeds" : "filters"));
      }
    }
  }
  // A greedy target scores each draft 1 or 0: a leniency below 1 would change no decision.
  if (c.params.sampling.temperature == 0.0f) {
    if (const auto t = typed("--leniency")) {
      usage_error(fmt::format("{} relaxes the acceptance of sampled drafts, but --temperature 0 (the default) accepts "
                              "a draft only if it is the target's argmax: give a temperature above 0", *t));
    }
  }
  const bool draft_list = c.draft && c.draft->find(',') != std::string::npos;
  if (c.calibration_prompts && !c.auto_k && !draft_list) {
    if (!c.auto_draft_temperature) {
      usage_error("--calibration-prompts warms up -k auto, a --draft list or --draft-temperature auto: none is given");
    }
    if (c.params.sampling.temperature == 0.0f) {
      usage_error("--calibration-prompts warms up --draft-temperature auto, which has nothing to choose at --temperature 0 "
                  "(both models greedy; the default): give a temperature above 0, -k auto or a --draft list");
    }
  }
  // A one-hot draft distribution's top probability is always 1: --p-min would never stop a round.
  if (const auto t = typed("--p-min"); t && c.params.draft_warping().one_hot()) {
    usage_error(specsample::io::p_min_with_one_hot_draft_message(*t));
  }
  // The prompt's file last, once every flag is known good (standard input can wait for a terminal).
  if (c.prompt_file) {  // UTF-8 text only, its byte order mark dropped
    const bool in = c.prompt_file == "-";
    if (in && ::isatty(STDIN_FILENO) == 1) {
      std::fputs("specsample-generate: reading the prompt from standard input (end it with Ctrl-D)\n", stderr);
    }
    const std::string text = in ? specsample::io::read_standard_input() : specsample::io::read_file(*c.prompt_file);
    const std::string label = in ? "standard input" : c.prompt_file->string();
    c.prompt = specsample::io::check_prompt_text(text, label);
    if (c.prompt.empty()) usage_error(fmt::format("--prompt-file: {} holds no text: a prompt needs at least one character", label));
  }
  return c;
}

// The bundled models: $SPECSAMPLE_MODELS, next to an installed binary, or the source tree.
fs::path bundled_models(const char* argv0) {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("SPECSAMPLE_MODELS")) candidates.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::canonical("/proc/self/exe", ec);
  const fs::path dir = ec ? fs::path(argv0).parent_path() : exe.parent_path();
  candidates.push_back(dir / "../share/specsample/models");
  candidates.push_back(dir / "../../models");
#ifdef SPECSAMPLE_SOURCE_MODELS
  candidates.emplace_back(SPECSAMPLE_SOURCE_MODELS);
#endif
  for (const auto& c : candidates) {
    if (fs::exists(c / "shakespeare-target" / "config.json", ec)) return fs::weakly_canonical(c);
  }
  throw specsample::error("cannot find the bundled models (looked in $SPECSAMPLE_MODELS, ../share/specsample/models "
                          "next to the binary and the source tree); pass --target and --draft");
}

std::string printable(std::string_view s) {
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += ch;
  }
  return out;
}

struct run_record {
  specsample::generation_result result;
  double seconds = 0.0;  ///< the whole call (tokens/s and the speedup use the decode phase,
                         ///< result.stats.decode_seconds(); the prefill is printed apart)
};

// Prints generated text as it arrives (`stream`: the section header and the prompt first, so the
// text lands under its own header), the per-round trace (--verbose) and a progress line on stderr
// for runs slower than a second.
class reporter {
 public:
  reporter(const cli& c, const specsample::bpe_tokenizer& tok, std::string label, bool stream)
      : cli_(c), tok_(tok), decoder_(tok), label_(std::move(label)), stream_(stream),
        tty_(isatty(STDERR_FILENO) != 0), start_(std::chrono::steady_clock::now()), last_progress_(start_) {
    if (stream_) {
      fmt::print("--- {} ---\n{}", label_, cli_.prompt);
      std::fflush(stdout);
    }
  }

  void operator()(const specsample::round_event& e) {
    emitted_ += e.emitted.size();
    if (cli_.verbose) trace(e);
    if (stream_) {
      const std::string text = decoder_.feed(e.emitted);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
    progress();
  }

  void finish() {
    if (stream_) {
      const std::string rest = decoder_.flush();
      std::fwrite(rest.data(), 1, rest.size(), stdout);
      std::fputs("\n\n", stdout);  // as the non-streamed sections end
    }
    if (shown_progress_ && tty_) std::fputs("\r\033[K", stderr);
  }

 private:
  void trace(const specsample::round_event& e) {
    std::string line = fmt::format("[{} round {}]", label_, e.round);
    bool rejected = false;  // drafts after the first rejection are discarded untested
    for (const auto& d : e.drafts) {
      const std::string p = std::isnan(d.p) ? std::string() : fmt::format(" p={:.3f}", d.p);  // NaN: never scored
      line += fmt::format(" \"{}\" q={:.3f}{} {}", printable(tok_.decode(std::span<const token>(&d.id, 1))), d.q, p,
                          d.accepted ? "accepted" : rejected ? "discarded" : "REJECTED");
      rejected = rejected || !d.accepted;
    }
    const token last = e.emitted.back();
    const bool draft_last = !e.drafts.empty() && e.emitted.size() <= e.drafts.size() && e.drafts[e.emitted.size() - 1].accepted;
    line += fmt::format(" -> emit \"{}\" ({}){}", printable(tok_.decode(std::span<const token>(&last, 1))),
                        e.drafts.empty() ? "sampled" : draft_last ? "a draft" : e.bonus ? "bonus" : "correction",
                        e.eos ? " EOS" : "");
    fmt::print(stderr, "{}\n", line);
  }

  void progress() {
    using namespace std::chrono;
    const auto now = steady_clock::now();
    if (now - start_ < seconds(1) || now - last_progress_ < milliseconds(tty_ ? 200 : 1000)) return;
    last_progress_ = now;
    shown_progress_ = true;
    const double s = duration<double>(now - start_).count();
    fmt::print(stderr, "{}[{}] {}/{} tokens, {:.1f} tokens/s{}", tty_ ? "\r\033[K" : "", label_, emitted_,
               cli_.params.max_new_tokens, static_cast<double>(emitted_) / s, tty_ ? "" : "\n");
  }

  const cli& cli_;
  const specsample::bpe_tokenizer& tok_;
  specsample::stream_decoder decoder_;
  std::string label_;
  bool stream_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_progress_;
  std::size_t emitted_ = 0;
  bool shown_progress_ = false;
};

template <class Run>
run_record timed(const cli& c, const specsample::bpe_tokenizer& tok, const std::string& label, bool stream,
                 Run&& run) {
  reporter rep(c, tok, label, stream);
  const auto t0 = std::chrono::steady_clock::now();
  run_record r{run(rep), 0.0};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rep.finish();
  return r;
}

// The run ended on the EOS token (before -n tokens, or as the last of them).
bool stopped_at_eos(const run_record& r, const specsample::speculative_params& params) {
  return params.eos && !r.result.tokens.empty() && r.result.tokens.back() == *params.eos;
}

nlohmann::json stats_json(const run_record& r, const specsample::speculative_params& params) {
  const auto& s = r.result.stats;
  return {{"tokens", s.tokens},
          {"stopped_at_eos", stopped_at_eos(r, params)},
          {"seconds", r.seconds},
          {"decode_seconds", s.decode_seconds()},
          {"tokens_per_second", static_cast<double>(s.tokens) / s.decode_seconds()},
          {"rounds", s.rounds},
          {"target_calls", s.target_calls},
          {"draft_calls", s.draft_calls},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"corrections", s.corrections},
          {"bonus", s.bonus},
          {"acceptance_rate", s.acceptance_rate()},
          {"alpha", s.estimated_alpha()},
          {"tokens_per_target_call", s.tokens_per_target_call()},
          {"accepted_histogram", s.accepted_histogram},
          {"prefill_seconds", s.prefill_seconds},
          {"draft_seconds", s.draft_seconds},
          {"target_seconds", s.target_seconds},
          {"overhead_seconds", s.overhead_seconds()}};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run(int argc, char** argv) {
  cli c = parse(argc, argv);
  if (const std::string note = specsample::gpt2::oversubscription_note("--threads", c.threads); !note.empty()) {
    fmt::print(stderr, "specsample-generate: note: {}\n", note);
  }
  const bool need_draft = c.mode != "autoregressive";
  const bool ngram = c.draft && *c.draft == "ngram";
  const fs::path models = (c.target && (c.draft || !need_draft)) ? fs::path() : bundled_models(argv[0]);
  const fs::path target_dir = c.target.value_or(models / "shakespeare-target");
  // Every model's path before anything loads: a draft's mistyped path, or a file given for a
  // directory, is named as the model directory it should be (not after the target's load, nor as
  // the tokenizer directory the target's is read as first).
  specsample::gpt2::require_model_directory(target_dir);
  std::vector<fs::path> candidates;
  if (need_draft && !ngram) {
    std::string list = c.draft.value_or((models / "shakespeare-draft").string());
    for (std::size_t start = 0; start <= list.size();) {
      const std::size_t comma = std::min(list.find(',', start), list.size());
      if (comma == start && list.find(',') != std::string::npos) {  // (a list of one read as no list)
        usage_error(fmt::format("--draft {}: an empty item in the list (a stray comma?)", list));
      }
      if (comma > start) {
        const std::string item = list.substr(start, comma - start);
        if (item == "ngram") {
          usage_error(fmt::format("--draft {}: ngram drafts alone, not in a list of draft models (./ngram for a "
                                  "directory of that name)", list));
        }
        specsample::gpt2::require_model_directory(item);
        // The same model twice would be loaded, warmed up and reported twice: refused.
        for (const fs::path& other : candidates) {
          if (other == item) usage_error(fmt::format("--draft {}: {} is listed twice", list, item));
          std::error_code ec;  // (both exist: their device and inode are compared)
          if (fs::equivalent(other, item, ec)) {
            usage_error(fmt::format("--draft {}: {} and {} are the same directory", list, other.string(), item));
          }
        }
        candidates.emplace_back(item);
      }
      start = comma + 1;
    }
    if (candidates.empty()) usage_error("--draft needs a directory, a comma-separated list or ngram");
  }

  const auto tok = specsample::bpe_tokenizer::load(target_dir);
  if (c.eos && !specsample::in_vocabulary(*c.eos, tok.vocab_size())) {
    usage_error(fmt::format("--eos {} is not a token of the target's vocabulary of {}", *c.eos, tok.vocab_size()));
  }
  for (const auto& dir : candidates) {
    specsample::check_same_vocabulary(specsample::bpe_tokenizer::load(dir), tok, dir.string(), target_dir.string());
  }
  // Every check of the prompt, -n, --prompt-lookup and the warm-up prompts runs on the models'
  // config.json files and the tokenizer, before any weights load (a checkpoint of gigabytes takes
  // a while): a model's context is its config's n_positions (gpt2::model::max_size).
  const auto config_of = [](const fs::path& dir) { return specsample::gpt2::config::load(specsample::gpt2::config_file(dir)); };
  const specsample::gpt2::config target_config = config_of(target_dir);
  std::vector<std::size_t> draft_limits;
  for (const auto& dir : candidates) draft_limits.push_back(config_of(dir).n_positions);
  // The model whose context binds the prompt and -n, and the longest prompt it leaves room for: the
  // target holds prompt + n - 1 tokens, a draft model one fewer (it never holds a generation's last
  // two), so a prompt of at most target.max_size() or draft.max_size() + 1 tokens leaves room for one.
  const specsample::context_binding binding = specsample::binding_context(target_config.n_positions, draft_limits);
  const std::size_t holds = binding.holds, longest_prompt = binding.longest_prompt();
  const std::string bound_by =
      binding.draft ? fmt::format("draft model ({})", candidates[*binding.draft].string()) : "target model";
  // A prompt too long for the contexts however it encodes is refused before it is encoded (the BPE
  // of a file of a gigabyte would take minutes and gigabytes): no token spells more than
  // max_token_bytes, so a text encodes to at least this many tokens.
  const auto fewest_tokens = [&](const std::string& text) {
    return (text.size() + tok.max_token_bytes() - 1) / tok.max_token_bytes();
  };
  {
    const std::size_t at_least = fewest_tokens(c.prompt);
    if (at_least > longest_prompt) {
      usage_error(fmt::format("the prompt of {} bytes encodes to at least {} tokens (no token of this vocab spells more "
                              "than {} bytes), but the {} leaves room for a prompt of at most {}; shorten the prompt",
                              c.prompt.size(), at_least, tok.max_token_bytes(), bound_by, longest_prompt));
    }
  }
  const std::vector<token> prompt = tok.encode(c.prompt);
  if (prompt.empty()) throw specsample::error("the prompt encodes to no tokens");
  // The models' context: the smallest of them, and whose it is (the warm-ups' bound below).
  std::size_t limit = target_config.n_positions;
  std::string whose = "target model";
  for (std::size_t d = 0; d < candidates.size(); ++d) {
    if (draft_limits[d] < limit) {
      limit = draft_limits[d];
      whose = fmt::format("draft model ({})", candidates[d].string());
    }
  }
  // --prompt-lookup: lookup first, the draft model where it finds nothing (the timed check and the
  // generation both run this drafter).
  auto lookup = specsample::drafters::ngram::from_shortest(target_config.vocab_size, std::max<std::size_t>(1, c.prompt_lookup));
  {  // -n against the binding model's context, named as typed (the library names max_new_tokens)
    const std::size_t fits = binding.new_tokens_within(prompt.size());
    const std::size_t n = c.params.max_new_tokens;
    if (fits == 0) {  // no -n helps (-n is >= 1): the prompt alone does not fit
      usage_error(fmt::format("the prompt of {} tokens does not fit: the {} holds at most {} tokens, so a prompt of "
                              "at most {} leaves room for a new one; shorten the prompt",
                              prompt.size(), bound_by, holds, longest_prompt));
    }
    if (n > fits) {
      usage_error(fmt::format("-n {} is too many after a prompt of {} tokens: the {} holds at most {} tokens "
                              "(at most {} new {} here); lower -n",
                              n, prompt.size(), bound_by, holds, fits, fits == 1 ? "one" : "ones"));
    }
    // This generation's rounds draft from at most prompt + n - 2 tokens (a round decodes two at
    // least; -n fits the contexts, so they hold them), as distribution_check bounds its own: no
    // suffix of that many recurs in them. (At -n 1 no round drafts, with or without lookup.)
    const std::size_t drafted_from = specsample::longest_drafting_context(prompt.size(), n);
    if (c.prompt_lookup > 0 && n >= 2 && !lookup.can_match_in(drafted_from)) {
      usage_error(fmt::format("--prompt-lookup {} is too long: this generation's rounds draft from at most {} tokens (a "
                              "prompt of {} and -n {}, less the two a drafting round decodes), in which no suffix of {} "
                              "or more tokens can recur",
                              c.prompt_lookup, drafted_from, prompt.size(), n, drafted_from));
    }
  }

  // The warm-up prompts: the prompt itself, or a few from --calibration-prompts (acceptance
  // varies from one text to the next; 64 tokens from each, pooled).
  std::vector<std::vector<token>> warmup{prompt};
  if (c.calibration_prompts) {
    warmup.clear();
    for (const std::string& text : specsample::io::read_prompt_list(*c.calibration_prompts)) {
      // Too long however it encodes: refused before it is encoded, as the prompt is above.
      const std::size_t at_least = fewest_tokens(text);
      if (at_least >= limit) {
        throw specsample::error(fmt::format("{}: prompt {} of {} bytes encodes to at least {} tokens (no token of this "
                                            "vocab spells more than {} bytes), which leaves the {} (of {}) no room for "
                                            "a warm-up round (two new tokens); shorten it",
                                            c.calibration_prompts->string(), warmup.size() + 1, text.size(), at_least,
                                            tok.max_token_bytes(), whose, limit));
      }
      warmup.push_back(tok.encode(text));
      if (warmup.back().empty()) {
        throw specsample::error(fmt::format("{}: prompt {} encodes to no tokens", c.calibration_prompts->string(),
                                            warmup.size()));
      }
      // A warm-up from it must decode two tokens (a round with a draft): calibrate's refusal would
      // name neither the file nor the prompt.
      if (warmup.back().size() >= limit) {
        throw specsample::error(fmt::format("{}: prompt {} has {} tokens, which leaves the {} (of {}) no room for a "
                                            "warm-up round (two new tokens); shorten it",
                                            c.calibration_prompts->string(), warmup.size(), warmup.back().size(), whose,
                                            limit));
      }
    }
  } else if (!candidates.empty() && (candidates.size() > 1 || c.auto_k) && prompt.size() >= limit) {
    usage_error(fmt::format("{} warms up on the prompt, but a prompt of {} tokens leaves the {} (of {}) no room for a "
                            "round with a draft (two new tokens): give --calibration-prompts FILE{}",
                            c.auto_k ? "-k auto" : "a --draft list", prompt.size(), whose, limit,
                            c.auto_k ? " or -k N" : ""));
  }
  // The weights, every check above passed.
  const auto load_start = std::chrono::steady_clock::now();
  specsample::gpt2::options opts = c.model;
  opts.pool = std::make_shared<specsample::gpt2::thread_pool>(c.threads);  // one pool for every model
  if (!c.json) fmt::print(stderr, "loading {}...\n", target_dir.string());
  auto target = specsample::gpt2::model::load(target_dir, opts);
  specsample::check_model_vocabulary(target.vocab_size(), tok, target_dir.string());
  std::vector<specsample::gpt2::model> drafts;
  for (const auto& dir : candidates) {
    if (!c.json) fmt::print(stderr, "loading {}...\n", dir.string());
    drafts.push_back(specsample::gpt2::model::load(
        dir, c.draft_matmul ? specsample::gpt2::with_matmul_precision(opts, *c.draft_matmul) : opts));
    specsample::check_model_vocabulary(drafts.back().vocab_size(), tok, dir.string());  // (its tokenizer is tok's)
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  c.params.eos = c.no_eos ? std::nullopt : c.eos ? c.eos : target.config().eos_token_id;

  // Several candidates or -k auto: measure each on a warm-up and keep the best predicted speedup
  // among the candidates whose check pays (all of them when none does).
  cli run_cli = c;
  const auto lookup_first = [&](specsample::gpt2::model& draft, const specsample::speculative_params& p) {
    return specsample::drafters::fallback(lookup, specsample::model_drafter(draft, p.draft_warping(),
                                                                            p.draft_min_probability));
  };
  std::string mode = c.mode;  // -k auto may turn speculative into autoregressive (below)
  bool fell_back = false;
  std::size_t chosen = 0;
  nlohmann::json calibrations = nlohmann::json::array(), temperature_scans = nlohmann::json::array();
  // Each draft's parameters: --draft-temperature auto scans its ratio to the target's temperature.
  std::vector<specsample::speculative_params> draft_params(drafts.size(), c.params);
  if (c.auto_draft_temperature && !drafts.empty()) {
    std::FILE* out = c.json ? stderr : stdout;
    if (c.params.sampling.temperature == 0.0f) {
      fmt::print(out, "draft temperature: at temperature 0 both models are greedy; --draft-temperature auto has nothing to "
                      "choose\n");
    } else {
      const std::vector<double> ratios{0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5};
      const auto one = static_cast<std::size_t>(std::find(ratios.begin(), ratios.end(), 1.0) - ratios.begin());
      constexpr std::size_t scan_tokens = 64;  // per prompt, fewer where a prompt leaves less room
      fmt::print(out, "draft temperature (expected acceptance along the target's own text, up to {} tokens after each of "
                      "{} prompt(s), per ratio R to --temperature {:g}):\n",
                 scan_tokens, warmup.size(), c.params.sampling.temperature);
      for (std::size_t d = 0; d < drafts.size(); ++d) {
        std::mt19937_64 rng(c.seed);
        const auto scan = specsample::scan_draft_temperature(drafts[d], target, std::span<const std::vector<token>>(warmup),
                                                             c.params, std::span<const double>(ratios), rng, scan_tokens);
        draft_params[d] = scan.apply(c.params);
        fmt::print(out, "  {}: R = {:g}, the draft at T = {:g} (alpha {:.3f}; {:.3f} at R = 1; over {} {})\n",
                   candidates[d].string(), scan.best_ratio(), draft_params[d].draft_sampling->temperature,
                   *std::max_element(scan.alpha.begin(), scan.alpha.end()), scan.alpha[one], scan.positions,
                   scan.positions == 1 ? "position" : "positions");
        temperature_scans.push_back({{"draft", candidates[d].string()}, {"positions", scan.positions},
                                     {"ratios", scan.ratios}, {"alpha", scan.alpha},
                                     {"best_ratio", scan.best_ratio()},
                                     {"draft_temperature", draft_params[d].draft_sampling->temperature}});
      }
    }
  }
  if (!drafts.empty() && (drafts.size() > 1 || c.auto_k)) {
    // -k auto: each draft at its best K up to 8; -k N: every draft at N (warmed up at N).
    const std::size_t k_max = c.auto_k ? 8 : c.params.draft_length, warmup_tokens = 64, check_pairs = 5;
    const auto prompts = std::span<const std::vector<token>>(warmup);
    std::vector<specsample::calibration> cal;
    std::vector<std::mt19937_64> rngs(drafts.size(), std::mt19937_64(c.seed));
    for (std::size_t d = 0; d < drafts.size(); ++d) {
      cal.push_back(specsample::calibrate(drafts[d], target, prompts, draft_params[d], rngs[d], k_max, warmup_tokens, 0));
      if (!c.auto_k) cal[d] = cal[d].at(k_max);
    }
    // The best prediction among the drafts whose timed check pays: checked in order of
    // prediction, the first that pays is the one (the rest are not timed); none: the best predicted.
    std::vector<std::size_t> order(drafts.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return cal[a].predicted > cal[b].predicted; });
    chosen = order.front();
    // Reached by the checks below: pays() is the draft's verdict (JSON "pays"; null for a draft
    // not reached whose prediction > 1, which the check would have had to confirm).
    std::vector<bool> decided(drafts.size(), false);
    for (const std::size_t d : order) {
      decided[d] = true;
      if (!(cal[d].predicted > 1.0)) break;  // neither this draft nor the rest can pay
      const auto check = [&](auto& drafter) {
        specsample::check_prediction(cal[d], drafter, target, prompts, draft_params[d], rngs[d], check_pairs,
                                     warmup_tokens);
      };
      if (c.prompt_lookup > 0) {
        auto both = lookup_first(drafts[d], draft_params[d]);
        check(both);
      } else {
        check(drafts[d]);
      }
      if (cal[d].pays()) {
        chosen = d;
        break;
      }
    }
    // The warm-up's length from each prompt: warmup_tokens, fewer where the context ends first.
    std::size_t fewest = warmup_tokens, most = 0;
    for (const auto& one : cal) {
      for (const std::size_t n : one.warmup_lengths) {
        fewest = std::min(fewest, n);
        most = std::max(most, n);
      }
    }
    const std::string warm_up = fewest == most ? fmt::format("{}", most) : fmt::format("{} to {}", fewest, most);
    std::FILE* out = c.json ? stderr : stdout;
    fmt::print(out, "draft choice (warm-up of {} tokens{} at K = {} from each of {} prompt(s); K = {}; predicted = E[tokens per "
                    "round] / (c_1st + c(K - 1) + v[K]), c_1st = a round's first draft call, v[K] = measured cost of a "
                    "(K+1)-token target call over a 1-token call (above K = 8 interpolated between powers of two); "
                    "checked = speculation at that K{} timed against autoregressive decoding, pooled over {} pairs of {} "
                    "tokens (all the autoregressive decode time over all the speculative), where predicted > 1, in order of prediction until one pays):\n", warm_up,
               fewest < warmup_tokens ? " (the context leaves no more)" : "", k_max, warmup.size(),
               c.auto_k ? "the best predicted (-k auto)" : fmt::format("{} (-k)", k_max),
               c.prompt_lookup > 0 ? " with prompt lookup first (the prediction: the draft model alone)" : "",
               check_pairs, warmup_tokens);
    std::size_t width = 5;
    for (const auto& path : candidates) width = std::max(width, path.string().size());
    // A later draft position's acceptance (none measured at K = 1).
    const std::size_t later = std::min<std::size_t>(3, k_max - 1);
    fmt::print(out, "  {:<{}} {:>8} {:>8} {:>7} {:>7} {:>3} {:>10} {:>8}\n", "draft", width, "alpha_0",
               fmt::format("alpha_{}", std::max<std::size_t>(later, 1)), "c_1st", "c", "K", "predicted", "checked");
    for (std::size_t d = 0; d < drafts.size(); ++d) {
      const auto& m = cal[d].measured;
      fmt::print(out, "  {:<{}} {:>8.3f} {:>8} {:>7.4f} {:>7.4f} {:>3} {:>9.2f}x {:>8}{}\n", candidates[d].string(),
                 width, cal[d].acceptance[0],
                 later > 0 ? fmt::format("{:.3f}", cal[d].acceptance[later]) : std::string("-"), cal[d].first_cost_ratio,
                 cal[d].cost_ratio,
                 cal[d].best_k, cal[d].predicted, m ? fmt::format("{:.2f}x", m->speedup()) : std::string("-"),
                 d == chosen ? "  <- chosen" : "");
      calibrations.push_back({{"draft", candidates[d].string()}, {"acceptance_by_position", cal[d].acceptance},
                              {"rounds_by_position", cal[d].rounds_reached},
                              {"cost_ratio", cal[d].cost_ratio}, {"first_cost_ratio", cal[d].first_cost_ratio},
                              {"best_k", cal[d].best_k}, {"predicted_speedup", cal[d].predicted},
                              {"checked_speedup", m ? nlohmann::json(m->speedup()) : nlohmann::json(nullptr)},
                              {"checked_ratios", m ? nlohmann::json(m->ratios()) : nlohmann::json(nullptr)},
                              {"pays", decided[d] || !(cal[d].predicted > 1.0) ? nlohmann::json(cal[d].pays())
                                                                               : nlohmann::json(nullptr)}});
    }
    if (c.auto_k) draft_params[chosen].draft_length = cal[chosen].best_k;
    if (!cal[chosen].pays()) {
      // -k auto in speculative mode decodes the fastest way the calibration finds; compare
      // mode still runs both, to show it.
      const bool fall_back = c.auto_k && mode == "speculative";
      const auto& m = cal[chosen].measured;
      fmt::print(out, "{}{}\n",
                 m ? fmt::format("speculation at {}K = {} does not pay here (predicted {:.2f}x, measured {:.2f}x)",
                                 c.auto_k ? "the best predicted " : "", cal[chosen].best_k, cal[chosen].predicted,
                                 m->speedup())
                 : c.auto_k ? fmt::format("no K is predicted to beat autoregressive decoding here (best {:.2f}x at K = {})",
                                          cal[chosen].predicted, cal[chosen].best_k)
                            : fmt::format("K = {} is not predicted to beat autoregressive decoding here ({:.2f}x)",
                                          cal[chosen].best_k, cal[chosen].predicted),
                 fall_back  ? std::string(": decoding autoregressively")
                 : c.auto_k ? std::string()
                            : fmt::format("; speculating at K = {} as asked", draft_params[chosen].draft_length));
      if (fall_back) {
        mode = "autoregressive";
        fell_back = true;
      }
    }
  }
  if (!drafts.empty()) run_cli.params = draft_params[chosen];  // its K (-k auto) and temperature (auto)
  const fs::path draft_dir = drafts.empty() ? fs::path(ngram ? "ngram" : "") : candidates[chosen];

  std::vector<run_record> spec_runs, ar_runs;
  std::size_t lookup_rounds = 0;  // --prompt-lookup: rounds drafted by lookup (every run: the same)
  for (std::size_t r = 0; r < (mode == "compare" ? c.repeat : 1); ++r) {
    const bool stream = c.stream && r == 0;  // repeats are timing runs of the same text
    if (mode != "speculative") {
      std::mt19937_64 rng(c.seed);
      ar_runs.push_back(timed(c, tok, "autoregressive", stream, [&](reporter& rep) {
        return specsample::autoregressive_sample(target, prompt, c.params, rng, rep);
      }));
    }
    if (mode != "autoregressive") {
      std::mt19937_64 rng(c.seed);
      spec_runs.push_back(timed(c, tok, "speculative", stream, [&](reporter& rep) {
        if (ngram) return specsample::speculative_sample(lookup, target, prompt, run_cli.params, rng, rep);
        if (c.prompt_lookup > 0) {
          auto both = lookup_first(drafts[chosen], run_cli.params);
          auto g = specsample::speculative_sample(both, target, prompt, run_cli.params, rng, rep);
          lookup_rounds = both.first_rounds();
          return g;
        }
        return specsample::speculative_sample(drafts[chosen], target, prompt, run_cli.params, rng, rep);
      }));
    }
  }

  // Decode-phase seconds (tokens/s and the speedup) and whole-call seconds of every run.
  std::vector<double> spec_s, ar_s, spec_all, ar_all;
  for (const auto& r : spec_runs) {
    spec_s.push_back(r.result.stats.decode_seconds());
    spec_all.push_back(r.seconds);
  }
  for (const auto& r : ar_runs) {
    ar_s.push_back(r.result.stats.decode_seconds());
    ar_all.push_back(r.seconds);
  }
  // The speedups compare time per token: sampled runs that stop at EOS differ in length.
  const auto per_token = [](const std::vector<run_record>& runs, const std::vector<double>& seconds) {
    std::vector<double> v;
    for (std::size_t i = 0; i < runs.size(); ++i) v.push_back(seconds[i] / static_cast<double>(runs[i].result.stats.tokens));
    return v;
  };
  const std::vector<double> spec_t = per_token(spec_runs, spec_s), ar_t = per_token(ar_runs, ar_s),
                            spec_all_t = per_token(spec_runs, spec_all), ar_all_t = per_token(ar_runs, ar_all);
  const auto min_of = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  const bool greedy = c.params.sampling.temperature == 0.0f;
  const bool compare = mode == "compare";
  const bool identical = compare && spec_runs.front().result.tokens == ar_runs.front().result.tokens;

  if (c.json) {
    nlohmann::json j{{"target", target_dir.string()},
                     {"mode", mode},
                     {"prompt_tokens", prompt.size()},
                     {"max_new_tokens", c.params.max_new_tokens},
                     {"eos", c.params.eos ? nlohmann::json(*c.params.eos) : nlohmann::json(nullptr)},
                     {"draft_length", run_cli.params.draft_length},
                     {"temperature", c.params.sampling.temperature},
                     {"top_k", c.params.sampling.top_k},
                     {"top_p", c.params.sampling.top_p},
                     {"min_p", c.params.sampling.min_p},
                     {"seed", c.seed},
                     {"verify", specsample::verification_name(c.params.verify)},
                     {"leniency", c.params.leniency},
                     {"threads", target.threads()},
                     {"kernels", specsample::isa_name(target.kernels())},
                     {"load_seconds", load_seconds}};
    j.update(specsample::gpt2::precision_json(c.model));
    if (need_draft) {
      j["draft"] = draft_dir.string();
      j["draft_matmul"] = specsample::gpt2::precision_name(c.draft_matmul.value_or(c.model.matmul_precision));
      if (!ngram) {  // the warping the draft model samples from (--draft-temperature, else the target's)
        const auto& d = run_cli.params.draft_warping();
        j["draft_sampling"] = {{"temperature", d.temperature}, {"top_k", d.top_k}, {"top_p", d.top_p}, {"min_p", d.min_p}};
      }
    }
    if (c.prompt_lookup > 0) j["prompt_lookup"] = {{"min_n", c.prompt_lookup}, {"rounds", lookup_rounds}};
    if (!calibrations.empty()) j["draft_choice"] = calibrations;
    if (!temperature_scans.empty()) j["draft_temperature_scan"] = temperature_scans;
    if (fell_back) j["requested_mode"] = c.mode;  // speculative: no K paid
    // A mode's statistics are its first run's; its times the medians over --repeat runs, as the
    // text reports them (every run's in *_all).
    const auto mode_json = [&](const std::vector<run_record>& runs, const std::vector<double>& decode,
                               const std::vector<double>& all) {
      nlohmann::json m = stats_json(runs.front(), c.params);
      m["text"] = tok.decode(runs.front().result.tokens);
      m["token_ids"] = runs.front().result.tokens;
      m["decode_seconds"] = median(decode);
      m["tokens_per_second"] = static_cast<double>(runs.front().result.stats.tokens) / median(decode);
      m["seconds"] = median(all);
      m["decode_seconds_all"] = decode;
      m["seconds_all"] = all;
      return m;
    };
    if (!spec_runs.empty()) j["speculative"] = mode_json(spec_runs, spec_s, spec_all);
    if (!ar_runs.empty()) j["autoregressive"] = mode_json(ar_runs, ar_s, ar_all);
    if (compare) {
      j["speedup_median"] = median(ar_t) / median(spec_t);
      j["speedup_median_with_prefill"] = median(ar_all_t) / median(spec_all_t);
      j["speedup_min_time"] = min_of(ar_t) / min_of(spec_t);
      if (greedy) j["identical"] = identical;
    }
    // Byte-level tokens can end the text inside a UTF-8 character (and paths need not be UTF-8):
    // each invalid byte is written as U+FFFD; "token_ids" has the exact output.
    fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return compare && greedy && !identical ? 1 : 0;
  }

  // Streamed text was printed under its header as it came; otherwise print it now.
  const auto print_text = [&](const std::string& title, const run_record& r) {
    fmt::print("--- {} ---\n{}{}\n\n", title, c.prompt, tok.decode(r.result.tokens));
  };
  if (!c.stream) {
    if (!spec_runs.empty()) print_text("speculative", spec_runs.front());
    if (!ar_runs.empty() && !(compare && identical)) print_text("autoregressive", ar_runs.front());
  }

  const auto up_to_eos = [&](const run_record& r) {
    return stopped_at_eos(r, c.params) ? fmt::format(" (up to EOS, token {})", *c.params.eos) : std::string();
  };
  if (!spec_runs.empty()) {
    const auto& s = spec_runs.front().result.stats;
    // No draft proposed (-n 1, or --draft ngram that never matched): no acceptance to state.
    const std::string acceptance =
        s.drafted == 0 ? std::string("no draft proposed")
                       : fmt::format("acceptance {:.3f} (alpha {:.3f})", s.acceptance_rate(), s.estimated_alpha());
    fmt::print("speculative:    {} tokens{} in {:.3f} s ({:.1f} tokens/s) after a {:.1f} ms prefill; K = {}, {} rounds, "
               "{}, {:.2f} tokens per target call\n",
               s.tokens, up_to_eos(spec_runs.front()), median(spec_s), static_cast<double>(s.tokens) / median(spec_s), s.prefill_seconds * 1e3,
               run_cli.params.draft_length, s.rounds, acceptance, s.tokens_per_target_call());
    if (c.prompt_lookup > 0) {
      fmt::print("prompt lookup drafted {} of the {} rounds, the draft model the others\n", lookup_rounds, s.rounds);
    }
    if (c.params.leniency < 1.0) {
      fmt::print("note: leniency {} < 1 is lossy: this output is NOT distributed as the target's\n", c.params.leniency);
    }
  }
  if (!ar_runs.empty()) {
    const auto& s = ar_runs.front().result.stats;
    fmt::print("autoregressive: {} tokens{} in {:.3f} s ({:.1f} tokens/s) after a {:.1f} ms prefill\n", s.tokens,
               up_to_eos(ar_runs.front()), median(ar_s), static_cast<double>(s.tokens) / median(ar_s), s.prefill_seconds * 1e3);
  }
  if (compare) {
    const std::size_t spec_tokens = spec_runs.front().result.stats.tokens, ar_tokens = ar_runs.front().result.stats.tokens;
    fmt::print("speedup: {:.2f}x decoding (median of {} run{} each; best times {:.2f}x); {:.2f}x with the prefill{}\n",
               median(ar_t) / median(spec_t), c.repeat, c.repeat == 1 ? "" : "s", min_of(ar_t) / min_of(spec_t),
               median(ar_all_t) / median(spec_all_t),
               spec_tokens == ar_tokens ? std::string()
                                        : fmt::format(" (time per token: {} tokens against {})", spec_tokens, ar_tokens));
    if (std::all_of(spec_runs.begin(), spec_runs.end(), [](const run_record& r) { return r.result.stats.drafted == 0; })) {
      fmt::print("note: no draft was proposed, so both modes made the same target calls: the speedup is timing noise\n");
    }
    if (greedy) fmt::print("outputs identical at temperature 0: {}\n", identical ? "yes" : "NO");
  }
  return compare && greedy && !identical ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  int status = 2;
  try {
    status = run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "specsample-generate: error: {}\n", e.what());
    return 2;
  }
  return specsample::io::written("specsample-generate", status);
}
