// Tests for specsample/tokenizer.hpp: GPT-2 byte-level BPE against the llama.cpp GPT-2 vectors,
// byte-exact round trips (also of invalid UTF-8), the Shakespeare vocab, the streaming decoder,
// and the loader's error messages.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <random>
#include <specsample/tokenizer.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace fs = std::filesystem;
using specsample::bpe_tokenizer;
using specsample::token;

namespace {

const fs::path data_dir = SPECSAMPLE_TEST_DATA;
const fs::path source_dir = SPECSAMPLE_SOURCE_DIR;

const bpe_tokenizer& gpt2() {
  static const bpe_tokenizer tok = bpe_tokenizer::load(data_dir / "gpt2-tokenizer");
  return tok;
}

const bpe_tokenizer& shakespeare() {
  static const bpe_tokenizer tok =
      bpe_tokenizer::load(source_dir / "models" / "shakespeare-target");
  return tok;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Whether `s` is entirely valid UTF-8.
bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = specsample::detail::utf8_char_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8(std::uint32_t cp) {
  std::string s;
  specsample::detail::append_utf8(s, cp);
  return s;
}

/// A fresh directory under the system temp dir, removed at scope exit.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("specsample_tokenizer_test_" + std::to_string(std::random_device{}()) + "_" +
            std::to_string(counter++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  void write(const std::string& name, const std::string& content) const {
    std::ofstream out(path / name, std::ios::binary);
    out << content;
  }
};

/// vocab.json text for: the 256 byte symbols (ids 0..255 in byte order), then `extra` in order.
std::string small_vocab_json(const std::vector<std::string>& extra) {
  const auto& cps = specsample::detail::byte_code_points();
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t b = 0; b < 256; ++b) j[utf8(cps[b])] = b;
  for (std::size_t k = 0; k < extra.size(); ++k) j[extra[k]] = 256 + k;
  return j.dump();
}

/// encoder.py's `bpe` on one pre-token, quadratic and literal, on vocab.json spellings.
std::vector<token> reference_bpe(const bpe_tokenizer& tok,
                                 const std::map<std::pair<std::string, std::string>, int>& ranks,
                                 std::string_view bytes) {
  std::vector<std::string> word;
  for (const char c : bytes)
    word.push_back(utf8(specsample::detail::byte_code_points()[static_cast<unsigned char>(c)]));
  while (word.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> bigram;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        bigram = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == bigram.first && word[i + 1] == bigram.second) {
        merged.push_back(word[i] + word[i + 1]);
        i += 2;
      } else {
        merged.push_back(word[i]);
        ++i;
      }
    }
    word = std::move(merged);
  }
  std::vector<token> ids;
  for (const auto& w : word) ids.push_back(tok.token_to_id(w).value());
  return ids;
}

std::map<std::pair<std::string, std::string>, int> read_ranks(const fs::path& merges) {
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::istringstream in(slurp(merges));
  std::string line;
  std::getline(in, line);  // #version
  int rank = 0;
  while (std::getline(in, line)) {
    const auto sp = line.find(' ');
    ranks.emplace(std::pair{line.substr(0, sp), line.substr(sp + 1)}, rank++);
  }
  return ranks;
}

void check_load_error(const temp_dir& dir, const std::string& fragment1,
                      const std::string& fragment2) {
  try {
    (void)bpe_tokenizer::load(dir.path);
    FAIL("load succeeded, expected an error mentioning \"" << fragment1 << "\" and \"" << fragment2
                                                           << "\"");
  } catch (const specsample::error& e) {
    const std::string what = e.what();
    INFO("message: " << what);
    CHECK(what.find(fragment1) != std::string::npos);
    CHECK(what.find(fragment2) != std::string::npos);
  }
}

// A load error quotes at most a bounded part of the file, whatever its lines and keys hold.
void check_message_bounded(const temp_dir& dir) {
  try {
    (void)bpe_tokenizer::load(dir.path);
  } catch (const specsample::error& e) {
    INFO("message: " << e.what());
    CHECK(std::string_view(e.what()).size() < 400 + dir.path.string().size());
  }
}

}  // namespace

TEST_CASE("gpt2 tokenizer encodes every llama.cpp test vector exactly", "[tokenizer][gpt2]") {
  // llama.cpp's test-tokenizer-0 format: inputs end with "\n__ggml_vocab_test__\n"; the newline
  // before the separator is not part of the input. Output line i holds the ids of input i.
  std::string raw = slurp(data_dir / "gpt2-tokenizer" / "tests" / "vectors.inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (std::size_t pos; (pos = raw.find(sep)) != std::string::npos;) {
    inputs.push_back(raw.substr(0, pos));
    raw.erase(0, pos + sep.size());
  }
  REQUIRE(raw.empty());
  std::vector<std::vector<token>> outputs;
  std::istringstream out(slurp(data_dir / "gpt2-tokenizer" / "tests" / "vectors.out"));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    outputs.emplace_back(std::istream_iterator<token>(ids), std::istream_iterator<token>());
  }
  REQUIRE(inputs.size() == 46);
  REQUIRE(outputs.size() == inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    INFO("vector " << i << ": \"" << inputs[i] << "\"");
    CHECK(gpt2().encode(inputs[i]) == outputs[i]);
    CHECK(gpt2().decode(outputs[i]) == inputs[i]);
  }
}

TEST_CASE("gpt2 vocab has 50257 tokens and end-of-text is the only special token",
          "[tokenizer][gpt2]") {
  const auto& tok = gpt2();
  CHECK(tok.vocab_size() == 50257);
  CHECK(tok.merge_count() == 50000);
  REQUIRE(tok.has_eos());
  CHECK(tok.eos() == 50256);
  CHECK(tok.special_tokens() == std::vector<token>{50256});
  CHECK(tok.special_token("<|endoftext|>") == token{50256});
  CHECK(tok.is_special(50256));
  CHECK_FALSE(tok.is_special(262));
  CHECK(tok.token_to_id("Ġthe") == token{262});
  CHECK_FALSE(tok.token_to_id("not a token").has_value());
  CHECK(tok.id_to_token(262) == "Ġthe");
  CHECK(tok.id_to_bytes(262) == " the");
  CHECK(tok.id_to_bytes(198) == "\n");
  CHECK(tok.id_to_bytes(50256) == "<|endoftext|>");
}

TEST_CASE("whitespace is Unicode White_Space, as in Python's regex: U+180E is no space",
          "[tokenizer][gpt2]") {
  const auto& tok = gpt2();
  // encoder.py pre-tokenizes "a" + U+180E + "'s" as "a", U+180E "'" (neither space, letter nor
  // number), "s"; PCRE2's \s takes U+180E for a space and would give "a", U+180E, "'s".
  const std::string mvs = utf8(0x180E);
  CHECK(tok.encode("a" + mvs + "'s") == std::vector<token>{64, 157, 254, 236, 6, 82});
  CHECK(tok.encode(mvs + "'") == std::vector<token>{157, 254, 236, 6});
  CHECK(tok.encode("a" + mvs + " b") == std::vector<token>{64, 157, 254, 236, 275});
  // " " followed by a White_Space character and a letter is three pre-tokens: " " (\s+(?!\S)
  // backs off to it), the character (\s+), "y". Any other character joins the " " instead
  // ( ?[^\s\p{L}\p{N}]+): " " + U+2003 would encode as "ĠâĢ" + ... rather than 220 + ...
  const auto joined = [&](std::initializer_list<std::string> pieces) {
    std::vector<token> ids;
    for (const auto& piece : pieces) {
      for (const token id : tok.encode(piece)) ids.push_back(id);
    }
    return ids;
  };
  for (std::uint32_t cp = 0; cp < 0x3010; ++cp) {
    const bool white_space = (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
                             (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
                             cp == 0x205F || cp == 0x3000;
    const bool other = cp == 0x1C || cp == 0x1F || cp == 0x180E || cp == 0x200B || cp == 0x2060 || cp == 0x2E;
    if (!white_space && !other) continue;
    INFO("U+" << std::hex << cp);
    const std::string c = utf8(cp);
    if (cp == 0x20) continue;  // "x  y": the two spaces are " " and " y"
    CHECK(tok.encode("x " + c + "y") == (white_space ? joined({"x", " ", c, "y"}) : joined({"x", " " + c, "y"})));
  }
}

TEST_CASE("end-of-text in the input encodes to the special token", "[tokenizer][gpt2]") {
  const auto& tok = gpt2();
  CHECK(tok.encode("<|endoftext|>") == std::vector<token>{50256});
  CHECK(tok.encode("a<|endoftext|>b") == std::vector<token>{64, 50256, 65});
  CHECK(tok.encode("<|endoftext|><|endoftext|>") == std::vector<token>{50256, 50256});
  CHECK(tok.encode("Hello world<|endoftext|> Hello") ==
        std::vector<token>{15496, 995, 50256, 18435});
  CHECK(tok.decode(tok.encode("x <|endoftext|>\n<|endoftext")) == "x <|endoftext|>\n<|endoftext");
  const auto ordinary = tok.encode_ordinary("<|endoftext|>");
  CHECK(ordinary.size() > 1);
  CHECK(std::find(ordinary.begin(), ordinary.end(), 50256) == ordinary.end());
  CHECK(tok.decode(ordinary) == "<|endoftext|>");
}

TEST_CASE("special tokens that overlap encode as the earliest match, the longest where several start there",
          "[tokenizer]") {
  // Spellings that are prefixes of one another, share prefixes and overlap; every one is text of
  // several pre-tokens, so the vocab loads them as special tokens (ids 256..). The reference
  // takes, at each step, the earliest occurrence of any special token and the longest there (as
  // encode did by searching for each token in turn), the text between as ordinary text.
  const std::vector<std::string> specials = {"<|a", "<|a|>", "<|ab|>", "<|a|><|b", "a|>", "|b|>", "<|abc"};
  temp_dir dir;
  dir.write("vocab.json", small_vocab_json(specials));
  dir.write("merges.txt", "#version: 0.2\n");
  const bpe_tokenizer tok = bpe_tokenizer::load(dir.path);
  REQUIRE(tok.special_tokens().size() == specials.size());
  const auto reference = [&](std::string_view text) {
    std::vector<token> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t at = std::string_view::npos, best = 0;
      for (std::size_t s = 0; s < specials.size(); ++s) {
        const std::size_t hit = text.find(specials[s], pos);
        if (hit < at || (hit == at && hit != std::string_view::npos && specials[s].size() > specials[best].size())) {
          at = hit;
          best = s;
        }
      }
      const auto plain = tok.encode_ordinary(text.substr(pos, at == std::string_view::npos ? text.size() - pos : at - pos));
      out.insert(out.end(), plain.begin(), plain.end());
      if (at == std::string_view::npos) break;
      out.push_back(static_cast<token>(256 + best));
      pos = at + specials[best].size();
    }
    return out;
  };
  const std::vector<std::string> pieces = {"<", "|", "a", "b", "c", ">", " ", "x", "<|", "|>", "<|a|>"};
  std::mt19937 rng(7);
  std::size_t with_special = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += pieces[rng() % pieces.size()];
    const auto got = tok.encode(text);
    INFO("text: " << text);
    CHECK(got == reference(text));
    with_special += std::any_of(got.begin(), got.end(), [](token t) { return t >= 256; }) ? 1 : 0;
  }
  CHECK(with_special > 1000);  // the texts do hit the special tokens
  // Three start at 0 ("<|a", "<|a|>", "<|a|><|b"): the longest; "|b|>" would start inside it.
  CHECK(tok.encode("<|a|><|b|>") == std::vector<token>{259, '|', '>'});
}

TEST_CASE("encode then decode round-trips random byte strings including invalid UTF-8",
          "[tokenizer][roundtrip]") {
  const auto& tok = gpt2();
  // Hand-picked invalid sequences: lone continuation, truncated 2/3/4-byte characters, overlongs,
  // surrogates, above U+10FFFF, bytes that never occur in UTF-8, NUL, and mixes with text.
  const std::vector<std::string> fixed = {"\x80",
                                          "\xC3",
                                          "\xE2\x82",
                                          "\xF0\x9F\xA6",
                                          "\xC0\xAF",
                                          "\xE0\x80\xAF",
                                          "\xED\xA0\x80",
                                          "\xF4\x90\x80\x80",
                                          "\xFF\xFE",
                                          "\xF8\x88\x80\x80\x80",
                                          std::string("a\0b", 3),
                                          "caf\xC3",
                                          "\xC3 \xA9",
                                          " \xFF\xFF hello \x80world",
                                          "'s\xE2\x82'\xAC",
                                          "\xF0\x9F\xA6\x99\xF0\x9F",
                                          "   \xFF",
                                          "\xFF   x",
                                          "\t\xC3\n",
                                          "<|endoftext|>\xFF<|endoftext|>"};
  for (const auto& s : fixed) {
    INFO("bytes: " << s);
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<int> length(0, 64);
  std::uniform_int_distribution<int> any_byte(0, 255);
  std::uniform_int_distribution<int> kind(0, 3);
  const std::string alphabet = " \t\n'sdvelmrt0123456789aZ!.";
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::size_t invalid_seen = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = length(rng);
    for (int k = 0; k < n; ++k) {
      switch (kind(rng)) {
        case 0:
          s.push_back(alphabet[pick(rng)]);
          break;  // ASCII text, contractions
        case 1:
          s.push_back(static_cast<char>(0x80 + any_byte(rng) % 0x40));
          break;  // continuation
        case 2:
          s.push_back(static_cast<char>(0xC0 + any_byte(rng) % 0x40));
          break;  // lead byte
        default:
          s.push_back(static_cast<char>(any_byte(rng)));
          break;
      }
    }
    invalid_seen += valid_utf8(s) ? 0 : 1;
    const auto ids = tok.encode(s);
    INFO("trial " << trial);
    REQUIRE(tok.decode(ids) == s);
  }
  CHECK(invalid_seen > 1000);
}

TEST_CASE("encode then decode round-trips random Unicode text across all planes",
          "[tokenizer][roundtrip]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> length(0, 40);
  std::uniform_int_distribution<int> plane_pick(0, 9);
  std::uniform_int_distribution<std::uint32_t> ascii(0x20, 0x7E);
  std::uniform_int_distribution<std::uint32_t> bmp(0x80, 0xFFFF);
  std::uniform_int_distribution<std::uint32_t> astral(0x10000, 0x10FFFF);
  const std::vector<std::uint32_t> spaces = {0x09,   0x0A,   0x0D,   0x0B,   0x0C,
                                             0x20,   0x85,   0xA0,   0x1680, 0x180E,
                                             0x2000, 0x2028, 0x2029, 0x202F, 0x3000};
  std::uniform_int_distribution<std::size_t> space_pick(0, spaces.size() - 1);
  for (const bpe_tokenizer* tok : {&gpt2(), &shakespeare()}) {
    for (int trial = 0; trial < 1000; ++trial) {
      std::string s;
      const int n = length(rng);
      for (int k = 0; k < n; ++k) {
        const int p = plane_pick(rng);
        std::uint32_t cp = p < 4   ? ascii(rng)
                           : p < 5 ? spaces[space_pick(rng)]
                           : p < 8 ? bmp(rng)
                                   : astral(rng);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp -= 0x1000;  // no surrogates: stay valid UTF-8
        s += utf8(cp);
      }
      REQUIRE(valid_utf8(s));
      INFO("trial " << trial << ": " << s);
      REQUIRE(tok->decode(tok->encode(s)) == s);
    }
  }
}

TEST_CASE("heap-based merging equals encoder.py's quadratic bpe on single pre-tokens",
          "[tokenizer][bpe]") {
  const auto& tok = shakespeare();
  const auto ranks = read_ranks(source_dir / "models" / "shakespeare-target" / "merges.txt");
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> length(1, 24);
  const std::string letters = "etaoinshrdlucmfwypvbgkqjxzETAOINSHRD";
  std::uniform_int_distribution<std::size_t> pick(0, letters.size() - 1);
  std::uniform_int_distribution<int> bad(0xF5, 0xFF);  // never valid UTF-8: one pre-token per run
  for (int trial = 0; trial < 500; ++trial) {
    std::string word = trial % 2 == 0 ? " " : "";
    const int n = length(rng);
    for (int k = 0; k < n; ++k) word.push_back(letters[pick(rng)]);
    INFO("word: \"" << word << "\"");
    CHECK(tok.encode(word) == reference_bpe(tok, ranks, word));
    std::string junk;
    for (int k = 0; k < n; ++k) junk.push_back(static_cast<char>(bad(rng)));
    CHECK(tok.encode(junk) == reference_bpe(tok, ranks, junk));
  }
}

TEST_CASE("a merge that creates a lower-ranked pair waits until the current rank is done",
          "[tokenizer][bpe]") {
  // merges: rank 0 "aa a" (not yet applicable), rank 1 "a a". encoder.py merges every "a a" of
  // "aaaa" first, giving [aa, aa]; applying "aa a" as soon as it appears would give [aaa, a].
  temp_dir dir;
  dir.write("vocab.json", small_vocab_json({"aa", "aaa", "<|pad|>"}));
  dir.write("merges.txt", "#version: 0.2\naa a\na a\n");
  const auto tok = bpe_tokenizer::load(dir.path);
  CHECK(tok.vocab_size() == 259);
  CHECK(tok.encode("aaaa") == std::vector<token>{256, 256});
  CHECK(tok.encode("aaa") == std::vector<token>{257});
  CHECK(tok.encode("aaaaa") == std::vector<token>{256, 257});
  CHECK(tok.special_tokens() == std::vector<token>{258});
  CHECK(tok.encode("a<|pad|>a") == std::vector<token>{97, 258, 97});
  CHECK_FALSE(tok.has_eos());
  CHECK_THROWS_AS(tok.eos(), specsample::error);
}

TEST_CASE("the shakespeare vocab loads, matches encoder.py and round-trips Shakespeare",
          "[tokenizer][shakespeare]") {
  const auto& tok = shakespeare();
  CHECK(tok.vocab_size() == 4096);
  CHECK(tok.merge_count() == 3839);
  CHECK(tok.eos() == 4095);
  CHECK(tok.encode("<|endoftext|>") == std::vector<token>{4095});
  CHECK(tok.special_tokens() == std::vector<token>{4095});
  // First lines of tinyshakespeare; ids from OpenAI's encoder.py with this vocab.
  const std::string text =
      "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
      "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. "
      "resolved.\n\nFirst Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n";
  const std::vector<token> expected = {
      672, 1193, 58,   10,   2354, 331,  2712, 802, 2277, 44,   674,  317,  614, 46,   10,
      10,  1233, 58,   10,   2537, 44,   614,  46,  10,   10,   672,  1193, 58,  10,   565,
      418, 395,  4044, 1485, 287,  963,  527,  287, 2806, 556,  63,   10,   10,  1233, 58,
      10,  3813, 494,  767,  46,   4044, 46,   10,  10,   672,  1193, 58,   10,  672,  44,
      288, 504,  3946, 1414, 324,  3735, 1927, 287, 267,  1182, 46,   10};
  CHECK(tok.encode(text) == expected);
  CHECK(tok.decode(expected) == text);
  const std::string contractions =
      "All:\nWe know't, we know't.\n\nWhat shouts are these? The other side o' the city\n"
      "is risen: why stay we prating here? to the Capitol!\n";
  CHECK(tok.encode(contractions) ==
        std::vector<token>{1233, 58,   10,   667, 504, 666, 44,   331, 504,  666,  46,   10,
                           10,   462,  436,  486, 115, 418, 685,  63,  2082, 845,  2100, 286,
                           39,   267,  1621, 10,  269, 616, 269,  279, 58,   1213, 960,  331,
                           457,  3377, 517,  63,  287, 267, 3601, 33,  10});
  CHECK(gpt2().encode(contractions) ==
        std::vector<token>{3237, 25,  198,  1135,  760, 470,   11, 356,  760,  470,  13,
                           198,  198, 2061, 34757, 389, 777,   30, 383,  584,  1735, 267,
                           6,    262, 1748, 198,   271, 17450, 25, 1521, 2652, 356,  778,
                           803,  994, 30,   284,   262, 13241, 0,  198});
  const std::string play = text + contractions + "<|endoftext|>" + text;
  const auto ids = tok.encode(play);
  CHECK(std::count(ids.begin(), ids.end(), 4095) == 1);
  CHECK(tok.decode(ids) == play);
}

TEST_CASE("draft and target tokenizers compare equal only with identical vocab and merges",
          "[tokenizer][vocab]") {
  const auto draft = bpe_tokenizer::load(source_dir / "models" / "shakespeare-draft");
  CHECK(specsample::same_vocabulary(draft, shakespeare()));
  CHECK(draft == shakespeare());
  CHECK_FALSE(specsample::vocabulary_difference(draft, shakespeare()).has_value());
  CHECK_FALSE(specsample::same_vocabulary(draft, gpt2()));
  CHECK(specsample::vocabulary_difference(draft, gpt2()).value() ==
        "vocab sizes differ: 4096 vs 50257");
  CHECK_NOTHROW(specsample::check_same_vocabulary(draft, shakespeare(), "d", "t"));
  CHECK_THROWS_WITH(specsample::check_same_vocabulary(draft, gpt2(), "d", "t"),
                    "the draft (d) and target (t) tokenizers differ: vocab sizes differ: 4096 vs 50257; speculative "
                    "sampling needs identical vocabularies");
  CHECK_NOTHROW(specsample::check_model_vocabulary(4096, shakespeare(), "m"));
  CHECK_THROWS_WITH(specsample::check_model_vocabulary(4095, shakespeare(), "m"),
                    "m: the model has 4095 tokens but its tokenizer has 4096");

  temp_dir dir;  // same tokens, one merge more (a second way to "Ġgate", after "Ġg ate")
  dir.write("vocab.json", slurp(source_dir / "models" / "shakespeare-draft" / "vocab.json"));
  const std::string merges = slurp(source_dir / "models" / "shakespeare-draft" / "merges.txt");
  dir.write("merges.txt", merges + "Ġga te\n");
  const auto more = bpe_tokenizer::load(dir.path);
  CHECK_FALSE(specsample::same_vocabulary(more, draft));
  CHECK(specsample::vocabulary_difference(more, draft).value() ==
        "merge counts differ: 3840 vs 3839");
  {  // A spelling that differs is quoted as error messages quote file contents: control bytes
     // written \xNN, at most 80 bytes of it.
    temp_dir a, b;
    a.write("vocab.json", small_vocab_json({"aa", "<|a|>"}));
    b.write("vocab.json", small_vocab_json({"aa", "<|x|>\n\x01" + std::string(300, 'y')}));
    a.write("merges.txt", "a a\n");
    b.write("merges.txt", "a a\n");
    CHECK(specsample::vocabulary_difference(bpe_tokenizer::load(a.path), bpe_tokenizer::load(b.path)).value() ==
          "token 257 differs: \"<|a|>\" vs \"<|x|>\\x0A\\x01" + std::string(67, 'y') + "... (307 bytes)\"");
  }
  // Same tokens and merges, the last two in the other order.
  std::string swapped = merges;
  const std::size_t last = swapped.rfind('\n', swapped.size() - 2) + 1;
  const std::size_t before = swapped.rfind('\n', last - 2) + 1;
  swapped = swapped.substr(0, before) + swapped.substr(last) + swapped.substr(before, last - before);
  dir.write("merges.txt", swapped);
  const auto reordered = bpe_tokenizer::load(dir.path);
  CHECK(reordered.merge_count() == draft.merge_count());
  CHECK(specsample::vocabulary_difference(reordered, draft).value() ==
        "the merges differ (same tokens, different merge order)");
}

TEST_CASE("a merges.txt that leaves ordinary vocab tokens unreachable is rejected",
          "[tokenizer][errors]") {
  const fs::path src = source_dir / "models" / "shakespeare-draft";
  const std::string merges = slurp(src / "merges.txt");
  temp_dir dir;
  dir.write("vocab.json", slurp(src / "vocab.json"));
  // Cut after its second-to-last line (an interrupted download): "Ġgate" is produced by no merge.
  // Loaded, it would be taken for a special token and matched literally in text.
  dir.write("merges.txt", merges.substr(0, merges.rfind('\n', merges.size() - 2) + 1));
  check_load_error(dir, (dir.path / "merges.txt").string(),
                   "1 vocab token is produced by no merge (first: id 4094 \"Ġgate\")");
  dir.write("merges.txt", "");  // empty: every merge result is unreachable
  check_load_error(dir, "3839 vocab tokens are produced by no merge (first: id 256 \"Ġt\")",
                   "0 merges for 4096 tokens");
  dir.write("merges.txt", "#version: 0.2\n");
  check_load_error(dir, "3839 vocab tokens are produced by no merge", "0 merges for 4096 tokens");
  // A lost merge whose result is a piece of a character ("ĠâĢ": a space and the first two bytes
  // of "…"): its bytes are not UTF-8 text, so it cannot be a special token either.
  {
    temp_dir gpt2_dir;
    gpt2_dir.write("vocab.json", slurp(data_dir / "gpt2-tokenizer" / "vocab.json"));
    std::string gpt2_merges = slurp(data_dir / "gpt2-tokenizer" / "merges.txt");
    const std::size_t at = gpt2_merges.find("\nĠ âĢ\n");
    REQUIRE(at != std::string::npos);
    gpt2_merges.erase(at, std::string_view("\nĠ âĢ").size());
    gpt2_dir.write("merges.txt", gpt2_merges);
    check_load_error(gpt2_dir, "1 vocab token is produced by no merge (first: id 564 \"ĠâĢ\")",
                     "49999 merges for 50257 tokens");
  }
  // A token that is several pre-tokens (the GPT-2 pattern splits it) is a special token.
  std::string vocab = slurp(src / "vocab.json");
  vocab.insert(vocab.rfind('}'), ", \"<|pad|>\": 4096");
  dir.write("vocab.json", vocab);
  dir.write("merges.txt", merges);
  const auto tok = bpe_tokenizer::load(dir.path);
  CHECK(tok.special_tokens() == std::vector<token>{4095, 4096});
  CHECK(tok.encode("a<|pad|>") == std::vector<token>{tok.encode("a")[0], 4096});
}

TEST_CASE("two special tokens that stand for the same text are refused, naming both and the text",
          "[tokenizer][errors]") {
  // "<|xĠ|>" is written in byte symbols (Ġ: the space), "<|x |>" literally: both are the text
  // "<|x |>", which encode could only ever turn into one of them. Loaded, the other was unreachable.
  temp_dir dir;
  dir.write("vocab.json", small_vocab_json({"<|x|>", "<|xĠ|>", "<|x |>"}));
  dir.write("merges.txt", "#version: 0.2\n");
  check_load_error(dir, (dir.path / "vocab.json").string() + ": special tokens 257 \"<|xĠ|>\" and 258 \"<|x |>\"",
                   "both stand for the text \"<|x |>\": encode could never produce one of them");
  // Quoted in part, as every key: a spelling can be megabytes long.
  const std::string body(100000, 'k');
  dir.write("vocab.json", small_vocab_json({"<|aĠ" + body + "|>", "<|b|>", "<|a " + body + "|>"}));
  check_load_error(dir, "special tokens 256 \"<|aĠkkkk", "... (100007 bytes)\" and 258 \"<|a kkkk");
  check_message_bounded(dir);
  // Tokens of different texts load, each a special token of its own.
  dir.write("vocab.json", small_vocab_json({"<|x|>", "<|xĠ|>"}));
  CHECK(bpe_tokenizer::load(dir.path).special_tokens() == std::vector<token>{256, 257});
}

TEST_CASE("decode rejects out-of-range ids naming the id and the vocab size",
          "[tokenizer][errors]") {
  std::string out = "prefix:";
  CHECK_THROWS_WITH(gpt2().decode_append(std::vector<token>{15496, 995, -1, 262}, out),
                    Catch::Contains("token id -1 is out of range"));
  CHECK(out == "prefix:");  // as it was, not "prefix:Hello world"
  static_assert(std::is_constructible_v<specsample::stream_decoder, const bpe_tokenizer&>);
  static_assert(!std::is_constructible_v<specsample::stream_decoder, bpe_tokenizer>,
                "a decoder of a temporary tokenizer would dangle");
  for (const token bad : {token{-1}, token{50257}, token{1000000}}) {
    const std::vector<token> ids = {15496, bad};
    CHECK_THROWS_WITH(gpt2().decode(ids),
                      Catch::Contains(std::to_string(bad)) && Catch::Contains("50257"));
    CHECK_THROWS_AS(gpt2().id_to_bytes(bad), specsample::error);
  }
  CHECK_THROWS_WITH(shakespeare().decode(std::vector<token>{4096}),
                    Catch::Contains("token id 4096 is out of range for vocab size 4096"));
}

TEST_CASE("streaming decoder yields decode's text and never splits a UTF-8 character",
          "[tokenizer][stream]") {
  const auto& tok = gpt2();
  const std::vector<std::string> texts = {
      "🦙 llamas",     "你好世界", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 text",
      "😀👍🏽 ok", " ä",       "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
      "ied 4 ½ months"};
  for (const auto& text : texts) {
    INFO("text: " << text);
    const auto ids = tok.encode(text);
    specsample::stream_decoder stream(tok);
    std::string joined;
    for (const token id : ids) {
      const std::string piece = stream.feed(id);
      CHECK(valid_utf8(piece));
      CHECK(stream.pending() <= 3);
      joined += piece;
    }
    CHECK(stream.flush().empty());
    CHECK(joined == text);
  }
  // "🦙" is three tokens: nothing is emitted until the last one completes the character.
  const auto llama = tok.encode("🦙");
  REQUIRE(llama == std::vector<token>{8582, 99, 247});
  specsample::stream_decoder stream(tok);
  CHECK(stream.feed(llama[0]).empty());
  CHECK(stream.feed(llama[1]).empty());
  CHECK(stream.pending() == 3);
  CHECK(stream.feed(llama[2]) == "🦙");
  CHECK(stream.pending() == 0);
  // An out-of-range id throws and leaves the decoder as it was.
  CHECK(stream.feed(llama[0]).empty());
  CHECK_THROWS_AS(stream.feed(token{-5}), specsample::error);
  CHECK(stream.pending() == 2);
}

TEST_CASE(
    "streaming decoder passes invalid bytes through and flush returns a truncated character raw",
    "[tokenizer][stream]") {
  const auto& tok = gpt2();
  std::mt19937 rng(31337);
  std::uniform_int_distribution<int> any_byte(0, 255);
  std::uniform_int_distribution<int> length(0, 48);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    const int n = length(rng);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>(any_byte(rng)));
    const auto ids = tok.encode(s);
    specsample::stream_decoder stream(tok);
    std::string joined;
    for (const token id : ids) joined += stream.feed(id);
    joined += stream.flush();
    REQUIRE(joined == s);
  }
  specsample::stream_decoder stream(tok);
  CHECK(stream.feed(tok.encode("ok \xE4\xBD")) == "ok ");  // first two bytes of 你
  CHECK(stream.pending() == 2);
  CHECK(stream.flush() == "\xE4\xBD");
  CHECK(stream.pending() == 0);
  CHECK(stream.feed(tok.encode("\xE4\xBD"
                               "A")) ==
        "\xE4\xBD"
        "A");                                                // can never complete: emitted
  CHECK(stream.feed(tok.encode("\xED\xA0")) == "\xED\xA0");  // surrogate prefix: emitted
}

TEST_CASE("loading reports a missing directory or file with its path", "[tokenizer][errors]") {
  temp_dir dir;
  CHECK_THROWS_WITH(bpe_tokenizer::load(dir.path / "nope"),
                    Catch::Contains((dir.path / "nope").string() + ": no such directory; expected a tokenizer directory"));
  dir.write("plain", "x");
  CHECK_THROWS_WITH(bpe_tokenizer::load(dir.path / "plain"),
                    Catch::Contains((dir.path / "plain").string() + ": a file, not a directory; expected a tokenizer "
                                    "directory (vocab.json, merges.txt) (the file's own directory is " +
                                    dir.path.string() + ")"));
  // A symbolic link to a file: the directory named is the file's, not the link's.
  fs::create_directory(dir.path / "links");
  fs::create_symlink(dir.path / "plain", dir.path / "links" / "to-plain");
  CHECK_THROWS_WITH(bpe_tokenizer::load(dir.path / "links" / "to-plain"),
                    Catch::Contains("to-plain: a file, not a directory; expected a tokenizer directory (vocab.json, "
                                    "merges.txt) (the file's own directory is " + fs::canonical(dir.path).string() + ")"));
  CHECK_THROWS_WITH(bpe_tokenizer::load(dir.path / "plain" / "sub"),  // (a file on the way: ENOTDIR)
                    Catch::Contains((dir.path / "plain" / "sub").string() + ": not a directory; expected a tokenizer"));
  CHECK_THROWS_WITH(bpe_tokenizer::load(dir.path), Catch::Contains("vocab.json: file not found"));
  dir.write("vocab.json", small_vocab_json({}));
  check_load_error(dir, (dir.path / "merges.txt").string(), "file not found");
}

TEST_CASE("loading rejects a malformed vocab.json naming the file and the problem",
          "[tokenizer][errors]") {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"{\"a\": 0,", {"not valid JSON", "parse error"}},
      {"", {"not valid JSON", "vocab.json"}},
      {"[\"a\", \"b\"]", {"expected a JSON object", "an array"}},
      {"42", {"expected a JSON object", "a number"}},
      {"{}", {"the vocab is empty", "vocab.json"}},
      {"{\"a\": \"0\"}", {"id of token \"a\" is a string", "expected an integer"}},
      {"{\"a\": 0.5}", {"id of token \"a\" is 0.5", "expected an integer"}},
      {"{\"a\": [0]}", {"id of token \"a\" is an array", "expected an integer"}},
      {"{\"a\": 0, \"b\": 0}", {"duplicate id 0", "\"a\" and \"b\""}},
      {"{\"a\": 0, \"\": 1}", {"vocab.json: id 1 has an empty token string", "vocab.json"}},
      {"{\"a\": 0, \"a\": 1}", {"token \"a\" appears twice", "vocab.json"}},
      // An id outside 0..n-1 leaves one inside without a token: both named (a vocab.json missing
      // "a" = 97 blamed the last token, <|endoftext|>, for its id n).
      {"{\"a\": 0, \"b\": 2}", {"vocab.json: ids must be contiguous 0..n-1 for n = 2 tokens", "but no token has id 1 and token \"b\" has id 2"}},
      {"{\"a\": 2, \"b\": 1, \"c\": 3}", {"for n = 3 tokens", "but no token has id 0 and token \"c\" has id 3"}},
      {"{\"a\": -1}", {"no token has id 0 and token \"a\" has id -1", "contiguous"}},
      {"{\"a\": 18446744073709551615}", {"id 18446744073709551615 of token \"a\"", "out of range"}},
      // Integers past 64 bits, which the parser holds as floats: out of range too, not "not an integer".
      {"{\"a\": 100000000000000000000}", {"id 100000000000000000000 of token \"a\" is out of range", "contiguous"}},
      {"{\"a\": -9223372036854775809}", {"id -9223372036854775809 of token \"a\" is out of range", "contiguous"}},
      {"{\"a\": 1e3}", {"id of token \"a\" is 1e3", "expected an integer"}},
      // Keys and lines are quoted in part: a wrong file can hold megabytes in one.
      {"{\"" + std::string(100000, 'k') + "\": 1}", {"token \"kkkk", "... (100000 bytes)\" has id 1"}},
      {"{\"" + std::string(100000, 'k'), {"missing closing quote", "kkkk'; expected string literal"}},  // unterminated
      {"1." + std::string(100000, '0'), {"expected a JSON object", "got 1.000"}},
      {"{\"a\": 0}", {"missing the byte symbol \"Ā\" for byte 0x00", "all 256 byte symbols"}},
      // A NUL byte ends nlohmann's input: the valid vocab before it must not hide what follows.
      {small_vocab_json({}) + std::string("\0{\"extra\": 256}", 15), {"a NUL byte at offset", "not JSON text"}},
  };
  // More than max_vocab_tokens (2^22) entries: refused as the entry past the limit starts, before
  // the rest of the file is read (here with a limit of 3, as the loader's reader takes it).
  static_assert(specsample::detail::max_vocab_tokens == std::size_t{1} << 22);
  specsample::detail::vocab_reader reader("vocab.json", 3);
  CHECK_THROWS_WITH(nlohmann::json::sax_parse(std::string("{\"a\": 0, \"b\": 1, \"c\": 2, \"d\": 3, \"e\": 4}"), &reader),
                    Catch::Contains("vocab.json: more than 3 tokens; a vocab this large is refused"));
  CHECK(reader.entries.size() == 3);
  specsample::detail::vocab_reader fits("vocab.json", 3);
  CHECK(nlohmann::json::sax_parse(std::string("{\"a\": 0, \"b\": 1, \"c\": 2}"), &fits));
  for (const auto& [content, fragments] : cases) {
    INFO("vocab.json: " << content);
    temp_dir dir;
    dir.write("vocab.json", content);
    dir.write("merges.txt", "#version: 0.2\n");
    check_load_error(dir, fragments[0], fragments[1]);
    check_load_error(dir, (dir.path / "vocab.json").string(), fragments[0]);
    check_message_bounded(dir);
  }
}

TEST_CASE("loading rejects a malformed merges.txt naming the file, the line and the problem",
          "[tokenizer][errors]") {
  struct bad_merges {
    std::string content;
    int line;
    std::string problem;
  };
  const std::vector<bad_merges> cases = {
      {"#version: 0.2\na a\nab\n", 3, "expected two symbols separated by a space, found 1"},
      {"#version: 0.2\na a b\n", 2, "expected two symbols separated by a space, found 3"},
      {"#version: 0.2\nzz a\n", 2, "merge symbol \"zz\" is not in the vocab"},
      {"#version: 0.2\na zz\n", 2, "merge symbol \"zz\" is not in the vocab"},
      {"#version: 0.2\nb c\n", 2, "merge result \"bc\" is not in the vocab"},
      {"#version: 0.2\na a\r\na a\r\n", 3, "duplicate merge \"a a\""},
      {"#version: 0.2\n" + std::string(100000, 'x') + "\n", 2, "found 1 in \"xxxx"},
      {"#version: 0.2\n" + std::string("a\0\x01 a\n", 6), 2, "merge symbol \"a\\x00\\x01\" is not in the vocab"},
      // A backslash is quoted doubled, bytes that are not UTF-8 as \xNN: unambiguous text.
      {"#version: 0.2\na\\x00 a\n", 2, "merge symbol \"a\\\\x00\" is not in the vocab"},
      {"#version: 0.2\n" + std::string(100, '\x80') + "\n", 2, "found 1 in \"\\x80\\x80\\x80"},
      {"#version: 0.2\na\xFF\xFE a\n", 2, "merge symbol \"a\\xFF\\xFE\" is not in the vocab"},
  };
  for (const auto& c : cases) {
    INFO("merges.txt: " << c.content);
    temp_dir dir;
    dir.write("vocab.json", small_vocab_json({"aa"}));
    dir.write("merges.txt", c.content);
    check_load_error(dir, (dir.path / "merges.txt").string() + ":" + std::to_string(c.line) + ":",
                     c.problem);
    check_message_bounded(dir);
  }
  // Without a #version header the first line is a merge; empty lines, lines of blanks only (no
  // merge in encoder.py's split() either) and CRLF are tolerated.
  temp_dir dir;
  dir.write("vocab.json", small_vocab_json({"aa"}));
  dir.write("merges.txt", "a a\r\n\r\n \t \n");
  const auto tok = bpe_tokenizer::load(dir.path);
  CHECK(tok.merge_count() == 1);
  CHECK(tok.encode("aaa") == std::vector<token>{256, 97});
  // Lone CRs (old Mac line ends) end lines too: the #version header is skipped, not read as a
  // first line holding every merge.
  dir.write("vocab.json", small_vocab_json({"aa", "aaa"}));
  dir.write("merges.txt", "#version: 0.2\ra a\raa a\r");
  const auto cr = bpe_tokenizer::load(dir.path);
  CHECK(cr.merge_count() == 2);
  CHECK(cr.encode("aaa") == std::vector<token>{257});
  // A UTF-8 byte order mark before the header is skipped, as nlohmann skips one in vocab.json.
  dir.write("merges.txt", "\xEF\xBB\xBF#version: 0.2\na a\naa a\n");
  CHECK(bpe_tokenizer::load(dir.path).merge_count() == 2);
}
