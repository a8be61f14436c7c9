#pragma once
/// @file sampling.hpp
/// The model-agnostic core: the sampling loops, warping, verification, drafters and the
/// performance model, for a program that brings its own models. It parses none of the GPT-2
/// model, its kernels or the tokenizer (<specsample/gpt2.hpp>, <specsample/tokenizer.hpp>), which
/// the umbrella <specsample/specsample.hpp> adds, with the toy models (<specsample/toy.hpp>).

#include <specsample/concepts.hpp>
#include <specsample/drafters/fallback.hpp>
#include <specsample/drafters/ngram.hpp>
#include <specsample/error.hpp>
#include <specsample/sampling/drafter.hpp>
#include <specsample/sampling/loop.hpp>
#include <specsample/sampling/params.hpp>
#include <specsample/sampling/random.hpp>
#include <specsample/sampling/stats.hpp>
#include <specsample/sampling/tuning.hpp>
#include <specsample/sampling/verify.hpp>
#include <specsample/sampling/warp.hpp>
