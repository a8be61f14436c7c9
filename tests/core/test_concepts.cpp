// Compile-time tests of the language_model concept: conforming models, and one-defect
// archetypes that must not satisfy it.

#include <specsample/specsample.hpp>

#include <catch2/catch.hpp>

#include <functional>

using namespace specsample;

namespace {

struct minimal_model {  // append returns Eigen::MatrixXf by value: the simplest conforming model
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct map_model {  // returns a view of an internal buffer, as a zero-allocation model would
  Eigen::MatrixXf buffer;
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  Eigen::Map<const Eigen::MatrixXf> append(std::span<const token>) { return {buffer.data(), 2, 0}; }
  void truncate(std::size_t) {}
};

struct missing_truncate_model {
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
};

struct missing_size_model {
  std::size_t vocab_size() const { return 2; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct missing_vocab_size_model {
  std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct missing_append_model {
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  void truncate(std::size_t) {}
};

struct non_const_size_model {  // size() must be callable on a const model
  std::size_t vocab_size() const { return 2; }
  std::size_t size() { return 0; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct non_const_vocab_model {  // vocab_size() must be callable on a const model
  std::size_t vocab_size() { return 2; }
  std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct vector_logits_model {  // logits in a std::vector are not convertible to Eigen::MatrixXf
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  std::vector<float> append(std::span<const token>) { return {}; }
  void truncate(std::size_t) {}
};

struct wrong_token_type_model {  // append must take span<const token>
  std::size_t vocab_size() const { return 2; }
  std::size_t size() const { return 0; }
  Eigen::MatrixXf append(std::span<const std::string>) { return {}; }
  void truncate(std::size_t) {}
};

}  // namespace

static_assert(language_model<minimal_model>);
static_assert(language_model<map_model>);
static_assert(language_model<toy::markov>);
static_assert(language_model<toy::callable_model<std::function<Eigen::VectorXf(std::span<const token>)>>>);
static_assert(!language_model<missing_truncate_model>);
static_assert(!language_model<missing_size_model>);
static_assert(!language_model<non_const_vocab_model>);
static_assert(!language_model<missing_vocab_size_model>);
static_assert(!language_model<missing_append_model>);
static_assert(!language_model<non_const_size_model>);
// Each of those three fails for its one defect only.
static_assert(!detail::has_vocab_size<missing_vocab_size_model> && detail::has_context_size<missing_vocab_size_model> &&
              detail::has_append<missing_vocab_size_model> && detail::has_truncate<missing_vocab_size_model>);
static_assert(detail::has_vocab_size<missing_append_model> && detail::has_context_size<missing_append_model> &&
              !detail::has_append<missing_append_model> && detail::has_truncate<missing_append_model>);
static_assert(detail::has_vocab_size<non_const_size_model> && !detail::has_context_size<non_const_size_model> &&
              detail::has_append<non_const_size_model> && detail::has_truncate<non_const_size_model>);
static_assert(!language_model<vector_logits_model>);
static_assert(!language_model<wrong_token_type_model>);
static_assert(!language_model<int>);

TEST_CASE("max_context reports max_size() when a model has one, else no limit", "[concepts]") {
  struct bounded : minimal_model {
    std::size_t max_size() const { return 7; }
  };
  CHECK(max_context(bounded{}) == 7);
  CHECK(max_context(minimal_model{}) == std::numeric_limits<std::size_t>::max());
}
