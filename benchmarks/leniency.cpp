// specsample-leniency: what lenient (lossy) verification costs in exactness and buys in speed, on
// a toy Markov pair small enough to enumerate (docs/benchmarks.md, "Leniency trade-off").
//
//   specsample-leniency [--vocab V] [--order N] [--length L] [--similarity S] [-k K]
//                       [--samples N] [--leniency 1,0.8,0.5] [--c C] [--long-tokens N]
//                       [--long-runs N] [--seed S] [--quick]
//
// Target: toy::markov::random(V, N); draft: toy::markov::similar_to(target, S). For each leniency
// b it enumerates the target's exact distribution over the L-token continuations of a one-token
// prompt, draws --samples speculative sequences with speculative_params::leniency = b, and reports
// the total-variation distance between the empirical and the exact distribution. At b = 1 the
// sampler is exact, so that TV is pure sampling noise: the floor to read the others against.
// For speed it runs --long-runs generations of --long-tokens tokens (where the round structure is
// not cut short by L) and reports the mean tokens per round, α and the speedup the performance
// model implies, tokens per round / (cK + 1), with the given cost ratio c.

#include <specsample/specsample.hpp>
#include <specsample/testing/distribution.hpp>

#include "bench_util.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using specsample::token;

struct cli {
  std::size_t vocab = 5, order = 2, length = 4, k = 4, samples = 500000, long_tokens = 64, long_runs = 2000;
  double similarity = 0.3, c = 0.05;
  std::vector<double> leniency{1.0, 0.8, 0.5};
  std::uint64_t seed = 20240601;
};

using specsample_bench::load_average;
using specsample_bench::usage_error;

constexpr std::string_view help = R"(usage: specsample-leniency [options]
  (an option's value follows it, or joins a long option after '=': --vocab 5, --vocab=5;
   a value that begins with -- must join it after '=')
  --vocab V          toy vocabulary size (default 5)
  --order N          Markov order of both models (default 2)
  --length L         sequence length enumerated (default 4; V^L cells)
  --similarity S     draft = S * target + (1 - S) * random (default 0.3: α ≈ 0.7 at b = 1,
                     like the bundled GPT-2 pair at T = 0.7-1)
  -k K               draft length (default 4)
  --samples N        sampled sequences per leniency (default 500000)
  --leniency LIST    comma-separated b values in (0, 1], 1 among them (default 1,0.8,0.5)
  --c C              cost ratio for the implied speedup (default 0.05)
  --long-tokens N    tokens per speed run (default 64, at most 1000000)
  --long-runs N      speed runs per leniency (default 2000)
  --seed S           seed of the models and the sampler (default 20240601)
  --quick            smoke test: 20000 samples, 200 speed runs
  -h, --help         this text
)";

constexpr std::size_t max_long_tokens = 1'000'000;
constexpr double max_cost_ratio = 1e6;

cli parse(int argc, char** argv) {
  cli c;
  bool quick = false, samples_set = false, runs_set = false;
  try {  // what the reader refuses, and a flag's value out of its domain: usage errors
    for (specsample::io::argument_reader args(argc, argv); args.next();) {
      const std::string_view a = args.flag();
      if (a == "--help" || a == "-h") {
        args.refuse_value();
        std::fputs(help.data(), stdout);
        std::exit(0);
      } else if (a == "--vocab") c.vocab = args.number<std::size_t>(1);
      else if (a == "--order") c.order = args.number<std::size_t>();
      else if (a == "--length") c.length = args.number<std::size_t>(1);
      else if (a == "--similarity") c.similarity = args.number<double>();
      else if (a == "-k") c.k = args.number<std::size_t>(1);
      else if (a == "--samples") {
        c.samples = args.number<std::size_t>(1);
        samples_set = true;
      }
      else if (a == "--c") c.c = args.number<double>();
      else if (a == "--long-tokens") c.long_tokens = args.number<std::size_t>(1);
      else if (a == "--long-runs") {
        c.long_runs = args.number<std::size_t>(1);
        runs_set = true;
      }
      else if (a == "--seed") c.seed = args.number<std::uint64_t>();
      else if (a == "--quick") quick = true;
      else if (a == "--leniency") c.leniency = args.list<double>();
      else throw specsample::error(fmt::format("unknown argument '{}'{}", a, specsample::io::did_you_mean(a, help)));
    }
  } catch (const specsample::error& e) {
    usage_error(e.what());
  }
  if (quick) {
    if (!samples_set) c.samples = 20000;
    if (!runs_set) c.long_runs = 200;
  }
  // The implied speedup divides by c·K + 1: a c near the double's range made it 0 and its change NaN.
  if (!(c.c >= 0.0 && c.c <= max_cost_ratio)) {
    usage_error(fmt::format("--c must be in [0, {:g}] (a draft call's cost in target calls), got {}", max_cost_ratio, c.c));
  }
  if (c.k > specsample::max_draft_length) {
    usage_error(fmt::format("-k must be at most {} (max_draft_length), got {}", specsample::max_draft_length, c.k));
  }
  if (!(c.similarity >= 0.0 && c.similarity <= 1.0)) {
    usage_error(fmt::format("--similarity must be in [0, 1], got {}", c.similarity));
  }
  // The speed runs hold each generation's tokens: a bound that keeps them in memory.
  if (c.long_tokens > max_long_tokens) {
    usage_error(fmt::format("--long-tokens must be at most {}, got {}", max_long_tokens, c.long_tokens));
  }
  for (const double b : c.leniency) {  // before any row runs (the library's own check comes at the row)
    if (!(b > 0.0 && b <= 1.0)) usage_error(fmt::format("--leniency: {} must be in (0, 1] (1 = exact)", b));
    // (each value is one row of the table: a repeat would only run it again)
    if (std::count(c.leniency.begin(), c.leniency.end(), b) > 1) usage_error(fmt::format("--leniency: {} is listed twice", b));
  }
  // Both comparison columns are against the exact rule's row.
  if (std::find(c.leniency.begin(), c.leniency.end(), 1.0) == c.leniency.end()) {
    usage_error(fmt::format("--leniency must include 1, the exact rule the table compares the others with, got {}",
                            fmt::join(c.leniency, ",")));
  }
  return c;
}

int run(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  const cli c = parse(argc, argv);
  std::string command = "specsample-leniency";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];

  // What the flags ask may be more than the toy models or the enumeration hold: said with the flags.
  const auto with_flags = [&](std::string_view flags, auto make) {
    try {
      return make();
    } catch (const specsample::error& e) {
      usage_error(fmt::format("{}: {}", flags, e.what()));
    }
  };
  const std::string model_flags = fmt::format("--vocab {} --order {}", c.vocab, c.order);
  auto target = with_flags(model_flags, [&] { return specsample::toy::markov::random(c.vocab, c.order, c.seed); });
  auto draft = specsample::toy::markov::similar_to(target, c.similarity, c.seed + 1);
  const std::vector<token> prompt{0};
  specsample::speculative_params params;
  params.max_new_tokens = c.length;
  params.draft_length = c.k;
  params.sampling.temperature = 1.0f;

  const std::string length_flags = fmt::format("--vocab {} --length {}", c.vocab, c.length);
  const auto exact = with_flags(length_flags, [&] {
    return specsample::testing::exact_sequence_distribution(target, prompt, c.length, params.sampling);
  });
  const auto draft_exact = specsample::testing::exact_sequence_distribution(draft, prompt, c.length, params.sampling);
  const double tv_draft = specsample::testing::total_variation(draft_exact, exact);

  struct row {
    double b, tv, p_value, tokens_per_round_short, tokens_per_round, alpha, speedup, formula;
  };
  std::vector<row> rows;
  std::mt19937_64 rng(c.seed + 2);
  for (const double b : c.leniency) {
    specsample::speculative_params p = params;
    p.leniency = b;
    specsample::testing::sequence_histogram hist(c.vocab, c.length);
    std::size_t tokens = 0, rounds = 0;
    for (std::size_t i = 0; i < c.samples; ++i) {
      const auto r = specsample::speculative_sample(draft, target, prompt, p, rng);
      hist.add(r.tokens);
      tokens += r.stats.tokens;
      rounds += r.stats.rounds;
    }
    const auto n = static_cast<double>(hist.samples());
    const xt::xarray<double> empirical = hist.counts() / n;
    const double tv = specsample::testing::total_variation(empirical, exact);
    const auto fit = specsample::testing::chi_square_test(hist.counts(), exact);

    specsample::speculative_params long_p = p;
    long_p.max_new_tokens = c.long_tokens;
    std::size_t l_tokens = 0, l_rounds = 0, accepted = 0, corrections = 0;
    for (std::size_t i = 0; i < c.long_runs; ++i) {
      const auto r = specsample::speculative_sample(draft, target, prompt, long_p, rng);
      l_tokens += r.stats.tokens;
      l_rounds += r.stats.rounds;
      accepted += r.stats.accepted;
      corrections += r.stats.corrections;
    }
    const double tpr = static_cast<double>(l_tokens) / static_cast<double>(l_rounds);
    rows.push_back({b, tv, fit.p_value, static_cast<double>(tokens) / static_cast<double>(rounds), tpr,
                    static_cast<double>(accepted) / static_cast<double>(accepted + corrections),
                    tpr / (c.c * static_cast<double>(c.k) + 1.0), 0.0});
    rows.back().formula = specsample::predicted_speedup(rows.back().alpha, c.c, c.k);
    fmt::print(stderr, "b = {}: TV {:.4f}, tokens/round {:.3f}\n", b, tv, tpr);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const row& exact_row = *std::find_if(rows.begin(), rows.end(), [](const row& r) { return r.b == 1.0; });  // (parse)
  const double noise = exact_row.tv;
  fmt::print("### Leniency trade-off (toy Markov pair)\n\n");
  fmt::print("`{}` — target toy::markov::random(V = {}, order {}), draft similar_to(target, {}), prompt {{0}}, "
             "T = 1, K = {}; {} sampled sequences of L = {} tokens per b against the exact distribution over the "
             "{} sequences; speed from {} runs of {} tokens; c = {} for the implied speedup; run time {:.1f} s, "
             "load average {}.\n\n",
             command, c.vocab, c.order, c.similarity, c.k, c.samples, c.length, exact.size(), c.long_runs,
             c.long_tokens, c.c, seconds, load_average());
  fmt::print("TV(draft, target), exact: {:.4f} — how far the output could drift if every draft were accepted.\n\n",
             tv_draft);
  fmt::print("| b | TV(empirical, exact target) | TV − TV at b = 1 (noise floor) | χ² test p | tokens/round (L = {}) "
             "| tokens/round ({} tokens) | α | implied speedup (c = {}) | vs b = 1 | formula from α |\n"
             "|---|---|---|---|---|---|---|---|---|---|\n",
             c.length, c.long_tokens, c.c);
  const double base = exact_row.speedup;
  for (const auto& r : rows) {
    fmt::print("| {:g}{} | {:.4f} | {:+.4f} | {:.3g} | {:.3f} | {:.3f} | {:.3f} | {:.2f}x | {:+.1f}% | {:.2f}x |\n", r.b,
               r.b == 1.0 ? " (exact)" : "", r.tv, r.tv - noise, r.p_value, r.tokens_per_round_short, r.tokens_per_round,
               r.alpha, r.speedup, 100.0 * (r.speedup / base - 1.0), r.formula);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return specsample_bench::guarded_main("specsample-leniency", [&] { return run(argc, argv); });
}
