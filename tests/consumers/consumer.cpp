// A downstream program: includes the umbrella header and runs one generation.
#include <specsample/specsample.hpp>

#include <cstdio>
#include <random>

int main() {
  auto target = specsample::toy::markov::random(6, 1, 1);
  auto draft = specsample::toy::markov::similar_to(target, 0.5, 2);
  specsample::speculative_params params;
  params.max_new_tokens = 16;
  std::mt19937_64 rng(1);
  const std::vector<specsample::token> prompt{0};
  const auto r = specsample::speculative_sample(draft, target, prompt, params, rng);
  std::printf("consumer generated %zu tokens\n", r.tokens.size());
  return r.tokens.size() == 16 ? 0 : 1;
}
