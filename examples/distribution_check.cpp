// distribution_check: is speculative sampling exact for this draft/target pair?
//
// Enumerates the target's exact distribution over every sequence of L tokens, draws N speculative
// samples, and prints Pearson's X² statistic, its p-value and a verdict. By default the pair is a
// toy one (random order-1 Markov models); --target and --draft check two GPT-2 checkpoints, e.g.
// your own, after --prompt. In code, point `check` at any models satisfying
// specsample::language_model. Only the sequences of positive probability are enumerated, at most
// 1e6, so a large vocabulary needs a --top-k (--top-k 3 --length 4: at most 81 sequences, one
// model call per prefix). Too few samples to test are refused with the count needed. `--broken`
// swaps in a verifier that resamples from p instead of the residual, to show what a failing
// verdict looks like.
//
// usage: distribution_check [--vocab V] [--similarity S] [--length L] [-k K] [--temperature T]
//                           [--top-k N] [--verify tokenwise|block] [--samples N] [--seed S] [--broken]
//        distribution_check --target DIR --draft DIR --prompt TEXT [--threads N] [the options above
//                           but --vocab and --similarity]
constexpr const char* usage =
    "usage: distribution_check [--vocab V] [--similarity S] [--length L] [-k K] [--temperature T]\n"
    "                          [--top-k N] [--verify tokenwise|block] [--samples N] [--seed S] [--broken]\n"
    "       distribution_check --target DIR --draft DIR --prompt TEXT [--threads N] [the options above\n"
    "                          but --vocab and --similarity]\n"
    "  --vocab V, --similarity S   the toy pair: V tokens (default 4), a draft this close to the target\n"
    "                              (0: independent, 1: the same; default 0.4)\n"
    "  --target DIR, --draft DIR   two GPT-2 checkpoints with the same tokenizer, checked after --prompt\n"
    "                              (stopping at the target's EOS, as generation does); --threads N\n"
    "                              kernel threads (default 1)\n"
    "  --length L                  tokens per sequence (default 4)\n"
    "  -k K                        draft length (default 3)\n"
    "  --temperature T, --top-k N  the warping (default 1, none); a large vocabulary needs a top-k\n"
    "  --verify tokenwise|block    the verification rule (default tokenwise)\n"
    "  --samples N, --seed S       speculative samples drawn (default 100000), their seed (default 1)\n"
    "  --broken                    a verifier that resamples from p instead of the residual: must FAIL\n";

#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>
#include <specsample/tokenizer.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace {

// On rejection draws from p instead of norm(max(0, p - q)): a classic mistake.
struct broken_verifier {
  template <class Rng>
  specsample::verify_result operator()(std::span<const specsample::token> drafts,
                                       const Eigen::Ref<const Eigen::MatrixXf>& q,
                                       const Eigen::Ref<const Eigen::MatrixXf>& p, Rng& rng) const {
    const auto k = static_cast<Eigen::Index>(drafts.size());
    for (Eigen::Index i = 0; i < k; ++i) {
      const auto x = drafts[static_cast<std::size_t>(i)];
      if (p(x, i) >= q(x, i) || specsample::uniform_01(rng) < double(p(x, i)) / double(q(x, i))) continue;
      return {static_cast<std::size_t>(i), specsample::sample_categorical(p.col(i), rng), false};
    }
    return {static_cast<std::size_t>(k), specsample::sample_categorical(p.col(k), rng), true};
  }
};

// The reusable part: check any pair after `prompt` and print the verdict. Returns true when
// consistent.
template <class Draft, class Target, class Verifier>
bool check(Draft& draft, Target& target, std::span<const specsample::token> prompt,
           const specsample::speculative_params& params, std::size_t samples, std::uint64_t seed, double alpha,
           Verifier verifier) {
  std::mt19937_64 rng(seed);
  const auto fit = specsample::testing::speculative_fit(draft, target, prompt, params, samples, rng, verifier);
  fmt::print("samples: {}, sequence length: {}, bins: {} (sequences of expected count >= 5, and one of the rest)\n",
             samples, params.max_new_tokens, fit.bins);
  fmt::print("X2 = {:.2f}, degrees of freedom = {}, p-value = {:.4g}, impossible samples = {}\n", fit.statistic,
             fit.dof, fit.p_value, fit.impossible);
  const bool ok = fit.p_value > alpha;
  fmt::print("verdict: {} (alpha = {})\n",
             ok ? "PASS, consistent with the target's exact distribution" : "FAIL, not the target's distribution",
             alpha);
  return ok;
}

// The value after flag argv[i] as a T; a missing value, a value that is not a T or one out of T's
// range (a negative count, --top-k 1e10) ends the program with a message.
template <class T>
T number(int& i, int argc, char** argv) {
  const std::string_view flag = argv[i];
  if (i + 1 >= argc) {
    fmt::print(stderr, "distribution_check: error: {} needs a value\n", flag);
    std::exit(2);
  }
  const std::string_view text = argv[++i];
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range && end == text.data() + text.size()) {
    if constexpr (std::is_floating_point_v<T>) {  // too large, or too small but not 0
      fmt::print(stderr, "distribution_check: error: {} expects a number of magnitude {} to {}, or 0, got '{}'\n",
                 flag, std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), text);
    } else {
      fmt::print(stderr, "distribution_check: error: {} expects a number from {} to {}, got '{}'\n", flag,
                 std::numeric_limits<T>::lowest(), std::numeric_limits<T>::max(), text);
    }
    std::exit(2);
  }
  if (ec != std::errc{} || end != text.data() + text.size()) {
    fmt::print(stderr, "distribution_check: error: {} expects {}, got '{}'\n", flag,
               std::is_floating_point_v<T> ? "a number" : std::is_signed_v<T> ? "an integer" : "an integer >= 0", text);
    std::exit(2);
  }
  return value;
}

// Loads two GPT-2 checkpoints with the same tokenizer on one pool of `threads` kernel threads and
// checks them after `prompt_text`, stopping at the target's EOS as generation does.
template <class Verifier>
bool check_checkpoints(const std::filesystem::path& target_dir, const std::filesystem::path& draft_dir,
                       const std::string& prompt_text, std::size_t threads, specsample::speculative_params params,
                       std::size_t samples, std::uint64_t seed, Verifier verifier) {
  const auto tok = specsample::bpe_tokenizer::load(target_dir);
  if (const auto diff = specsample::vocabulary_difference(specsample::bpe_tokenizer::load(draft_dir), tok)) {
    throw specsample::error(fmt::format("the draft ({}) and target ({}) tokenizers differ: {}; speculative sampling "
                                        "needs identical vocabularies",
                                        draft_dir.string(), target_dir.string(), *diff));
  }
  specsample::gpt2::options opts;
  opts.pool = std::make_shared<specsample::gpt2::thread_pool>(threads);
  auto target = specsample::gpt2::model::load(target_dir, opts);
  auto draft = specsample::gpt2::model::load(draft_dir, opts);
  if (target.vocab_size() != tok.vocab_size()) {
    throw specsample::error(fmt::format("{}: the model has {} tokens but its tokenizer has {}", target_dir.string(),
                                        target.vocab_size(), tok.vocab_size()));
  }
  const std::vector<specsample::token> prompt = tok.encode(prompt_text);
  if (prompt.empty()) throw specsample::error("--prompt encodes to no tokens");
  params.eos = target.config().eos_token_id;
  fmt::print("checkpoints: target {} ({} layers), draft {} ({} layers), vocab {}, prompt of {} tokens, EOS {}\n",
             target_dir.string(), target.config().n_layer, draft_dir.string(), draft.config().n_layer,
             tok.vocab_size(), prompt.size(), params.eos ? fmt::format("token {}", *params.eos) : "none");
  return check(draft, target, prompt, params, samples, seed, 1e-3, verifier);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t vocab = 4, samples = 100'000, threads = 1;
  double similarity = 0.4;
  std::uint64_t seed = 1;
  bool broken = false;
  std::optional<std::filesystem::path> target_dir, draft_dir;
  std::optional<std::string> prompt;
  std::vector<std::string_view> toy_flags, checkpoint_flags;  // given, of one pair's options only
  specsample::speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      const auto text = [&] {
        if (i + 1 >= argc) {
          fmt::print(stderr, "distribution_check: error: {} needs a value\n", a);
          std::exit(2);
        }
        return std::string(argv[++i]);
      };
      if (a == "--vocab") vocab = number<std::size_t>(i, argc, argv);
      else if (a == "--similarity") similarity = number<double>(i, argc, argv);
      else if (a == "--target") target_dir = text();
      else if (a == "--draft") draft_dir = text();
      else if (a == "--prompt") prompt = text();
      else if (a == "--threads") threads = number<std::size_t>(i, argc, argv);
      else if (a == "--length") params.max_new_tokens = number<std::size_t>(i, argc, argv);
      else if (a == "-k") params.draft_length = number<std::size_t>(i, argc, argv);
      else if (a == "--temperature") params.sampling.temperature = number<float>(i, argc, argv);
      else if (a == "--top-k") params.sampling.top_k = number<int>(i, argc, argv);
      else if (a == "--verify") params.verify = specsample::verification_option(a, text());
      else if (a == "--samples") samples = number<std::size_t>(i, argc, argv);
      else if (a == "--seed") seed = number<std::uint64_t>(i, argc, argv);
      else if (a == "--broken") broken = true;
      else if (a == "--help" || a == "-h") {
        fmt::print("{}", usage);
        return 0;
      } else {
        fmt::print(stderr, "distribution_check: error: unknown argument {}\n{}", a, usage);
        return 2;
      }
      if (a == "--vocab" || a == "--similarity") toy_flags.push_back(a);
      if (a == "--draft" || a == "--prompt" || a == "--threads") checkpoint_flags.push_back(a);
    }
    if (!target_dir && !checkpoint_flags.empty()) {
      throw specsample::error(fmt::format("{} checks checkpoints: it needs --target DIR", checkpoint_flags.front()));
    }
    if (target_dir && !toy_flags.empty()) {
      throw specsample::error(fmt::format("{} describes the toy pair: drop it with --target", toy_flags.front()));
    }
    if (target_dir && !draft_dir) throw specsample::error("--target needs --draft DIR, a checkpoint with its tokenizer");
    if (target_dir && !prompt) throw specsample::error("--target needs --prompt TEXT, the context the sequences follow");
    if (threads > specsample::gpt2::thread_pool::max_threads) {
      throw specsample::error(fmt::format("--threads must be at most {} (0: all cores), got {}",
                                          specsample::gpt2::thread_pool::max_threads, threads));
    }
    if (broken && params.verify != specsample::verification::token_wise) {
      throw specsample::error("--broken replaces the token-wise verifier: drop --verify block");
    }
    const std::string_view rule = broken ? "BROKEN (resamples from p)" : specsample::verification_name(params.verify);
    fmt::print("K = {}, T = {}, top-k {}, verifier: {}\n", params.draft_length, params.sampling.temperature,
               params.sampling.top_k, rule);
    const auto run = [&](auto verifier) {
      if (target_dir) {
        return check_checkpoints(*target_dir, *draft_dir, *prompt, threads, params, samples, seed, verifier);
      }
      auto target = specsample::toy::markov::random(vocab, 1, seed, 0.8f);
      auto draft = specsample::toy::markov::similar_to(target, similarity, seed + 1, 0.8f);
      fmt::print("toy pair: vocab {}, draft similarity {}\n", vocab, similarity);
      const std::vector<specsample::token> toy_prompt{0};
      return check(draft, target, toy_prompt, params, samples, seed, 1e-3, verifier);
    };
    const bool ok = broken ? run(broken_verifier{}) : run(specsample::testing::verifier_from_params{});
    // A verdict that could not be written (a full disk, a closed descriptor) is no verdict.
    const bool flush_failed = std::fflush(stdout) != 0;  // (errno names a failure of this flush only)
    if (flush_failed || std::ferror(stdout) != 0) {
      fmt::print(stderr, "distribution_check: error: cannot write to standard output{}\n",
                 flush_failed ? fmt::format(": {}", std::strerror(errno)) : std::string());
      return 2;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "distribution_check: error: {}\n", e.what());
    return 2;
  }
}
