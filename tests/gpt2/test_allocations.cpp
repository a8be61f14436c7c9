// Speculative sampling with the bundled GPT-2 pair allocates nothing per round in the steady
// state: the loop allocates its buffers once per call, the models only inside `load` (and when a
// batch outgrows the reserved capacity, which a round of K + 1 <= 16 tokens never does). Every
// malloc/calloc/realloc of this executable is counted (-Wl,--wrap), which also catches Eigen's
// allocations (they bypass operator new); operator new is routed through the wrapped malloc.
// The model-level "append allocates nothing" check lives here too, on the same counter.

#include <specsample/gpt2.hpp>
#include <specsample/specsample.hpp>

#include <catch2/catch.hpp>

#include "../support/counting_allocator.hpp"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <vector>

using specsample::test::allocation_count;

namespace {
const std::filesystem::path bundled_models = std::filesystem::path(SPECSAMPLE_SOURCE_DIR) / "models";
}

TEST_CASE("the allocation counter sees std, Eigen and aligned allocations", "[gpt2][allocations]") {
  const auto seen = specsample::test::check_the_counter();
  CHECK(seen.std_and_eigen >= 3);
  CHECK(seen.aligned == 2);
}

TEST_CASE("append allocates nothing in steady state, with F32, BF16 or INT8 matmuls", "[gpt2][model][allocations]") {
  using specsample::token;
  namespace gpt2 = specsample::gpt2;
  for (const auto precision : {gpt2::matmul_precision::f32, gpt2::matmul_precision::bf16, gpt2::matmul_precision::int8}) {
    gpt2::model m = gpt2::model::load(bundled_models / "shakespeare-draft",
                                      gpt2::options{.threads = 2, .batch_capacity = 8, .matmul_precision = precision});
    std::vector<token> tokens(20);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<token>(i * 37 % 4096);
    (void)m.append(std::span<const token>(tokens).first(8));  // warm up
    m.truncate(0);
    const auto before = allocation_count();
    float checksum = 0;
    checksum += m.append(std::span<const token>(tokens).first(1))(0, 0);
    checksum += m.append(std::span<const token>(tokens).subspan(1, 8))(5, 7);
    m.truncate(4);
    checksum += m.append(std::span<const token>(tokens).subspan(4, 5))(9, 4);
    gpt2::op_times times;  // timing the operations allocates nothing either
    m.time_ops(&times);
    m.truncate(4);
    checksum += m.append(std::span<const token>(tokens).subspan(4, 5))(9, 4);
    m.time_ops(nullptr);
    const auto after = allocation_count();
    INFO(gpt2::precision_name(precision) << " matmuls, checksum " << checksum);
    REQUIRE(after - before == 0);
    REQUIRE(times.total() > 0.0);
  }
}

TEST_CASE("speculative sampling with the GPT-2 pair allocates nothing per round in the steady "
          "state",
          "[gpt2][allocations]") {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    auto target = specsample::gpt2::model::load(bundled_models / "shakespeare-target", {.threads = threads});
    auto draft = specsample::gpt2::model::load(bundled_models / "shakespeare-draft", {.threads = threads});
    const std::vector<specsample::token> prompt = {10, 20, 30, 40};
    // Greedy and sampled token-wise, then sampled with block verification and the adaptive draft
    // length (the loop's other round shapes).
    struct cell {
      float temperature;
      specsample::verification verify = specsample::verification::token_wise;
      bool adaptive = false;
    };
    for (const cell c : {cell{0.0f}, cell{0.8f}, cell{0.8f, specsample::verification::block, true}}) {
      const float temperature = c.temperature;
      specsample::speculative_params params;
      params.max_new_tokens = 120;
      params.draft_length = 4;
      params.sampling.temperature = temperature;
      params.sampling.top_k = temperature > 0 ? 50 : 0;
      params.sampling.top_p = temperature > 0 ? 0.95f : 1.0f;
      params.verify = c.verify;
      params.adaptive_draft_length = c.adaptive;
      std::mt19937_64 rng(1);
      std::size_t at_round_1 = 0, at_last = 0, rounds = 0;
      const auto r = specsample::speculative_sample(draft, target, prompt, params, rng,
                                                    [&](const specsample::round_event& e) {
                                                      if (e.round == 1) at_round_1 = allocation_count();
                                                      at_last = allocation_count();
                                                      ++rounds;
                                                    });
      REQUIRE(r.tokens.size() == 120);
      REQUIRE(rounds > 10);
      INFO("threads " << threads << ", T = " << temperature << (c.adaptive ? ", block, adaptive K" : "") << ": "
                      << (at_last - at_round_1)
                      << " allocations over " << rounds - 2 << " rounds");
      CHECK(at_last == at_round_1);
    }
  }
}
