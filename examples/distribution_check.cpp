// distribution_check: is speculative sampling exact for this draft/target pair?
//
// Enumerates the target's exact distribution over every sequence of L tokens, draws N speculative
// samples, and prints Pearson's X² statistic, its p-value and a verdict. Point `check` at your own
// models (anything satisfying specsample::language_model: its sequences of positive probability
// are enumerated, at most 1e6, so a large vocabulary needs a --top-k). Too few samples to test
// are refused with the count needed. `--broken` swaps in a verifier that resamples from p instead of the residual, to show
// what a failing verdict looks like.
//
// usage: distribution_check [--vocab V] [--length L] [-k K] [--temperature T] [--top-k N]
//                           [--similarity S] [--samples N] [--seed S] [--broken] [-h | --help]
constexpr const char* usage =
    "usage: distribution_check [--vocab V] [--length L] [-k K] [--temperature T] [--top-k N]\n"
    "                          [--similarity S] [--samples N] [--seed S] [--broken] [-h | --help]\n";

#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
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

// The reusable part: check any pair and print the verdict. Returns true when consistent.
template <class Draft, class Target, class Verifier>
bool check(Draft& draft, Target& target, const specsample::speculative_params& params, std::size_t samples,
           std::uint64_t seed, double alpha, Verifier verifier) {
  const std::vector<specsample::token> prompt{0};
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

}  // namespace

int main(int argc, char** argv) {
  std::size_t vocab = 4, samples = 100'000;
  double similarity = 0.4;
  std::uint64_t seed = 1;
  bool broken = false;
  specsample::speculative_params params;
  params.max_new_tokens = 4;
  params.draft_length = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      if (a == "--vocab") vocab = number<std::size_t>(i, argc, argv);
      else if (a == "--length") params.max_new_tokens = number<std::size_t>(i, argc, argv);
      else if (a == "-k") params.draft_length = number<std::size_t>(i, argc, argv);
      else if (a == "--temperature") params.sampling.temperature = number<float>(i, argc, argv);
      else if (a == "--top-k") params.sampling.top_k = number<int>(i, argc, argv);
      else if (a == "--similarity") similarity = number<double>(i, argc, argv);
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
    }
    auto target = specsample::toy::markov::random(vocab, 1, seed, 0.8f);
    auto draft = specsample::toy::markov::similar_to(target, similarity, seed + 1, 0.8f);
    fmt::print("toy pair: vocab {}, draft similarity {}, K = {}, T = {}, verifier: {}\n", vocab, similarity,
               params.draft_length, params.sampling.temperature, broken ? "BROKEN (resamples from p)" : "token-wise");
    const bool ok = broken ? check(draft, target, params, samples, seed, 1e-3, broken_verifier{})
                           : check(draft, target, params, samples, seed, 1e-3, specsample::tokenwise_verifier{});
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
