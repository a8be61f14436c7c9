// Quickstart: speculative sampling with a toy draft/target pair.
//
// The target is a character trigram model and the draft a character bigram model, both counted
// from a passage of Tiny Shakespeare. The draft proposes K characters, the target checks them in
// one call; the output is distributed exactly as sampling from the target alone.

#include <specsample/sampling.hpp>
#include <specsample/toy.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr const char* passage = R"(First Citizen:
Before we proceed any further, hear me speak.

All:
Speak, speak.

First Citizen:
You are all resolved rather to die than to famish?

All:
Resolved. resolved.

First Citizen:
First, you know Caius Marcius is chief enemy to the people.

All:
We know't, we know't.

First Citizen:
Let us kill him, and we'll have corn at our own price.
Is't a verdict?

All:
No more talking on't; let it be done: away, away!

Second Citizen:
One word, good citizens.

First Citizen:
We are accounted poor citizens, the patricians good.
What authority surfeits on would relieve us: if they
would yield us but the superfluity, while it were
wholesome, we might guess they relieved us humanely;
but they think we are too dear: the leanness that
afflicts us, the object of our misery, is as an
inventory to particularise their abundance; our
sufferance is a gain to them Let us revenge this with
our pikes, ere we become rakes: for the gods know I
speak this in hunger for bread, not in thirst for revenge.
)";

// A character vocabulary: every distinct byte of the passage gets an id.
struct char_vocab {
  std::map<char, specsample::token> ids;
  std::string chars;
  explicit char_vocab(const std::string& text) {
    for (char c : text) {
      if (ids.emplace(c, static_cast<specsample::token>(chars.size())).second) chars.push_back(c);
    }
  }
  std::vector<specsample::token> encode(const std::string& s) const {
    std::vector<specsample::token> out;
    for (char c : s) out.push_back(ids.at(c));
    return out;
  }
  std::string decode(const std::vector<specsample::token>& t) const {
    std::string out;
    for (auto x : t) out.push_back(chars[static_cast<std::size_t>(x)]);
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {  // nothing to configure: an argument is a mistake, not something to ignore
    std::fprintf(stderr, "usage: quickstart (takes no arguments, got '%s')\n", argv[1]);
    return 2;
  }
  const std::string text = passage;
  const char_vocab vocab(text);
  const auto corpus = vocab.encode(text);
  const auto v = vocab.chars.size();

  auto target = specsample::toy::markov::from_corpus(corpus, v, 2, 1e-4);  // trigram target
  auto draft = specsample::toy::markov::from_corpus(corpus, v, 1, 1e-4);   // bigram draft

  specsample::speculative_params params;
  params.max_new_tokens = 200;
  params.draft_length = 4;
  params.sampling.temperature = 0.8f;
  const auto prompt = vocab.encode("First Citizen:\n");

  std::mt19937_64 rng(2024);
  const auto spec = specsample::speculative_sample(draft, target, prompt, params, rng);
  const auto ar = specsample::autoregressive_sample(target, prompt, params, rng);

  fmt::print("vocabulary: {} characters, target order 2, draft order 1, K = {}, T = {}\n\n", v,
             params.draft_length, params.sampling.temperature);
  fmt::print("--- speculative ---\n{}\n\n--- autoregressive ---\n{}\n\n", vocab.decode(spec.tokens),
             vocab.decode(ar.tokens));
  const auto& s = spec.stats;
  fmt::print("speculative: {} tokens in {} rounds, acceptance rate {:.3f}, {:.2f} tokens per target call\n",
             s.tokens, s.rounds, s.acceptance_rate(), s.tokens_per_target_call());
  fmt::print("autoregressive: {} tokens, {:.2f} tokens per target call\n", ar.stats.tokens,
             ar.stats.tokens_per_target_call());

  // At temperature 0 both must produce the same characters.
  params.sampling.temperature = 0.0f;
  const bool identical = specsample::speculative_sample(draft, target, prompt, params, rng).tokens ==
                         specsample::autoregressive_sample(target, prompt, params, rng).tokens;
  fmt::print("greedy speculative == greedy autoregressive: {}\n", identical ? "yes" : "NO");
  return identical ? 0 : 1;
}
