// distribution_check: is speculative sampling exact for this draft/target pair?
//
// Enumerates the target's exact distribution over every sequence of L tokens, draws N speculative
// samples, and prints Pearson's X² statistic, its p-value and a verdict (beside a PASS, the distance
// a sampler would have to be off by to fail it about half the time). By default the pair is a
// toy one (random order-1 Markov models); --target and --draft check two GPT-2 checkpoints, e.g.
// your own, after --prompt. In code, point `check` at any models satisfying
// specsample::language_model. Only the sequences of positive probability are enumerated, at most
// 1e6, so a large vocabulary needs a --top-k (--top-k 3 --length 4: at most 81 sequences, one
// model call per prefix). Too few samples to test are refused with the count needed. `--broken`
// breaks the chosen rule (token-wise or block): it resamples from p instead of the residual, to
// show what a failing verdict looks like.
constexpr const char* usage =
    "usage: distribution_check [--vocab V] [--similarity S] [--length L] [-k K] [--temperature T]\n"
    "                          [--top-k N] [--top-p P] [--min-p M] [--draft-temperature T]\n"
    "                          [--p-min P] [--adaptive] [--verify tokenwise|block] [--samples N]\n"
    "                          [--seed S] [--broken]\n"
    "       distribution_check --target DIR --draft DIR|ngram --prompt TEXT [--eos ID|none]\n"
    "                          [--threads N] [--kernels LEVEL] [--weights F] [--kv F] [--matmul P]\n"
    "                          [--amx on|off] [--draft-matmul P] [--prompt-lookup N]\n"
    "                          [the options above but --vocab and --similarity]\n"
    "  (an option's value follows it, or joins a long option after '=': -k 3, --temperature=0.7;\n"
    "   a value that begins with -- must join it after '=')\n"
    "  --vocab V, --similarity S   the toy pair: V tokens (default 4), a draft this close to the target\n"
    "                              (0: unrelated, 1: the same; default 0.4)\n"
    "  --target DIR, --draft DIR   two GPT-2 checkpoints with the same tokenizer, checked after --prompt;\n"
    "                              --draft ngram drafts by prompt lookup (no draft model)\n"
    "  --prompt-lookup N           draft by prompt lookup first (suffixes of N to max(N, 4) tokens), the\n"
    "                              draft model where it finds none\n"
    "  --eos ID|none               where a sequence stops (default: the target's config.json, as\n"
    "                              specsample-generate stops)\n"
    "  --threads N                 kernel threads, shared by both models (default 0: one per CPU it\n"
    "                              may run on)\n"
    "  --kernels LEVEL             best, avx512, avx2 or generic  } both models, as\n"
    "  --weights F                 f32, f16 or bf16               } specsample-generate loads them\n"
    "  --kv F                      f32 or f16                     } (--matmul bf16: the target checked\n"
    "  --matmul P                  f32, bf16 or int8              } multiplies in BF16, as you sample)\n"
    "  --amx on|off                AMX tiles for bf16/int8 matmuls } (default on)\n"
    "  --draft-matmul P            the draft's matmuls in P instead (f32, bf16 or int8)\n"
    "  --length L                  tokens per sequence, 1 to 64 (default 4)\n"
    "  -k K                        draft length (default 3)\n"
    "  --temperature T             the warping (default 1; 0 is greedy, one sequence); a large\n"
    "  --top-k N, --top-p P,       vocabulary needs a top-k\n"
    "  --min-p M\n"
    "  --draft-temperature T       the draft samples at T with the same filters (default: --temperature)\n"
    "  --p-min P                   stop drafting a round when the draft's top probability (at its own\n"
    "                              temperature) is below P\n"
    "  --adaptive                  adapt K between rounds (+2 after a full acceptance, -1 after a\n"
    "                              rejection)\n"
    "  --verify tokenwise|block    the verification rule (default tokenwise)\n"
    "  --samples N, --seed S       speculative samples drawn (default 100000), their seed (default 1;\n"
    "                              the toy pair's too: another seed checks another pair)\n"
    "  --broken                    the rule (tokenwise or block) resampling from p instead of the\n"
    "                              residual, to see a FAIL (where drafts are rejected and several\n"
    "                              sequences are possible)\n"
    "  -h, --help                  this text\n"
    "The verdict goes to stdout, the expected time of the samples to stderr. Exit status: 0 PASS,\n"
    "1 FAIL, 2 an error.\n";

#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/gpt2.hpp>
#include <specsample/io/argument.hpp>
#include <specsample/io/number.hpp>
#include <specsample/io/prompt_list.hpp>
#include <specsample/sampling/drafter.hpp>
#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>
#include <specsample/tokenizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

// `Rule` (token-wise or block verification) with a classic mistake: on a rejection the token after
// the accepted drafts is drawn from p instead of the residual (norm(max(0, p - q)); block
// verification's norm(max(0, w p - q))). It reads p as the built-in rules do, column by column
// through `decide` (the loop's lazy path, which warps a target column only when a decision reaches
// it), so the check's FAIL is of the path its PASS certifies.
template <class Rule>
struct resampling_from_p {
  using decides_columns = resampling_from_p;
  static constexpr std::string_view correction = "p (--broken)";
  Rule rule;

  template <class Rng>
  specsample::verify_result operator()(std::span<const specsample::token> drafts,
                                       const Eigen::Ref<const Eigen::MatrixXf>& q,
                                       const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    return decide(drafts, q, p, rng);
  }

  template <class Columns, class Rng>
  specsample::verify_result decide(std::span<const specsample::token> drafts,
                                   const Eigen::Ref<const Eigen::MatrixXf>& q, const Columns& p, Rng& rng) const {
    specsample::verify_result r = rule.decide(drafts, q, p, rng);  // (its residual draw is discarded)
    if (!r.bonus) r.next = specsample::sample_categorical(p.col(static_cast<Eigen::Index>(r.accepted)), rng);
    return r;
  }
};

// The reusable part: check any pair after `prompt` and print the verdict. Returns true when
// consistent.
template <class Draft, class Target, class Verifier>
bool check(Draft& draft, Target& target, std::span<const specsample::token> prompt,
           const specsample::speculative_params& params, std::size_t samples, std::uint64_t seed, double alpha,
           Verifier verifier) {
  {  // What the samples will take (each a generation, with `verifier`: a large model's take long), on stderr: one
     // untimed (the first call's allocations and cold caches made a toy pair's estimate ~12x the
     // run), then at least ten timed, and quick ones for at least 50 ms.
    std::mt19937_64 probe(~seed);
    (void)specsample::testing::speculative_draw(draft, target, prompt, params, probe, verifier);
    const auto start = std::chrono::steady_clock::now();
    std::size_t timed = 0;
    double elapsed = 0.0;
    do {
      (void)specsample::testing::speculative_draw(draft, target, prompt, params, probe, verifier);
      ++timed;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (timed < 10 || (elapsed < 0.05 && timed < 100000));
    const double each = elapsed / static_cast<double>(timed);
    // The exact distribution first: a target call of one token per prefix of positive
    // probability, at most sum_{i < L} k^i of them with top-k k (V for none), the cap
    // (testing::max_sequences) past that.
    const std::size_t V = target.vocab_size(), L = params.max_new_tokens;
    const int top_k = params.sampling.temperature == 0.0f ? 1 : params.sampling.top_k;
    const double width = top_k > 0 ? std::min(static_cast<double>(top_k), static_cast<double>(V)) : static_cast<double>(V);
    double calls = 0.0, level = 1.0;
    for (std::size_t i = 0; i < L && calls <= static_cast<double>(specsample::testing::max_sequences); ++i, level *= width) {
      calls += level;
    }
    calls = std::min(calls, static_cast<double>(specsample::testing::max_sequences));
    // (Each timed call appends the prompt's last token after the rest: within the context the
    // checks allow, a prompt that fills it included.)
    target.truncate(0);
    if (prompt.size() > 1) (void)target.append(prompt.first(prompt.size() - 1));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      (void)target.append(prompt.last(1));
      target.truncate(prompt.size() - 1);
    }
    const double call = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10.0;
    fmt::print(stderr, "the target's exact distribution: at most {:.0f} calls, ~{:.3g} ms each: ~{:.3g} s; then {} "
                       "samples, ~{:.3g} ms each: ~{:.3g} s\n",
               calls, 1e3 * call, call * calls, samples, 1e3 * each, each * static_cast<double>(samples));
    // Where more sequences than the table holds are possible, whether they come depends on the
    // logits (an EOS ends some, top-p or min-p cut, a probability rounding to 0): said, not refused.
    // With nothing of those but the rounding to prune them, the error is all but certain: said so.
    if (const double possible = std::pow(width, static_cast<double>(L));
        possible > static_cast<double>(specsample::testing::max_sequences)) {
      const specsample::sampling_params& sp = params.sampling;
      const bool nothing_prunes = !params.eos && sp.top_p >= 1.0f && sp.min_p <= 0.0f;
      fmt::print(stderr, "note: up to {:.0f}^{} = {:.3g} sequences may have positive probability; past {} the "
                         "enumeration stops with an error{} (a smaller --top-k or --length keeps them fewer)\n",
                 width, L, possible, specsample::testing::max_sequences,
                 nothing_prunes ? ", and with no EOS, top-p or min-p to end or cut any of them it will unless a "
                                  "probability rounds to 0: expect it after the enumeration's time above"
                                : "");
    }
  }
  std::mt19937_64 rng(seed);
  // A drafter of two (prompt lookup, else a draft model) counts whose drafts each round took.
  constexpr bool two_drafters = requires { draft.first_rounds() + draft.second_rounds(); };
  std::size_t first_rounds = 0, second_rounds = 0;
  if constexpr (two_drafters) {
    first_rounds = draft.first_rounds();
    second_rounds = draft.second_rounds();
  }
  const auto fit = specsample::testing::speculative_fit(draft, target, prompt, params, samples, rng, verifier);
  // A p-value that underflows a double is said so, not printed as 0 (which only a sample of
  // probability zero gives).
  const auto p_text = [](double p) { return p < 1e-300 ? std::string("< 1e-300") : fmt::format("= {:.4g}", p); };
  fmt::print("samples: {}, sequence length: {}, bins: {} (sequences of expected count >= 5; the other {}, "
             "pooled, each also checked for too many samples)\n",
             samples, params.max_new_tokens, fit.bins, fit.pooled_cells);
  if (fit.impossible > 0) {
    fmt::print("impossible samples = {}: sequences the target gives probability zero (p-value = 0)\n", fit.impossible);
  } else {
    fmt::print("X2 = {:.2f}, degrees of freedom = {}, p-value {}{}\n", fit.statistic, fit.dof,
               p_text(fit.p_value),
               fit.pooled_cells == 0 ? std::string()
                                     : fmt::format(" (the bins' p {}, the pooled cells' p {})", p_text(fit.bins_p_value),
                                                   p_text(fit.pooled_p_value)));
  }
  const bool ok = fit.p_value > alpha;
  fmt::print("verdict: {} (alpha = {})\n",
             ok ? "PASS, no deviation from the target's exact distribution detected"
                : "FAIL, not the target's distribution",
             alpha);
  if (ok && fit.dof > 0) {  // what the PASS can see: more samples see smaller deviations
    fmt::print("power: a sampler off by total variation {:.3g} or more across these bins would fail about half the "
               "time or more; more samples see smaller deviations, over more bins (a PASS is not a proof; rerunning "
               "with new seeds until one passes is no check at all)\n",
               specsample::testing::detectable_distance(fit, alpha));
  }
  if constexpr (two_drafters) {  // (a check whose rounds all came from one drafter tested only that one)
    fmt::print("drafting rounds of the samples: {} by prompt lookup, {} by the draft model\n",
               draft.first_rounds() - first_rounds, draft.second_rounds() - second_rounds);
  }
  std::string_view correction = "the residual";
  if constexpr (requires { Verifier::correction; }) correction = Verifier::correction;
  fmt::print("drafts in the samples: {} proposed, {} rejected (each replaced by a draw from {})\n", fit.drafted,
             fit.rejected, correction);
  if (ok && fit.drafted == 0) {
    fmt::print("note: no round drafted, so the check tested the target's own sampling only (a generation's last "
               "token is never drafted, so --length 1 drafts nothing; prompt lookup drafts only where the context "
               "repeats)\n");
  } else if (ok && fit.rejected == 0) {
    fmt::print("note: no draft was rejected, so the check never reached the residual (a verifier broken there "
               "passes too); a less similar draft or a higher temperature rejects some\n");
  }
  if (ok && fit.dof == 0) {  // (every sampler that emits nothing impossible passes)
    fmt::print("note: one sequence has positive probability, so the check shows only that every sample is it "
               "(a broken verifier passes too); a higher --temperature or --top-k tests the distribution\n");
  }
  return ok;
}

// Two GPT-2 checkpoints with the same tokenizer, checked after `prompt`, loaded as `model` says
// (both; `draft_matmul`: the draft's matmuls instead) on one pool of `threads` kernel threads,
// stopping at the target's EOS (config.json's, or `eos`: an id or "none") as generation does.
// `draft` "ngram" drafts by prompt lookup alone, and `prompt_lookup` > 0 by prompt lookup first
// (suffixes of prompt_lookup to max(prompt_lookup, 4) tokens), the draft model where it finds
// nothing, as specsample-generate does. The command line fills it; `target` set means the check
// is of checkpoints, and needs the rest.
struct checkpoints {
  std::optional<std::filesystem::path> target, draft;
  std::optional<std::string> prompt;
  std::optional<std::string_view> eos;
  std::size_t threads = 0;
  specsample::gpt2::options model;
  std::optional<specsample::gpt2::matmul_precision> draft_matmul;
  std::size_t prompt_lookup = 0;

  [[nodiscard]] bool ngram() const { return draft == "ngram"; }
};

template <class Verifier>
bool check_checkpoints(const checkpoints& c, specsample::speculative_params params, std::size_t samples,
                       std::uint64_t seed, Verifier verifier) {
  const std::filesystem::path& target_dir = c.target.value();
  const std::filesystem::path& draft_dir = c.draft.value();
  specsample::gpt2::require_model_directory(target_dir);  // (before the tokenizer is read from it)
  if (!c.ngram()) specsample::gpt2::require_model_directory(draft_dir);
  const auto tok = specsample::bpe_tokenizer::load(target_dir);
  if (!c.ngram()) {
    specsample::check_same_vocabulary(specsample::bpe_tokenizer::load(draft_dir), tok, draft_dir.string(),
                                      target_dir.string());
  }
  std::optional<specsample::token> eos_id;  // --eos, before the models load
  if (c.eos && *c.eos != "none") {
    eos_id = specsample::io::parse_number<specsample::token>("--eos", *c.eos);
    if (!specsample::in_vocabulary(*eos_id, tok.vocab_size())) {
      throw specsample::error(
          fmt::format("--eos {} is not a token of the target's vocabulary of {}", *c.eos, tok.vocab_size()));
    }
  }
  const std::vector<specsample::token> prompt = tok.encode(c.prompt.value());
  if (prompt.empty()) throw specsample::error("--prompt encodes to no tokens");
  // --length and --prompt-lookup are checked on the models' config.json files, before any weights
  // load: a model's context is its config's n_positions (gpt2::model::max_size).
  const auto config_of = [](const std::filesystem::path& dir) {
    return specsample::gpt2::config::load(specsample::gpt2::config_file(dir));
  };
  const specsample::gpt2::config target_config = config_of(target_dir);
  {  // --length against the models' contexts, named as typed (the library names max_new_tokens)
    const std::vector<std::size_t> draft_limits =
        c.ngram() ? std::vector<std::size_t>{}
                  : std::vector<std::size_t>{config_of(draft_dir).n_positions};
    const specsample::context_binding binding = specsample::binding_context(target_config.n_positions, draft_limits);
    const std::size_t fits = binding.new_tokens_within(prompt.size()), bound = binding.holds;
    const char* const bound_by = binding.draft ? "draft" : "target";
    if (fits == 0) {  // no --length helps (it is >= 1)
      throw specsample::error(fmt::format("the --prompt of {} tokens does not fit: the {} model holds at most {} "
                                          "tokens; shorten --prompt", prompt.size(), bound_by, bound));
    }
    if (params.max_new_tokens > fits) {
      throw specsample::error(fmt::format("--length {} is too long after a --prompt of {} tokens: the {} model holds "
                                          "at most {} tokens (at most {} new {} here); lower --length or shorten "
                                          "--prompt",
                                          params.max_new_tokens, prompt.size(), bound_by, bound, fits,
                                          fits == 1 ? "one" : "ones"));
    }
  }
  // A round drafts from at most prompt + length - 2 tokens (it decodes two at least), in which no
  // suffix of that many recurs: lookup would run, draft nothing, and the check test nothing of it.
  const std::size_t drafted_from = specsample::longest_drafting_context(prompt.size(), params.max_new_tokens);
  if (c.prompt_lookup > 0 && params.max_new_tokens >= 2 &&
      !specsample::drafters::ngram::from_shortest(target_config.vocab_size, c.prompt_lookup).can_match_in(drafted_from)) {
    throw specsample::error(fmt::format("--prompt-lookup {} is too long: the rounds draft from at most {} tokens (a "
                                        "--prompt of {} and --length {}, less the two a drafting round decodes), in "
                                        "which no suffix of {} or more tokens can recur",
                                        c.prompt_lookup, drafted_from, prompt.size(), params.max_new_tokens,
                                        drafted_from));
  }
  auto opts = c.model;
  opts.pool = std::make_shared<specsample::gpt2::thread_pool>(c.threads);
  auto target = specsample::gpt2::model::load(target_dir, opts);
  specsample::check_model_vocabulary(target.vocab_size(), tok, target_dir.string());
  std::optional<specsample::gpt2::model> draft;
  if (!c.ngram()) {
    draft.emplace(specsample::gpt2::model::load(
        draft_dir, c.draft_matmul ? specsample::gpt2::with_matmul_precision(opts, *c.draft_matmul) : opts));
    specsample::check_model_vocabulary(draft->vocab_size(), tok, draft_dir.string());  // (its tokenizer is tok's)
  }
  params.eos = c.eos ? eos_id : target.config().eos_token_id;
  const auto described = [](const std::filesystem::path& dir, const specsample::gpt2::model& m) {
    std::string matmuls = specsample::gpt2::precision_name(m.matmul_precision());
    for (char& ch : matmuls) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    return fmt::format("{} ({} layers; weights {}, matmuls {}, KV {}, kernels {})", dir.string(), m.config().n_layer,
                       specsample::gpt2::format_name(m.weights().output_embedding().format()), matmuls,
                       specsample::gpt2::format_name(m.kv_storage()), specsample::isa_name(m.kernels()));
  };
  const auto print = [&](const std::string& drafting) {
    fmt::print("checkpoints: target {}, draft {}, vocab {}, prompt of {} tokens, EOS {}\n",
               described(target_dir, target), drafting, tok.vocab_size(), prompt.size(),
               params.eos ? fmt::format("token {}", *params.eos) : "none");
  };
  if (c.ngram() || c.prompt_lookup > 0) {  // suffixes of min_n to max_n tokens, as specsample-generate looks up
    auto lookup = specsample::drafters::ngram::from_shortest(target.vocab_size(), std::max<std::size_t>(1, c.prompt_lookup));
    const std::string lookup_text = fmt::format("prompt lookup of {} to {} tokens", lookup.min_n(), lookup.max_n());
    if (c.ngram()) {
      print(lookup_text);
      return check(lookup, target, prompt, params, samples, seed, 1e-3, verifier);
    }
    print(fmt::format("{}, else {}", lookup_text, described(draft_dir, *draft)));
    specsample::drafters::fallback first_lookup(
        lookup, specsample::model_drafter(*draft, params.draft_warping(), params.draft_min_probability));
    return check(first_lookup, target, prompt, params, samples, seed, 1e-3, verifier);
  }
  print(described(draft_dir, *draft));
  return check(*draft, target, prompt, params, samples, seed, 1e-3, verifier);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t vocab = 4, samples = 100'000;
  double similarity = 0.4;
  std::uint64_t seed = 1;
  bool broken = false;
  checkpoints pair;
  std::optional<float> draft_temperature;
  std::vector<std::string_view> given;  // the options, as typed
  specsample::speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  try {
    for (specsample::io::argument_reader args(argc, argv); args.next();) {
      const std::string_view a = args.flag();
      if (a == "--broken") {
        broken = true;
        continue;
      }
      if (a == "--help" || a == "-h") {
        args.refuse_value();
        fmt::print("{}", usage);
        return specsample::io::written("distribution_check", 0);
      }
      if (a == "--vocab") vocab = args.number<std::size_t>(2);  // (one token passes any sampler)
      else if (a == "--similarity") similarity = args.number<double>();
      else if (a == "--target") pair.target = args.path_value();
      else if (a == "--draft") pair.draft = args.path_value();
      else if (a == "--prompt") pair.prompt = specsample::io::check_prompt_argument(args.value(), a);
      else if (a == "--eos") pair.eos = args.value();
      else if (a == "--threads") pair.threads = specsample::gpt2::threads_option(a, args.number<std::size_t>());
      else if (specsample::gpt2::is_option_flag(a)) specsample::gpt2::set_option(pair.model, a, args.value());
      else if (a == "--draft-matmul") pair.draft_matmul = specsample::gpt2::precision_option(a, args.value());
      else if (a == "--prompt-lookup") pair.prompt_lookup = args.number<std::size_t>(1);
      else if (a == "--length") params.max_new_tokens = args.number<std::size_t>(1);
      else if (a == "-k") params.draft_length = args.number<std::size_t>(1);
      else if (a == "--temperature") params.sampling.temperature = args.number<float>();
      else if (a == "--top-k") params.sampling.top_k = args.number<int>();
      else if (a == "--top-p") params.sampling.top_p = args.number<float>();
      else if (a == "--min-p") params.sampling.min_p = args.number<float>();
      else if (a == "--draft-temperature") {
        const std::string_view t = args.value();
        if (t == "auto") {
          throw specsample::error("--draft-temperature auto is specsample-generate's scan: give the temperature it chose");
        }
        draft_temperature = specsample::io::parse_number<float>(a, t);
      }
      else if (a == "--adaptive") params.adaptive_draft_length = true;
      else if (a == "--p-min") params.draft_min_probability = args.number<float>();
      else if (a == "--verify") params.verify = specsample::verification_option(a, args.value());
      else if (a == "--samples") samples = args.number<std::size_t>(1);
      else if (a == "--seed") seed = args.number<std::uint64_t>();
      else {
        fmt::print(stderr, "distribution_check: error: unknown argument {}{}\n{}", a, specsample::io::did_you_mean(a, usage), usage);
        return 2;
      }
      given.push_back(a);
    }
    // Every option checked before a model loads, named as typed.
    specsample::gpt2::check_option_flags(pair.model);
    const auto first_given = [&](auto of) -> std::optional<std::string_view> {
      const auto it = std::find_if(given.begin(), given.end(), of);
      return it == given.end() ? std::nullopt : std::optional<std::string_view>(*it);
    };
    const auto checkpoint_option = [](std::string_view f) {
      return f == "--draft" || f == "--prompt" || f == "--eos" || f == "--threads" || f == "--draft-matmul" ||
             f == "--prompt-lookup" || specsample::gpt2::is_option_flag(f);
    };
    if (const auto f = first_given(checkpoint_option); f && !pair.target) {
      throw specsample::error(fmt::format("{} checks checkpoints: it needs --target DIR", *f));
    }
    const auto toy_option = [](std::string_view f) { return f == "--vocab" || f == "--similarity"; };
    if (const auto f = first_given(toy_option); f && pair.target) {
      throw specsample::error(fmt::format("{} describes the toy pair: drop it with --target", *f));
    }
    if (pair.target && !pair.draft) {
      throw specsample::error("--target needs --draft DIR, a checkpoint with its tokenizer");
    }
    if (pair.target && !pair.prompt) {
      throw specsample::error("--target needs --prompt TEXT, the context the sequences follow");
    }
    if (pair.ngram()) {
      if (pair.prompt_lookup > 0) {
        throw specsample::error("--prompt-lookup falls back to a draft model; --draft ngram drafts by prompt lookup alone");
      }
      static constexpr std::pair<std::string_view, std::string_view> model_settings[] = {  // generate's order
          {"--draft-temperature", "warps a draft model's logits"},
          {"--p-min", "stops drafting on a draft model's top probability"},
          {"--draft-matmul", "sets a draft model's matmuls"}};
      for (const auto& [flag, does] : model_settings) {
        if (std::find(given.begin(), given.end(), flag) != given.end()) {
          throw specsample::error(fmt::format("{} {}; --draft ngram has none", flag, does));
        }
      }
    }
    if (const std::string note = specsample::gpt2::oversubscription_note("--threads", pair.threads); !note.empty()) {
      fmt::print(stderr, "distribution_check: note: {}\n", note);
    }
    // The toy pair's and the test's own numbers, named as flags (the library names its functions).
    constexpr std::size_t table = specsample::toy::markov::max_table_entries;
    constexpr std::size_t max_vocab = [] {  // the toy pair's order-1 table: vocab × (vocab + 1) entries
      std::size_t v = 1;
      while ((v + 1) * (v + 2) <= table) ++v;
      return v;
    }();
    if (vocab > max_vocab) {
      throw specsample::error(fmt::format("--vocab must be at most {} (the toy pair's table holds at most 2^{} "
                                          "entries), got {}", max_vocab, std::countr_zero(table), vocab));
    }
    if (!(similarity >= 0.0 && similarity <= 1.0)) {
      throw specsample::error(fmt::format("--similarity must be in [0, 1], got {}", similarity));
    }
    if (params.max_new_tokens > specsample::testing::max_sequence_length) {  // (--length is >= 1)
      throw specsample::error(fmt::format("--length must be in 1..{}, got {}", specsample::testing::max_sequence_length,
                                          params.max_new_tokens));
    }
    if (draft_temperature) params = params.with_draft_temperature(*draft_temperature);  // the target's filters
    try {
      specsample::validate(params, std::numeric_limits<std::size_t>::max());
    } catch (const specsample::parameter_error& e) {  // the library names its fields; this names the flags
      static constexpr std::pair<std::string_view, std::string_view> set_by[] = {
          {"speculative_params.draft_length", "-k"},
          {"speculative_params.sampling.temperature", "--temperature"},
          {"speculative_params.sampling.top_k", "--top-k"},
          {"speculative_params.sampling.top_p", "--top-p"},
          {"speculative_params.sampling.min_p", "--min-p"},
          {"speculative_params.draft_min_probability", "--p-min"},
          {"speculative_params.draft_sampling.temperature", "--draft-temperature"}};
      for (const auto& [field, flag] : set_by) {
        if (e.field() == field) throw specsample::error(fmt::format("{}{}", flag, e.reason()));
      }
      throw;
    }
    // A one-hot draft distribution's top probability is always 1: --p-min would never stop a round
    // (checked after the values' domains, so a NaN --p-min is refused as such).
    if (std::find(given.begin(), given.end(), "--p-min") != given.end() && params.draft_warping().one_hot()) {
      throw specsample::error(specsample::io::p_min_with_one_hot_draft_message("--p-min"));
    }
    const auto& w = params.sampling;
    std::string filters;
    if (w.top_k > 0) filters += fmt::format(", top-k {}", w.top_k);
    if (w.top_p < 1.0f) filters += fmt::format(", top-p {}", w.top_p);
    if (w.min_p > 0.0f) filters += fmt::format(", min-p {}", w.min_p);
    std::string rule = specsample::verification_name(params.verify);
    if (broken) rule += ", BROKEN (resamples from p)";
    std::string drafting;
    if (draft_temperature) drafting += fmt::format(", draft at T = {}", *draft_temperature);
    if (params.draft_min_probability > 0.0f) drafting += fmt::format(", p-min {}", params.draft_min_probability);
    if (params.adaptive_draft_length) drafting += ", adaptive K";
    fmt::print("K = {}, T = {}{}{}, {} tokens, verifier: {}\n", params.draft_length, w.temperature, filters, drafting,
               params.max_new_tokens, rule);
    const auto run = [&](auto verifier) {
      if (pair.target) return check_checkpoints(pair, params, samples, seed, verifier);
      auto target = specsample::toy::markov::random(vocab, 1, seed, 0.8f);
      auto draft = specsample::toy::markov::similar_to(target, similarity, seed + 1, 0.8f);
      fmt::print("toy pair: vocab {}, draft similarity {}\n", vocab, similarity);
      const std::vector<specsample::token> toy_prompt{0};
      return check(draft, target, toy_prompt, params, samples, seed, 1e-3, verifier);
    };
    const auto run_broken = [&](auto rule) { return run(resampling_from_p<decltype(rule)>{rule}); };
    const bool ok = broken ? specsample::with_verifier(params, run_broken)
                           : run(specsample::testing::verifier_from_params{});
    return specsample::io::written("distribution_check", ok ? 0 : 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "distribution_check: error: {}\n", e.what());
    return 2;
  }
}
