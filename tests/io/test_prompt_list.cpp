#include <specsample/io/prompt_list.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace {
// This process's own directory under the temporary directory, removed at exit: files of fixed
// names there cannot meet another run's.
const std::filesystem::path& scratch_dir() {
  static const struct dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("specsample-prompt-list-" + std::to_string(::getpid()));
    dir() {
      std::filesystem::remove_all(path);
      std::filesystem::create_directories(path);
    }
    ~dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } d;
  return d.path;
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto path = scratch_dir() / name;
  std::ofstream f(path, std::ios::binary);
  f << text;
  f.close();
  REQUIRE(f.good());
  return path;
}
}  // namespace

TEST_CASE("a prompt list reads one prompt per line with escapes, skipping comments and blank lines",
          "[io][prompts]") {
  const auto path = write_file("specsample_prompts_ok.txt", "# a comment\n\nROMEO:\\nO\\tsoft\\\\light\nJULIET:\n");
  const auto prompts = specsample::io::read_prompt_list(path);
  REQUIRE(prompts.size() == 2);
  CHECK(prompts[0] == "ROMEO:\nO\tsoft\\light");
  CHECK(prompts[1] == "JULIET:");
  // The same with CRLF line ends (a file from Windows): the same two prompts, no '\r' kept.
  const auto crlf = specsample::io::read_prompt_list(
      write_file("specsample_prompts_crlf.txt", "# a comment\r\n\r\nROMEO:\\nO\\tsoft\\\\light\r\nJULIET:\r\n"));
  CHECK(crlf == prompts);
  // And with lone CRs (old Mac line ends); an LF followed by a CR is two line ends.
  const auto cr = write_file("specsample_prompts_cr.txt", "# a comment\r\rROMEO:\\nO\\tsoft\\\\light\rJULIET:\r");
  CHECK(specsample::io::read_prompt_list(cr) == prompts);
  CHECK(specsample::io::read_prompt_list(write_file("specsample_prompts_lfcr.txt", "ROMEO:\n\rJULIET:\n")) ==
        std::vector<std::string>{"ROMEO:", "JULIET:"});
  // A UTF-8 byte order mark (an editor's) before the first line is not part of it: the comment
  // stays a comment (it was read as a prompt). Lines of spaces and tabs are blank too (they were
  // prompts); spaces inside a prompt are kept.
  CHECK(specsample::io::read_prompt_list(write_file("specsample_prompts_bom.txt",
                                                    "\xEF\xBB\xBF# a comment\n  \n\t \nROMEO:\n JULIET: \n")) ==
        std::vector<std::string>{"ROMEO:", " JULIET: "});
  CHECK(specsample::io::read_prompt_list(write_file("specsample_prompts_bom2.txt", "\xEF\xBB\xBFROMEO:\n")) ==
        std::vector<std::string>{"ROMEO:"});
  CHECK(specsample::io::read_prompt_list(write_file("specsample_prompts_bom3.txt", "ROMEO:\n\xEF\xBB\xBFJULIET:\n")) ==
        std::vector<std::string>{"ROMEO:", "\xEF\xBB\xBFJULIET:"});  // only the file's first bytes
}

TEST_CASE("a bad prompt list is reported with the file, the line and the problem", "[io][prompts]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(write_file("specsample_prompts_esc.txt", "ok\nbad \\q\n")),
                    Contains("specsample_prompts_esc.txt:2: unknown escape: a backslash before 'q' (the escapes are "
                             "\\n, \\t and \\\\)"));
  // The character after the backslash is quoted visibly, whatever it is (a space or a tab was
  // invisible). A NUL byte or a byte that is not UTF-8 never gets there: the file is refused first
  // (the next test).
  for (const auto& [text, quoted] : {std::pair<std::string, std::string>{"a\\\tb\n", "'\\x09'"},
                                     {"a\\\x7F" "b\n", "'\\x7F'"},
                                     {"a\\ b\n", "' '"},
                                     {"a\\\xC3\xA9\n", "'\xC3\xA9'"}}) {
    CHECK_THROWS_WITH(specsample::io::read_prompt_list(write_file("specsample_prompts_esc2.txt", text)),
                      Contains(":1: unknown escape: a backslash before " + quoted + " ("));
  }
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(write_file("specsample_prompts_dangling.txt", "end\\")),
                    Contains(":1: dangling backslash"));
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(write_file("specsample_prompts_empty.txt", "# only\n\n")),
                    Contains("no prompts"));
  CHECK_THROWS_WITH(specsample::io::read_prompt_list("/nonexistent/prompts.txt"), Contains("file not found"));
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(scratch_dir()), Contains("is a directory"));
  const auto fifo = scratch_dir() / "specsample_prompts_fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // opening it would block: rejected instead
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(fifo), Contains("not a regular file"));
}

namespace {
// `ascii` in UTF-16 or UTF-32, little or big endian (`width` 2 or 4 bytes a character).
std::string widened(std::string_view ascii, std::size_t width, bool big_endian) {
  std::string out;
  for (const char c : ascii) {
    std::string unit(width, '\0');
    unit[big_endian ? width - 1 : 0] = c;
    out += unit;
  }
  return out;
}
}  // namespace

TEST_CASE("a prompt file that is not UTF-8 text is refused naming the file, the encoding or the byte",
          "[io][prompts]") {
  using Catch::Contains;
  const std::string text = "# a comment\nROMEO:\\nO soft\nJULIET:\n";
  // With a byte order mark, a UTF-16 or UTF-32 file (Windows Notepad's "Unicode") is named as such:
  // it was read as prompts of garbage, its \n escapes "unknown escapes".
  struct encoded {
    std::string name, bom, bom_hex;
    std::size_t width;
    bool big_endian;
  };
  for (const auto& e : {encoded{"UTF-16 LE", "\xFF\xFE", "FF FE", 2, false},
                        encoded{"UTF-16 BE", "\xFE\xFF", "FE FF", 2, true},
                        encoded{"UTF-32 LE", std::string("\xFF\xFE\0\0", 4), "FF FE 00 00", 4, false},
                        encoded{"UTF-32 BE", std::string("\0\0\xFE\xFF", 4), "00 00 FE FF", 4, true}}) {
    INFO(e.name);
    const auto path = write_file("specsample_prompts_wide.txt", e.bom + widened(text, e.width, e.big_endian));
    CHECK_THROWS_WITH(specsample::io::read_prompt_list(path),
                      path.string() + ": looks like " + e.name + " text (it starts with the byte order mark " +
                          e.bom_hex + "); save it as UTF-8");
  }
  // Without one, its first NUL byte gives it away: the line and the byte offset (from 0) named.
  const auto nul = [](const std::string& at) {
    return ": not UTF-8 text: a NUL byte at byte offset " + at +
           " (UTF-16 or UTF-32 without a byte order mark?); save it as UTF-8";
  };
  const auto read = [](const std::string& name, const std::string& bytes) {
    return specsample::io::read_prompt_list(write_file(name, bytes));
  };
  CHECK_THROWS_WITH(read("specsample_prompts_u16.txt", widened(text, 2, false)),
                    Contains("specsample_prompts_u16.txt:1" + nul("1")));
  CHECK_THROWS_WITH(read("specsample_prompts_u32.txt", widened(text, 4, true)),
                    Contains("specsample_prompts_u32.txt:1" + nul("0")));
  // A NUL byte in UTF-8 text: its line (LF, CRLF and CR ends counted as read_prompt_list counts them).
  CHECK_THROWS_WITH(read("specsample_prompts_nul.txt", std::string("ROMEO:\r\n\rJU\0LIET:\n", 18)),
                    Contains("specsample_prompts_nul.txt:3" + nul("11")));
  CHECK_THROWS_WITH(read("specsample_prompts_nul2.txt", std::string("# \0\n", 4)),
                    Contains("specsample_prompts_nul2.txt:1" + nul("2")));  // (in a comment too)
  // Bytes that are not UTF-8 (Latin-1 text, a character cut short, an overlong form, a surrogate):
  // refused, not encoded byte by byte into tokens the model never saw for that text.
  using case_ = std::pair<std::string, std::string>;  // the text, then the line and what is named
  for (const auto& [bad, where] : {case_{"ROMEO:\nO caf\xE9\n", "2: byte 0xE9 at byte offset 12"},
                                   case_{"\xEF\xBB\xBFok\r\rab\xC3", "3: byte 0xC3 at byte offset 9"},  // (cut short)
                                   case_{"a\n\xC0\xAF\n", "2: byte 0xC0 at byte offset 2"},  // (an overlong '/')
                                   case_{"a\xED\xA0\x80\n", "1: byte 0xED at byte offset 1"},  // (U+D800)
                                   case_{"\xEF\xBB", "1: byte 0xEF at byte offset 0"}}) {  // (a BOM cut short)
    const std::string line = where.substr(0, where.find(':')), byte = where.substr(where.find(':') + 2);
    CHECK_THROWS_WITH(read("specsample_prompts_latin1.txt", bad),
                      Contains("specsample_prompts_latin1.txt:" + line + ": not UTF-8 text: " + byte +
                               " begins no valid character; save it as UTF-8"));
  }
  // UTF-8 beyond ASCII is read as it is.
  CHECK(read("specsample_prompts_utf8.txt", "caf\xC3\xA9 \xF0\x9F\xA6\x99\n") ==
        std::vector<std::string>{"caf\xC3\xA9 \xF0\x9F\xA6\x99"});
}

TEST_CASE("check_prompt_text checks a whole-file prompt and returns it without a UTF-8 byte order mark",
          "[io][prompts]") {
  using specsample::io::check_prompt_text;
  // Raw text, no escapes or comments read: the text as it is, a UTF-8 BOM at its start dropped
  // (read_prompt_list drops it too); a view of the same bytes.
  const std::string text = "\xEF\xBB\xBF# not a comment\\n\r\ncaf\xC3\xA9\n";
  const std::string_view checked = check_prompt_text(text, "prompt.txt");
  CHECK(checked == "# not a comment\\n\r\ncaf\xC3\xA9\n");
  CHECK(checked.data() == text.data() + 3);
  CHECK(check_prompt_text("ROMEO:\xEF\xBB\xBF", "prompt.txt") == "ROMEO:\xEF\xBB\xBF");  // (a BOM later is text)
  CHECK(check_prompt_text("", "prompt.txt").empty());
  CHECK(check_prompt_text("\xEF\xBB\xBF", "prompt.txt").empty());
  // Refusals name the label given (a path, or "standard input").
  CHECK_THROWS_WITH(check_prompt_text(std::string_view("\xFF\xFEh\0i\0", 6), "standard input"),
                    "standard input: looks like UTF-16 LE text (it starts with the byte order mark FF FE); save it as "
                    "UTF-8");
  CHECK_THROWS_WITH(check_prompt_text(std::string_view("hi\0", 3), "standard input"),
                    Catch::StartsWith("standard input:1: not UTF-8 text: a NUL byte at byte offset 2 ("));
  CHECK_THROWS_WITH(check_prompt_text("hi\n\x80", "p.txt"),
                    "p.txt:2: not UTF-8 text: byte 0x80 at byte offset 3 begins no valid character; save it as UTF-8");
}

TEST_CASE("check_prompt_argument holds a prompt given on the command line to UTF-8, naming the flag",
          "[io][prompts]") {
  using specsample::io::check_prompt_argument;
  const std::string text = "caf\xC3\xA9\n\xEF\xBB\xBF";  // returned as given: a view of the same bytes
  CHECK(check_prompt_argument(text, "--prompt").data() == text.data());
  CHECK(check_prompt_argument(text, "--prompt").size() == text.size());
  CHECK_THROWS_WITH(check_prompt_argument("", "--prompt"), "--prompt is empty: a prompt needs at least one character");
  CHECK_THROWS_WITH(check_prompt_argument("ab\xFF\xFE", "--prompt"),
                    "--prompt: not UTF-8 text: byte 0xFF at byte offset 2 begins no valid character (is the terminal "
                    "set to another encoding?)");
  // Strict RFC 3629, as for files: an overlong, a surrogate, a character cut short.
  CHECK_THROWS_WITH(check_prompt_argument("x\xC0\xAF", "--prompt"), Catch::Contains("byte 0xC0 at byte offset 1"));
  CHECK_THROWS_WITH(check_prompt_argument("\xED\xA0\x80", "--prompt"), Catch::Contains("byte 0xED at byte offset 0"));
  CHECK_THROWS_WITH(check_prompt_argument("ok\xE2\x82", "--prompt"), Catch::Contains("byte 0xE2 at byte offset 2"));
}
