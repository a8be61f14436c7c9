#include <specsample/io/prompt_list.hpp>

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <sys/stat.h>

namespace {
std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path, std::ios::binary) << text;
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
  CHECK(specsample::io::read_prompt_list(write_file("specsample_prompts_cr.txt",
                                                    "# a comment\r\rROMEO:\\nO\\tsoft\\\\light\rJULIET:\r")) == prompts);
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
  // The character after the backslash is quoted visibly, whatever it is (a NUL cut the message, a
  // byte that is not UTF-8 made it invalid UTF-8, a space or a tab was invisible).
  for (const auto& [text, quoted] : {std::pair<std::string, std::string>{std::string("a\\\0b\n", 5), "'\\x00'"},
                                     {"a\\\xFF" "b\n", "'\\xFF'"},
                                     {"a\\\tb\n", "'\\x09'"},
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
  const auto dir = std::filesystem::temp_directory_path();
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(dir), Contains("is a directory"));
  const auto fifo = dir / "specsample_prompts_fifo";
  std::filesystem::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);  // opening it would block: rejected instead
  CHECK_THROWS_WITH(specsample::io::read_prompt_list(fifo), Contains("not a regular file"));
  std::filesystem::remove(fifo);
}
