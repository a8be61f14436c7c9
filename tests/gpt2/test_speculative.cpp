// Speculative sampling end to end on the bundled GPT-2 pair.

#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>
#include <specsample/tokenizer.hpp>

#include <catch2/catch.hpp>

#include "../support/sanitizer.hpp"

#include <filesystem>
#include <random>

namespace {
const std::filesystem::path models = std::filesystem::path(SPECSAMPLE_SOURCE_DIR) / "models";
}

TEST_CASE("speculative sampling on the bundled pair at temperature 0 equals autoregressive token for token",
          "[gpt2][speculative][greedy]") {
  const auto tok = specsample::bpe_tokenizer::load(models / "shakespeare-target");
  auto target = specsample::gpt2::model::load(models / "shakespeare-target", {.threads = 1});
  auto draft = specsample::gpt2::model::load(models / "shakespeare-draft", {.threads = 1});
  auto distilled = specsample::gpt2::model::load(models / "shakespeare-draft-distilled", {.threads = 1});
  const std::vector<const char*> texts = specsample::test::sanitized
                                             ? std::vector<const char*>{"ROMEO:\nBut soft, what light"}
                                             : std::vector<const char*>{"ROMEO:\nBut soft, what light", "KING HENRY:\n",
                                                                        "First Citizen:\nWe are accounted poor"};
  for (const char* text : texts) {
    const auto prompt = tok.encode(text);
    specsample::speculative_params params;
    params.max_new_tokens = specsample::test::sanitized ? 24 : 40;
    params.sampling.temperature = 0.0f;
    std::mt19937_64 rng(1);
    const auto reference = specsample::autoregressive_sample(target, prompt, params, rng).tokens;
    for (const std::size_t k : specsample::test::sanitized ? std::vector<std::size_t>{1, 8}
                                                           : std::vector<std::size_t>{1, 2, 4, 8}) {
      params.draft_length = k;
      INFO("prompt '" << text << "', K = " << k);
      const auto plain = specsample::speculative_sample(draft, target, prompt, params, rng);
      CHECK(plain.tokens == reference);
      CHECK(plain.stats.accepted > 0);
      const auto other = specsample::speculative_sample(distilled, target, prompt, params, rng);
      CHECK(other.tokens == reference);
    }
  }
}

TEST_CASE("sampled speculative generation on the bundled pair keeps its bookkeeping consistent",
          "[gpt2][speculative]") {
  auto target = specsample::gpt2::model::load(models / "shakespeare-target", {.threads = 1});
  auto draft = specsample::gpt2::model::load(models / "shakespeare-draft", {.threads = 1});
  const std::vector<specsample::token> prompt{10, 20, 30};
  specsample::speculative_params params;
  params.max_new_tokens = specsample::test::sanitized ? 20 : 60;
  params.draft_length = 5;
  params.sampling = {.temperature = 0.9f, .top_k = 50, .top_p = 0.95f};
  std::mt19937_64 rng(3);
  const auto r = specsample::speculative_sample(draft, target, prompt, params, rng);
  CHECK(r.tokens.size() == params.max_new_tokens);
  CHECK(r.stats.tokens == r.stats.accepted + r.stats.corrections + r.stats.bonus);
  CHECK(target.size() == prompt.size() + params.max_new_tokens - 1);
  CHECK(r.stats.tokens_per_target_call() > 1.0);
  // A generation that would overflow n_positions (256) is refused up front.
  params.max_new_tokens = 255;  // 3 + 255 - 1 = 257 > 256
  CHECK_THROWS_WITH(specsample::speculative_sample(draft, target, prompt, params, rng),
                    Catch::Matchers::Contains("context overflow"));
  // So is one past a smaller KV cache (options::context), the target's or the draft's.
  auto short_target = specsample::gpt2::model::load(models / "shakespeare-target", {.threads = 1, .context = 32});
  auto short_draft = specsample::gpt2::model::load(models / "shakespeare-draft", {.threads = 1, .context = 30});
  params.max_new_tokens = 30;  // 3 + 30 - 1 = 32: the target holds it; the draft 3 + 30 - 2 = 31 > 30
  CHECK_THROWS_WITH(specsample::speculative_sample(short_draft, short_target, prompt, params, rng),
                    Catch::Matchers::Contains("the draft model holds at most 30"));
  params.max_new_tokens = 31;
  CHECK_THROWS_WITH(specsample::speculative_sample(draft, short_target, prompt, params, rng),
                    Catch::Matchers::Contains("the target model holds at most 32"));
  params.max_new_tokens = 30;
  const auto fits = specsample::speculative_sample(draft, short_target, prompt, params, rng);
  CHECK(fits.tokens.size() == 30);
  CHECK(short_target.size() == 32);
}

TEST_CASE("the bundled models share one tokenizer", "[gpt2][tokenizer]") {
  const auto t = specsample::bpe_tokenizer::load(models / "shakespeare-target");
  CHECK(specsample::same_vocabulary(t, specsample::bpe_tokenizer::load(models / "shakespeare-draft")));
  CHECK(specsample::same_vocabulary(t, specsample::bpe_tokenizer::load(models / "shakespeare-draft-distilled")));
  CHECK(t.vocab_size() == 4096);
}
