// Bringing your own model: two ways to satisfy specsample::language_model.
//
// 1. A class with vocab_size(), size(), append(span) -> (V, n) logits, truncate(n). This one keeps
//    a per-position cache (the analogue of a KV cache) so truncate is O(1) and append only computes
//    the new positions: the shape a real transformer wrapper takes (see docs/models.md).
// 2. Any callable logits(context) wrapped by specsample::toy::callable_model.

#include <specsample/sampling.hpp>
#include <specsample/toy.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace {

// A "model" whose next-token logits depend on a running hash of the context: each position's
// state is cached, like keys and values of a transformer.
class hashing_model {
 public:
  explicit hashing_model(std::size_t vocab) : vocab_(vocab) {}

  std::size_t vocab_size() const { return vocab_; }
  std::size_t size() const { return states_.size(); }
  std::size_t max_size() const { return 1024; }  // optional: the loops check the context fits

  // What a model refuses, with a message naming the problem (docs/models.md): a token outside the
  // vocabulary and a context past max_size(), before anything changes.
  Eigen::MatrixXf append(std::span<const specsample::token> tokens) {
    for (const specsample::token x : tokens) {
      if (!specsample::in_vocabulary(x, vocab_)) {
        throw specsample::error(fmt::format("hashing_model: token {} is not in the vocabulary of {}", x, vocab_));
      }
    }
    if (tokens.size() > max_size() - states_.size()) {
      throw specsample::error(fmt::format("hashing_model: {} tokens after {} exceed the context of {}", tokens.size(),
                                          states_.size(), max_size()));
    }
    Eigen::MatrixXf logits(static_cast<Eigen::Index>(vocab_), static_cast<Eigen::Index>(tokens.size()));
    for (std::size_t j = 0; j < tokens.size(); ++j) {
      const std::uint64_t prev = states_.empty() ? 1469598103934665603ull : states_.back();
      const std::uint64_t state = (prev ^ static_cast<std::uint64_t>(tokens[j])) * 1099511628211ull;
      states_.push_back(state);  // the cache grows by one position per token
      for (std::size_t x = 0; x < vocab_; ++x) {
        logits(static_cast<Eigen::Index>(x), static_cast<Eigen::Index>(j)) =
            static_cast<float>(std::sin(static_cast<double>((state >> 7) % 1000) + 1.7 * static_cast<double>(x)));
      }
    }
    return logits;
  }

  void truncate(std::size_t n) {  // O(1) rollback: drop cached positions (never add any)
    if (n > states_.size()) {
      throw specsample::error(fmt::format("hashing_model: truncate({}) past the {} tokens held", n, states_.size()));
    }
    states_.resize(n);
  }

 private:
  std::size_t vocab_;
  std::vector<std::uint64_t> states_;
};

static_assert(specsample::language_model<hashing_model>);

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // nothing to configure: an argument is a mistake, not something to ignore
    std::fprintf(stderr, "usage: custom_model (takes no arguments, got '%s')\n", argv[1]);
    return 2;
  }
  hashing_model target(8);
  // A draft as a plain function of the context: prefers the token after the last one.
  auto draft = specsample::toy::callable_model(8, [](std::span<const specsample::token> ctx) {
    Eigen::VectorXf logits = Eigen::VectorXf::Zero(8);
    logits((ctx.back() + 1) % 8) = 1.0f;
    return logits;
  });

  specsample::speculative_params params;
  params.max_new_tokens = 24;
  params.draft_length = 3;
  params.sampling.temperature = 0.0f;
  const std::vector<specsample::token> prompt{1, 2, 3};
  std::mt19937 rng(7);
  const auto spec = specsample::speculative_sample(draft, target, prompt, params, rng);
  const auto ar = specsample::autoregressive_sample(target, prompt, params, rng);
  fmt::print("speculative:    {}\nautoregressive: {}\n", spec.tokens, ar.tokens);
  fmt::print("acceptance rate {:.3f}, {:.2f} tokens per target call\n", spec.stats.acceptance_rate(),
             spec.stats.tokens_per_target_call());
  const bool same = spec.tokens == ar.tokens;
  fmt::print("identical at temperature 0: {}\n", same ? "yes" : "NO");
  // What the model refuses (the loops never ask it; a caller's bug could), the model unchanged.
  const auto attempt = [](auto&& call) {
    try {
      call();
      return std::string("accepted");
    } catch (const specsample::error& e) {
      return fmt::format("refused ({})", e.what());
    }
  };
  target.truncate(0);
  (void)target.append(prompt);
  fmt::print("truncate past the context: {}\n", attempt([&] { target.truncate(target.size() + 1); }));
  const std::vector<specsample::token> outside{8};
  fmt::print("a token outside the vocabulary: {}\n", attempt([&] { (void)target.append(outside); }));
  return same ? 0 : 1;
}
