// extract_snippets: the documentation's C++ as one translation unit, so that the build checks it
// compiles against the headers as they are (tests/docs/CMakeLists.txt).
//
// usage: extract_snippets OUT.cpp SOURCE_DIR CONTEXT_DIR PAGE.md...
//
// Every C++ code block of each page (a path relative to SOURCE_DIR) — fenced by ``` or ~~~, its
// info string's first word cpp, c++ or cxx in any case — becomes part of one function per page,
// never called: the page's blocks in order, each in a scope nested in the one before, so a block
// sees the names earlier blocks declared and may declare them again. Blocks are statements (a
// block that defines a function or a template cannot be checked this way). The names a page's
// blocks use without declaring them (a draft, a target, a pool...) come from CONTEXT_DIR/<page
// with '/' as '_'>.context, put first in the function, when it exists; snippet_context.hpp, beside
// it, includes the library and the standard headers the statements use, so a block's own
// #include lines are not checked for being enough. #include lines move to the top of the file;
// #line directives point the compiler's messages at the page. A page without a C++ block
// contributes nothing; no block in any page is an error (a check of nothing would pass).

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The lines of `text`, each without a trailing carriage return (CRLF pages).
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// A fence: three or more backticks or tildes, indented or not (a list item's are).
struct fence {
  char mark = 0;
  std::size_t length = 0;
  std::string info;  // the info string's first word, lowercased
};

bool parse_fence(const std::string& line, fence& f) {
  const auto indent = line.find_first_not_of(' ');
  if (indent == std::string::npos) return false;
  const char mark = line[indent];
  if (mark != '`' && mark != '~') return false;
  const auto end = line.find_first_not_of(mark, indent);
  const std::size_t length = (end == std::string::npos ? line.size() : end) - indent;
  if (length < 3) return false;
  f.mark = mark;
  f.length = length;
  std::istringstream rest(end == std::string::npos ? std::string() : line.substr(end));
  rest >> f.info;
  for (char& c : f.info) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return true;
}

// The fence closing `open`: the same mark, at least as long, nothing after it.
bool closes(const std::string& line, const fence& open) {
  fence f;
  return parse_fence(line, f) && f.mark == open.mark && f.length >= open.length && f.info.empty() &&
         trimmed(line).find_first_not_of(open.mark) == std::string::npos;
}

bool is_include(const std::string& line) {
  const std::string t = trimmed(line);
  return !t.empty() && t[0] == '#' && trimmed(t.substr(1)).rfind("include", 0) == 0;
}

std::string quoted(const std::string& path) {
  std::string out = "\"";
  for (const char c : path) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) {
    std::cerr << "usage: extract_snippets OUT.cpp SOURCE_DIR CONTEXT_DIR PAGE.md...\n";
    return 2;
  }
  const fs::path out_path = argv[1], source = argv[2], contexts = argv[3];
  std::ostringstream includes;
  std::set<std::string> seen;
  std::ostringstream functions;
  std::size_t blocks = 0, pages = 0;
  for (int i = 4; i < argc; ++i) {
    const std::string page = argv[i];
    const std::string where = quoted((source / page).string());
    const std::vector<std::string> lines = lines_of(read(source / page));
    std::ostringstream body;
    std::size_t page_blocks = 0;
    for (std::size_t n = 0; n < lines.size(); ++n) {
      fence open;
      if (!parse_fence(lines[n], open)) continue;
      const bool cpp = open.info == "cpp" || open.info == "c++" || open.info == "cxx";
      const std::size_t first = n + 1;  // the block's first line, 0-based (its line number - 1)
      for (++n; n < lines.size() && !closes(lines[n], open); ++n) {}
      if (n == lines.size()) {
        throw std::runtime_error(page + ": the code block opened at line " + std::to_string(first) + " never closes");
      }
      if (!cpp) continue;
      ++page_blocks;
      body << "{\n#line " << first + 1 << ' ' << where << '\n';
      for (std::size_t k = first; k < n; ++k) {
        const std::string& line = lines[k];
        if (is_include(line)) {
          if (seen.insert(trimmed(line)).second) includes << "#line " << k + 1 << ' ' << where << '\n' << trimmed(line) << '\n';
          body << '\n';  // (keeps the #line numbering)
        } else {
          body << line << '\n';
        }
      }
    }
    if (page_blocks == 0) continue;
    blocks += page_blocks;
    ++pages;
    // A name of its own per page (docs/a-b.md and docs/a_b.md would otherwise share one).
    std::string name = "page" + std::to_string(i - 4) + "_" + page;
    for (char& c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    }
    std::string context_name = page;
    for (char& c : context_name) {
      if (c == '/') c = '_';
    }
    const fs::path context = contexts / (context_name + ".context");
    functions << "[[maybe_unused]] void " << name << "() {\n";
    if (fs::exists(context)) {
      std::string text = read(context);
      if (!text.empty() && text.back() != '\n') text += '\n';
      functions << "#line 1 " << quoted(context.string()) << '\n' << text;
    }
    functions << body.str() << std::string(page_blocks, '}') << "\n}\n\n";
  }
  if (blocks == 0) throw std::runtime_error("no C++ code block in any page: nothing to check");
  std::string head = "// Generated by tests/docs/extract_snippets.cpp from the documentation's C++ blocks: do not edit.\n" +
                     includes.str();
  const auto head_lines = static_cast<std::size_t>(std::count(head.begin(), head.end(), '\n'));
  head += "#line " + std::to_string(head_lines + 2) + ' ' + quoted(out_path.string()) + '\n';  // back to this file
  std::ofstream out(out_path, std::ios::binary);
  out << head
      << "#include \"snippet_context.hpp\"\n\n"
      << "// Snippets declare what they show, used or not.\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-variable\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-but-set-variable\"\n\n"
      << "namespace specsample_doc_snippets {\n\n"
      << functions.str() << "}  // namespace specsample_doc_snippets\n";
  if (!out.flush()) throw std::runtime_error("cannot write " + out_path.string());
  std::cout << "extract_snippets: " << blocks << " C++ blocks from " << pages << " of " << argc - 4 << " pages\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "extract_snippets: error: " << e.what() << '\n';
  return 1;
}
