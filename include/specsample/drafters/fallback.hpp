#pragma once
/// @file fallback.hpp
/// Two drafters in one: the first proposes where it can, the second where it does not — prompt
/// lookup (`drafters::ngram`) where the context repeats itself, a draft model elsewhere.

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/drafter.hpp>

#include <Eigen/Core>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <span>
#include <type_traits>
#include <utility>

namespace specsample::drafters {

/// Asks `First` for the round's drafts, and `Second` only when `First` proposes none. Each
/// proposal carries the distributions its own drafter drew it from, and which drafter proposes
/// depends on the context alone (never on the target's output), so sampling stays exact.
/// Both drafters see every `begin` and `sync`; a `model_drafter` second catches its model up on
/// the rounds it sat out in its next call (one forward call over the tokens it lacks). A round's
/// forward calls and seconds are those of both drafters.
///
/// ```cpp
/// drafters::fallback lookup_then_model(drafters::ngram(V, 4, 3), model_drafter(draft, params.draft_warping()));
/// auto out = speculative_sample(lookup_then_model, target, prompt, params, rng);
/// ```
///
/// On the bundled pair at temperature 0, prompt lookup (min_n = 3), else the distilled draft,
/// drafts more tokens per round than either alone and decodes faster; at temperature 0.7 and 1,
/// where lookup's one-hot drafts are rarely accepted, it is no faster than the draft model alone
/// (docs/benchmarks.md, "Strategy comparison").
template <drafter First, drafter Second>
class fallback {
 public:
  /// Whatever its two drafters write (detail::writes_distributions when both do).
  using writes_distributions = std::conditional_t<
      specsample::detail::writes_distributions<First> && specsample::detail::writes_distributions<Second>, fallback, void>;

  /// Throws `specsample::error` when the two vocabularies differ in size.
  fallback(First first, Second second) : first_(std::move(first)), second_(std::move(second)) {
    if (first_.vocab_size() != second_.vocab_size()) {
      throw error(fmt::format("drafters::fallback: the first drafter has a vocabulary of {} tokens, the second {}",
                              first_.vocab_size(), second_.vocab_size()));
    }
  }

  [[nodiscard]] std::size_t vocab_size() const { return first_.vocab_size(); }
  /// The shorter of the two drafters' contexts (`max_context`; unbounded for a model-free one).
  [[nodiscard]] std::size_t max_size() const { return std::min(max_context(first_), max_context(second_)); }

  void begin(std::span<const token> ctx) {
    first_.begin(ctx);
    second_.begin(ctx);
  }

  template <std::uniform_random_bit_generator Rng>
  proposal propose(std::span<const token> ctx, std::size_t k, Eigen::Ref<Eigen::MatrixXf> q, std::span<token> out,
                   Rng& rng) {
    const proposal first = first_.propose(ctx, k, q, out, rng);
    if (first.tokens > 0) {
      ++first_rounds_;
      return first;
    }
    proposal second = second_.propose(ctx, k, q, out, rng);
    if (second.tokens > 0) ++second_rounds_;
    second.forward_calls += first.forward_calls;
    second.forward_seconds += first.forward_seconds;
    return second;
  }

  void sync(std::span<const token> ctx) {
    first_.sync(ctx);
    second_.sync(ctx);
  }

  [[nodiscard]] First& first() noexcept { return first_; }
  [[nodiscard]] Second& second() noexcept { return second_; }
  /// Rounds whose drafts came from the first drafter, and from the second, since construction.
  [[nodiscard]] std::size_t first_rounds() const noexcept { return first_rounds_; }
  [[nodiscard]] std::size_t second_rounds() const noexcept { return second_rounds_; }

 private:
  First first_;
  Second second_;
  std::size_t first_rounds_ = 0, second_rounds_ = 0;
};

template <class First, class Second>
fallback(First, Second) -> fallback<First, Second>;

}  // namespace specsample::drafters
