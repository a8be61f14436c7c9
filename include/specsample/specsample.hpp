#pragma once
/// @file specsample.hpp
/// Umbrella header: everything specsample provides for generation — the model-agnostic core
/// (<specsample/sampling.hpp>, enough for a program that brings its own models, in ~60% of the
/// compile time), the toy models, the GPT-2 model and the tokenizer. Three headers stand apart,
/// included on their own: the statistical test kit <specsample/testing/distribution.hpp>
/// (`testing::speculative_fit`, `testing::chi_square_test`, ...), and for command-line programs the
/// prompt-file reader <specsample/io/prompt_list.hpp> and the number parser
/// <specsample/io/number.hpp> (`io::parse_number`).

#include <specsample/sampling.hpp>
#include <specsample/toy.hpp>
#include <specsample/gpt2.hpp>
#include <specsample/tokenizer.hpp>
