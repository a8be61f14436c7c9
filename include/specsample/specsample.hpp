#pragma once
/// @file specsample.hpp
/// Umbrella header: everything specsample provides for generation. Three headers stand apart, included
/// on their own: the statistical test kit <specsample/testing/distribution.hpp>
/// (`testing::speculative_fit`, `testing::chi_square_test`, ...), and for command-line programs the
/// prompt-file reader <specsample/io/prompt_list.hpp> and the number parser
/// <specsample/io/number.hpp> (`io::parse_number`).

#include <specsample/concepts.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/stats.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>
#include <specsample/toy.hpp>
#include <specsample/gpt2.hpp>
#include <specsample/tokenizer.hpp>
#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/sampling/drafter.hpp>
#include <specsample/sampling/tuning.hpp>
