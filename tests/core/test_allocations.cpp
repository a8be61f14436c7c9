// The loop allocates its buffers once per call and nothing per round: counting every malloc of
// this executable proves it, with a model that itself never allocates in append. The link wraps
// malloc/calloc/realloc (-Wl,--wrap), which also catches Eigen's allocations (they bypass
// operator new); operator new is routed through the wrapped malloc.

#include <specsample/specsample.hpp>

#include <catch2/catch.hpp>

#include "../support/counting_allocator.hpp"

#include <atomic>
#include <cstdlib>
#include <limits>
#include <new>
#include <memory>
#include <random>

using specsample::test::allocation_count;

namespace {

using specsample::token;

// A Markov model that writes logits into a preallocated buffer and returns a view of it.
class buffered_markov {
 public:
  // `limit`: the longest context it holds (its max_size()); 0 for none, then 4096 tokens are reserved.
  buffered_markov(specsample::toy::markov m, std::size_t max_batch, std::size_t limit = 0)
      : m_(std::move(m)), log_(m_.transitions().array().log().matrix()),
        buffer_(log_.rows(), static_cast<Eigen::Index>(max_batch)), limit_(limit) {
    context_.reserve(limit > 0 ? limit : 4096);
  }
  std::size_t vocab_size() const { return m_.vocab_size(); }
  std::size_t max_size() const { return limit_ > 0 ? limit_ : std::numeric_limits<std::size_t>::max(); }
  std::size_t size() const { return context_.size(); }
  Eigen::Map<const Eigen::MatrixXf> append(std::span<const token> t) {
    for (std::size_t j = 0; j < t.size(); ++j) {
      context_.push_back(t[j]);
      const auto state = static_cast<Eigen::Index>(t[j]);  // order 1, context never empty here
      buffer_.col(static_cast<Eigen::Index>(j)) = log_.col(state);
    }
    return {buffer_.data(), buffer_.rows(), static_cast<Eigen::Index>(t.size())};
  }
  void truncate(std::size_t n) { context_.resize(n); }

 private:
  specsample::toy::markov m_;
  Eigen::MatrixXf log_;
  Eigen::MatrixXf buffer_;
  std::size_t limit_;
  std::vector<token> context_;
};

}  // namespace

TEST_CASE("the allocation counter sees std, Eigen and aligned allocations", "[allocations]") {
  const auto seen = specsample::test::check_the_counter();
  CHECK(seen.std_and_eigen >= 3);
  CHECK(seen.aligned == 2);
}

TEST_CASE("the speculative loop allocates nothing per round in the steady state", "[loop][allocations]") {
  auto base = specsample::toy::markov::random(64, 1, 3);
  buffered_markov target(base, 4096);
  buffered_markov draft(specsample::toy::markov::similar_to(base, 0.6, 4), 4096);
  std::vector<token> prompt(10, 1);
  // Greedy, sampled with filters, and sampled with each round-shaping option: block verification,
  // the adaptive draft length, p_min, the draft's own warping.
  struct cell {
    const char* name;
    float temperature;
    specsample::verification verify = specsample::verification::token_wise;
    bool adaptive = false;
    float p_min = 0.0f;
    bool draft_warping = false;
  };
  for (const cell c : {cell{"greedy", 0.0f}, cell{"sampled", 0.8f},
                       cell{"block", 0.8f, specsample::verification::block},
                       cell{"adaptive K", 0.8f, specsample::verification::token_wise, true},
                       cell{"block, adaptive K, p_min, draft at 1.2 T", 0.8f, specsample::verification::block, true,
                            0.2f, true}}) {
    specsample::speculative_params params;
    params.max_new_tokens = 500;
    params.draft_length = 4;
    params.sampling.temperature = c.temperature;
    params.sampling.top_k = c.temperature > 0 ? 20 : 0;
    params.sampling.top_p = c.temperature > 0 ? 0.9f : 1.0f;
    params.verify = c.verify;
    params.adaptive_draft_length = c.adaptive;
    params.draft_min_probability = c.p_min;
    if (c.draft_warping) params.draft_sampling = specsample::sampling_params{.temperature = 1.2f * c.temperature};
    std::mt19937_64 rng(1);
    std::size_t at_round_1 = 0, at_last = 0, rounds = 0;
    const auto r = specsample::speculative_sample(draft, target, prompt, params, rng,
                                                  [&](const specsample::round_event& e) {
                                                    if (e.round == 1) at_round_1 = allocation_count();
                                                    at_last = allocation_count();
                                                    ++rounds;
                                                  });
    REQUIRE(r.tokens.size() == 500);
    REQUIRE(rounds > 100);
    INFO(c.name << ": " << (at_last - at_round_1) << " allocations over " << rounds - 2 << " rounds");
    CHECK(at_last == at_round_1);
  }
}

TEST_CASE("a warper with top-k or top-p allocates nothing per column, sparse candidate sets or dense ones",
          "[warp][allocations]") {
  // V = 50257: logits N(0, 0.5^2) put most tokens in top-p 0.95's set (the branch-free collection
  // and the bins of the selection by mass), N(0, 3^2) few (the vector search); top-k 50 on both.
  constexpr std::size_t V = 50257;
  std::mt19937 rng(3);
  for (const float sigma : {0.5f, 3.0f}) {
    std::normal_distribution<float> normal(0.0f, sigma);
    Eigen::VectorXf logits(static_cast<Eigen::Index>(V)), probs(static_cast<Eigen::Index>(V));
    for (Eigen::Index i = 0; i < logits.size(); ++i) logits(i) = normal(rng);
    for (const bool top_p : {true, false}) {
      specsample::sampling_params s;
      s.temperature = 1.0f;
      if (top_p) s.top_p = 0.95f;
      else s.top_k = 50;
      specsample::logit_warper warp(s, V);
      warp(logits, probs);  // (anything a first call sets up)
      const std::size_t before = allocation_count();
      for (int call = 0; call < 5; ++call) {
        logits(call) += 0.25f;  // a column of its own each time
        warp(logits, probs);
      }
      const std::size_t after = allocation_count();  // (before INFO, whose message allocates)
      INFO("sigma " << sigma << (top_p ? ", top-p 0.95: " : ", top-k 50: ") << after - before
                    << " allocations over 5 columns; kept " << (probs.array() > 0).count());
      CHECK(after == before);
      CHECK((probs.array() > 0).count() > (top_p && sigma < 1 ? 20000 : 10));
    }
  }
}

TEST_CASE("the loop allocates nothing per round for a generation longer than 65536 tokens in a bounded context",
          "[loop][allocations]") {
  // It reserved min(max_new_tokens, 65536) tokens whatever the context, so the context and the
  // result grew mid-generation past that (2 allocations for 100000 tokens in a context of 200000).
  auto base = specsample::toy::markov::random(16, 1, 5);
  constexpr std::size_t limit = 80000, max_new = 70000;
  buffered_markov target(base, 64, limit);
  buffered_markov draft(specsample::toy::markov::similar_to(base, 0.6, 6), 64, limit);
  std::vector<token> prompt(10, 1);
  specsample::speculative_params params;
  params.max_new_tokens = max_new;
  params.draft_length = 4;
  params.sampling.temperature = 1.0f;
  std::mt19937_64 rng(2);
  std::size_t at_round_1 = 0, at_last = 0;
  const auto r = specsample::speculative_sample(draft, target, prompt, params, rng, [&](const specsample::round_event& e) {
    if (e.round == 1) at_round_1 = allocation_count();
    at_last = allocation_count();
  });
  REQUIRE(r.tokens.size() == max_new);
  CHECK(at_last == at_round_1);
}
