// What a user's compiler says for each mistake `speculative_sample` and `autoregressive_sample`
// diagnose with a sentence of their own (tests/core/CMakeLists.txt compiles this file once per
// SPECSAMPLE_COMPILE_ERROR_CASE, -fsyntax-only, and matches the sentence). Case 0 is every call
// written correctly: it must compile, so each other case fails for its one mistake.
#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/loop.hpp>

#include <Eigen/Core>

#include <chrono>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

namespace {

using specsample::token;

// A model: V = 4, uniform logits of type Logits, a token list for a context.
template <class Logits = Eigen::MatrixXf>
struct logits_model {
  std::vector<token> context;
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  [[nodiscard]] std::size_t size() const { return context.size(); }
  Logits append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return Logits(Logits::Zero(4, static_cast<Eigen::Index>(t.size())));
  }
  void truncate(std::size_t n) { context.resize(n); }
};
using model = logits_model<>;

// Classes derived from Eigen matrices (of float: fine; of double: convertible to Eigen::MatrixXf by
// declaration only, as Eigen::MatrixXd and Eigen::ArrayXXf are).
struct float_matrix : Eigen::MatrixXf {
  using Eigen::MatrixXf::MatrixXf;
};
struct double_matrix : Eigen::MatrixXd {
  using Eigen::MatrixXd::MatrixXd;
};

// A model without size().
struct sizeless_model {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  Eigen::MatrixXf append(std::span<const token> t) { return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(t.size())); }
  void truncate(std::size_t) {}
};

// A model without truncate.
struct untruncatable_model {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  [[nodiscard]] std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const token> t) { return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(t.size())); }
};

// A model that times its calls on a clock of its own (docs/models.md, item 7).
struct clocked_model : model {
  using clock = std::chrono::system_clock;
};

// Another model on that clock.
struct other_clocked_model : model {
  using clock = std::chrono::system_clock;
};

// A drafter without sync: proposes nothing.
struct syncless_drafter {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  void begin(std::span<const token>) {}
  template <class Rng>
  specsample::proposal propose(std::span<const token>, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>,
                               Rng&) {
    return {};
  }
};

// A drafter.
struct drafter : syncless_drafter {
  void sync(std::span<const token>) {}
};

// A drafter whose propose returns a count instead of a proposal.
struct counting_drafter : drafter {
  template <class Rng>
  std::size_t propose(std::span<const token>, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>, Rng&) {
    return 0;
  }
};

}  // namespace

int main() {
  const std::vector<token> prompt{0};
  specsample::speculative_params params;
  params.max_new_tokens = 4;
  std::mt19937_64 rng(1);
  model draft, target;
#if SPECSAMPLE_COMPILE_ERROR_CASE == 0  // every call right
  drafter d;
  auto lookup = specsample::drafters::ngram(4);
  (void)specsample::speculative_sample(draft, target, prompt, params, rng);
  (void)specsample::speculative_sample(d, target, prompt, params, rng);
  (void)specsample::speculative_sample(lookup, target, prompt, params, rng);
  (void)specsample::autoregressive_sample(target, prompt, params, rng);
  logits_model<float_matrix> derived;
  (void)specsample::speculative_sample(draft, derived, prompt, params, rng);
  (void)specsample::speculative_sample(draft, target, std::vector<token>{0}, params, rng);  // a temporary prompt
  const token ids[] = {0, 1};
  (void)specsample::autoregressive_sample(target, ids, params, rng);
  clocked_model timed_draft, timed_target;
  (void)specsample::speculative_sample(timed_draft, timed_target, prompt, params, rng);  // one clock
  (void)specsample::speculative_sample(lookup, timed_target, prompt, params, rng);
  specsample::drafters::fallback timed_fallback(specsample::drafters::ngram(4),
                                                specsample::model_drafter(timed_draft, params.draft_warping()));
  (void)specsample::speculative_sample(timed_fallback, timed_target, prompt, params, rng);  // one clock
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 1  // a drafter without sync
  syncless_drafter d;
  (void)specsample::speculative_sample(d, target, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 2  // a drafter's propose returning a count
  counting_drafter d;
  (void)specsample::speculative_sample(d, target, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 3  // a good drafter, a target without truncate
  auto lookup = specsample::drafters::ngram(4);
  untruncatable_model bad;
  (void)specsample::speculative_sample(lookup, bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 4  // a target whose logits are double
  logits_model<Eigen::MatrixXd> bad;
  (void)specsample::speculative_sample(draft, bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 5  // autoregressive sampling from a model without size()
  sizeless_model bad;
  (void)specsample::autoregressive_sample(bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 6  // a const target
  const model& fixed = target;
  (void)specsample::speculative_sample(draft, fixed, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 7  // a const random generator
  const std::mt19937_64 fixed(1);
  (void)specsample::autoregressive_sample(target, prompt, params, fixed);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 8  // a target whose logits are an Eigen array
  logits_model<Eigen::ArrayXXf> bad;
  (void)specsample::speculative_sample(draft, bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 9  // a target whose logits derive from Eigen::MatrixXd
  logits_model<double_matrix> bad;
  (void)specsample::speculative_sample(draft, bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 10  // a prompt of other ids than specsample::token
  const std::vector<long> ids{0};
  (void)specsample::speculative_sample(draft, target, ids, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 11  // a generator passed as a temporary
  (void)specsample::speculative_sample(draft, target, prompt, params, std::mt19937_64(1));
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 12  // a braced list as the prompt
  (void)specsample::speculative_sample(draft, target, {0, 1}, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 13  // autoregressive sampling with a generator passed as a temporary
  (void)specsample::autoregressive_sample(target, prompt, params, std::mt19937_64(1));
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 14  // a draft model and a target on different clocks
  clocked_model timed;
  (void)specsample::speculative_sample(draft, timed, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 15  // the same, the draft model behind prompt lookup
  clocked_model timed;
  specsample::drafters::fallback lookup_then_model(specsample::drafters::ngram(4),
                                                   specsample::model_drafter(draft, params.draft_warping()));
  (void)specsample::speculative_sample(lookup_then_model, timed, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 16  // two draft models of one clock, the target on another: one diagnostic
  clocked_model first;
  other_clocked_model second;
  specsample::drafters::fallback both(specsample::model_drafter(first, params.draft_warping()),
                                      specsample::model_drafter(second, params.draft_warping()));
  (void)specsample::speculative_sample(both, target, prompt, params, rng);
#endif
  (void)draft;
  (void)target;
  (void)rng;
}
