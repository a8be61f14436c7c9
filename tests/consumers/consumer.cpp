// A downstream program: includes the umbrella header and runs one generation with toy models.
// Built with CONSUMER_RUNS_GPT2 it also takes a GPT-2 checkpoint directory and runs one greedy
// generation on that model drafting for itself, which calls into the GPT-2 kernels.
#include <specsample/specsample.hpp>

#include <cstdio>
#include <random>

int main(int argc, char** argv) {
  auto target = specsample::toy::markov::random(6, 1, 1);
  auto draft = specsample::toy::markov::similar_to(target, 0.5, 2);
  specsample::speculative_params params;
  params.max_new_tokens = 16;
  std::mt19937_64 rng(1);
  const std::vector<specsample::token> prompt{0};
  const auto r = specsample::speculative_sample(draft, target, prompt, params, rng);
  std::printf("consumer generated %zu tokens\n", r.tokens.size());
  if (r.tokens.size() != 16) return 1;
#ifdef CONSUMER_RUNS_GPT2
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer GPT2_CHECKPOINT_DIR\n");
    return 1;
  }
  try {
    auto gpt2_target = specsample::gpt2::model::load(argv[1]);
    auto gpt2_draft = specsample::gpt2::model::load(argv[1]);
    params.sampling.temperature = 0.0f;
    const auto g = specsample::speculative_sample(gpt2_draft, gpt2_target, prompt, params, rng);
    const bool all = g.stats.accepted == g.stats.drafted;  // greedy, and the draft is the target
    std::printf("consumer ran the GPT-2 model: %zu tokens, every draft accepted: %s\n", g.tokens.size(),
                all ? "yes" : "no");
    return g.tokens.size() == 16 && all ? 0 : 1;
  } catch (const specsample::error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
#else
  (void)argc;
  (void)argv;
  return 0;
#endif
}
