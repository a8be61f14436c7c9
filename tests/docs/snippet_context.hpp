#pragma once
// What the documentation's C++ snippets take for granted (tests/docs/extract_snippets.cpp): the
// library and the standard headers their statements use. The names each page's snippets use
// without declaring them are in <page>.context beside this file.
#include <specsample/specsample.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>
