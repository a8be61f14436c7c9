// Speculative sampling written out from the library's building blocks, for a program that runs its
// own generation loop: `logit_warper` (logits -> the warped distribution), `sample_categorical`
// (the draft's proposals), `verify_tokenwise` (acceptance with probability min(1, p/q), the
// correction from norm(max(0, p - q)) after a rejection, the bonus token after K acceptances).
// `speculative_sample` runs this loop for you, with its checks, observers and drafters; write your
// own only when it must differ (batching, another scheduler, your own cache management).
//
// The program checks its loop: at temperature 0 the output equals `autoregressive_sample`'s, and
// at temperature 1 its first L tokens follow the target's exact distribution (a chi-square test
// against `testing::exact_sequences`, which enumerates it). With --broken the correction after a
// rejection is drawn from p instead of the residual — a classic mistake — and the test must fail.
//
// usage: own_loop [--broken]

#include <specsample/sampling.hpp>
#include <specsample/testing/distribution.hpp>
#include <specsample/toy.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <random>
#include <string_view>
#include <vector>

using specsample::token;

namespace {

// The deliberately wrong rule of --broken: token-wise acceptance, but the correction drawn from p.
template <class Rng>
specsample::verify_result broken_verify(std::span<const token> drafts, const Eigen::MatrixXf& q,
                                        const Eigen::MatrixXf& p, Rng& rng) {
  for (std::size_t i = 0; i < drafts.size(); ++i) {
    const auto col = static_cast<Eigen::Index>(i);
    const double ratio = static_cast<double>(p(drafts[i], col)) / static_cast<double>(q(drafts[i], col));
    if (specsample::uniform_01(rng) >= ratio) return {i, specsample::sample_categorical(p.col(col), rng), false};
  }
  const auto k = static_cast<Eigen::Index>(drafts.size());
  return {drafts.size(), specsample::sample_categorical(p.col(k), rng), true};
}

// n new tokens after `prompt`, K drafts per round. Between rounds both models hold the context but
// its last token (the target exactly that; the draft possibly less: it catches up on the rest).
template <class Draft, class Target, class Rng>
std::vector<token> generate(Draft& draft, Target& target, std::span<const token> prompt, std::size_t n,
                            std::size_t K, const specsample::sampling_params& sampling, Rng& rng, bool broken) {
  const std::size_t V = target.vocab_size();
  // What the library's loop refuses before it starts, this one too (a loop of your own checks its
  // inputs: prompt.first(prompt.size() - 1) below needs a token).
  if (prompt.empty()) throw specsample::error("generate: the prompt is empty; it needs at least one token");
  if (K == 0) throw specsample::error("generate: K = 0 drafts per round; give at least 1");
  for (const token x : prompt) {
    if (!specsample::in_vocabulary(x, V)) {
      throw specsample::error(fmt::format("generate: prompt token {} is not in the vocabulary of {}", x, V));
    }
  }
  specsample::logit_warper warp_draft(sampling, V, "draft"), warp_target(sampling, V, "target");
  std::vector<token> context(prompt.begin(), prompt.end());
  target.truncate(0);
  draft.truncate(0);
  (void)target.append(prompt.first(prompt.size() - 1));
  (void)draft.append(prompt.first(prompt.size() - 1));
  Eigen::MatrixXf q(V, K), p(V, K + 1);
  std::vector<token> scored;  // the target's input of the round: the last token, then the drafts
  while (context.size() - prompt.size() < n) {
    // A round emits at most k + 1 tokens: no more drafts than leave room for the last of them.
    const std::size_t k = std::min(K, n - (context.size() - prompt.size()) - 1);
    scored.assign(1, context.back());
    for (std::size_t i = 0; i < k; ++i) {
      // The draft's first call feeds what it lacks of the context, each later one its last proposal.
      const std::span<const token> feed =
          i == 0 ? std::span<const token>(context).subspan(draft.size()) : std::span<const token>(scored).last(1);
      const Eigen::MatrixXf logits = draft.append(feed);  // (V, feed.size()): the last column predicts
      const auto col = static_cast<Eigen::Index>(i);
      warp_draft(logits.col(logits.cols() - 1), q.col(col));
      scored.push_back(specsample::sample_categorical(q.col(col), rng));
    }
    // One target call scores the last token and the k drafts: column i is p after draft i - 1.
    const Eigen::MatrixXf logits = target.append(scored);  // (V, k + 1)
    for (Eigen::Index i = 0; i < logits.cols(); ++i) warp_target(logits.col(i), p.col(i));
    const std::span<const token> drafts = std::span<const token>(scored).subspan(1);
    const auto ks = static_cast<Eigen::Index>(k);
    const specsample::verify_result r =
        broken ? broken_verify(drafts, q.leftCols(ks), p.leftCols(ks + 1), rng)
               : specsample::verify_tokenwise(drafts, q.leftCols(ks), p.leftCols(ks + 1), rng);
    context.insert(context.end(), drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(r.accepted));
    context.push_back(r.next);  // the correction, or the bonus drawn from p's last column
    // Keep what stands: the target drops the rejected drafts, the draft what it holds beyond them.
    target.truncate(context.size() - 1);
    if (draft.size() > context.size() - 1) draft.truncate(context.size() - 1);
  }
  return {context.begin() + static_cast<std::ptrdiff_t>(prompt.size()), context.end()};
}

}  // namespace

int main(int argc, char** argv) {
  const bool broken = argc == 2 && std::string_view(argv[1]) == "--broken";
  if (argc > 2 || (argc == 2 && !broken)) {
    std::fprintf(stderr, "usage: own_loop [--broken]\n");
    return 2;
  }
  try {
    // A toy pair over 6 tokens: the target an order-2 Markov chain, the draft a perturbed copy.
    auto target = specsample::toy::markov::random(6, 2, 1);
    auto draft = specsample::toy::markov::similar_to(target, 0.5, 2);
    const std::vector<token> prompt{0, 1};
    constexpr std::size_t K = 3;
    std::mt19937_64 rng(7);

    specsample::sampling_params greedy;
    greedy.temperature = 0.0f;
    const std::vector<token> mine = generate(draft, target, prompt, 24, K, greedy, rng, broken);
    specsample::speculative_params params;
    params.max_new_tokens = 24;
    params.sampling = greedy;
    const bool same = mine == specsample::autoregressive_sample(target, prompt, params, rng).tokens;
    std::printf("temperature 0: %zu tokens, identical to autoregressive_sample: %s\n", mine.size(),
                same ? "yes" : "no");
    // What the loop refuses before it starts, as speculative_sample does: an empty prompt.
    try {
      (void)generate(draft, target, std::span<const token>(), 4, K, greedy, rng, broken);
      std::printf("an empty prompt: accepted\n");
    } catch (const specsample::error& e) {
      std::printf("an empty prompt: refused (%s)\n", e.what());
    }

    // The first L tokens at temperature 1 against the target's exact distribution of them.
    constexpr std::size_t L = 4, samples = 40000;
    const specsample::sampling_params sampling;  // temperature 1, no filter
    const specsample::testing::sequence_table exact = specsample::testing::exact_sequences(target, prompt, L, sampling);
    specsample::testing::sequence_table observed(L);
    for (std::size_t s = 0; s < samples; ++s) observed.add(generate(draft, target, prompt, L, K, sampling, rng, broken), 1.0);
    const specsample::testing::fit_result fit = specsample::testing::chi_square_test(observed, exact);
    const bool pass = fit.p_value > 1e-3;
    std::printf("temperature 1, %s verification: %zu samples of %zu tokens, X2 = %.1f on %zu degrees of freedom, "
                "p = %.3g: %s\n",
                broken ? "BROKEN" : "token-wise", samples, L, fit.statistic, fit.dof, fit.p_value,
                pass ? "PASS" : "FAIL");
    return same && pass ? 0 : 1;
  } catch (const specsample::error& e) {
    std::fprintf(stderr, "own_loop: %s\n", e.what());
    return 2;
  }
}
