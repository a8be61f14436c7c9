#pragma once
// A toy model with the optional `append(t, n)` of the model concept: it records the n the loop
// asks for and returns the last n columns of the wrapped Markov model's logits (with `extra`, that
// many columns more than asked for: a model breaking its contract).

#include <specsample/models/toy/markov.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace specsample::test {

struct last_columns_model {
  toy::markov inner;
  std::vector<std::size_t> asked;
  Eigen::Index extra = 0;
  std::size_t vocab_size() const { return inner.vocab_size(); }
  std::size_t size() const { return inner.size(); }
  Eigen::MatrixXf append(std::span<const token> t) { return append(t, t.size()); }
  Eigen::MatrixXf append(std::span<const token> t, std::size_t n) {
    asked.push_back(n);
    const Eigen::MatrixXf all = inner.append(t);
    return all.rightCols(std::min(all.cols(), static_cast<Eigen::Index>(n) + extra));
  }
  void truncate(std::size_t m) { inner.truncate(m); }
};

}  // namespace specsample::test
