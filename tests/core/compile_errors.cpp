// What a user's compiler says for each mistake `speculative_sample` and `autoregressive_sample`
// diagnose with a sentence of their own (tests/core/CMakeLists.txt compiles this file once per
// SPECSAMPLE_COMPILE_ERROR_CASE, -fsyntax-only, and matches the sentence). Case 0 is every call
// written correctly: it must compile, so each other case fails for its one mistake.
#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/loop.hpp>

#include <Eigen/Core>

#include <cstddef>
#include <random>
#include <span>
#include <vector>

namespace {

using specsample::token;

// A model: V = 4, uniform logits, a token list for a context.
struct model {
  std::vector<token> context;
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  [[nodiscard]] std::size_t size() const { return context.size(); }
  Eigen::MatrixXf append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(t.size()));
  }
  void truncate(std::size_t n) { context.resize(n); }
};

// The same, its logits in double: convertible to Eigen::MatrixXf by declaration only.
struct double_logits_model : model {
  Eigen::MatrixXd append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return Eigen::MatrixXd::Zero(4, static_cast<Eigen::Index>(t.size()));
  }
};

// The same, its logits an Eigen array: convertible to Eigen::MatrixXf by declaration only.
struct array_logits_model : model {
  Eigen::ArrayXXf append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return Eigen::ArrayXXf::Zero(4, static_cast<Eigen::Index>(t.size()));
  }
};

// The same, its logits of a class derived from Eigen::MatrixXd.
struct double_matrix : Eigen::MatrixXd {
  using Eigen::MatrixXd::MatrixXd;
};
struct derived_double_logits_model : model {
  double_matrix append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return double_matrix(Eigen::MatrixXd::Zero(4, static_cast<Eigen::Index>(t.size())));
  }
};

// A model whose logits are a class derived from Eigen::MatrixXf: fine.
struct float_matrix : Eigen::MatrixXf {
  using Eigen::MatrixXf::MatrixXf;
};
struct derived_float_logits_model : model {
  float_matrix append(std::span<const token> t) {
    context.insert(context.end(), t.begin(), t.end());
    return float_matrix(Eigen::MatrixXf::Zero(4, static_cast<Eigen::Index>(t.size())));
  }
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

// A drafter: proposes nothing.
struct drafter {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  void begin(std::span<const token>) {}
  template <class Rng>
  specsample::proposal propose(std::span<const token>, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>,
                               Rng&) {
    return {};
  }
  void sync(std::span<const token>) {}
};

// A drafter without sync.
struct syncless_drafter {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  void begin(std::span<const token>) {}
  template <class Rng>
  specsample::proposal propose(std::span<const token>, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>,
                               Rng&) {
    return {};
  }
};

// A drafter whose propose returns a count instead of a proposal.
struct counting_drafter {
  [[nodiscard]] std::size_t vocab_size() const { return 4; }
  void begin(std::span<const token>) {}
  template <class Rng>
  std::size_t propose(std::span<const token>, std::size_t, Eigen::Ref<Eigen::MatrixXf>, std::span<token>, Rng&) {
    return 0;
  }
  void sync(std::span<const token>) {}
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
  derived_float_logits_model derived;
  (void)specsample::speculative_sample(draft, derived, prompt, params, rng);
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
  double_logits_model bad;
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
  array_logits_model bad;
  (void)specsample::speculative_sample(draft, bad, prompt, params, rng);
#elif SPECSAMPLE_COMPILE_ERROR_CASE == 9  // a target whose logits derive from Eigen::MatrixXd
  derived_double_logits_model bad;
  (void)specsample::speculative_sample(draft, bad, prompt, params, rng);
#endif
  (void)draft;
  (void)target;
  (void)rng;
}
