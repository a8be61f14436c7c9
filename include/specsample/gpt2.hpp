#pragma once
/// @file gpt2.hpp
/// Public entry point for the GPT-2 reference model: `specsample::gpt2::model::load(dir)`.
/// See docs/gpt2.md.

#include <specsample/models/gpt2/config.hpp>
#include <specsample/models/gpt2/kernels.hpp>
#include <specsample/models/gpt2/model.hpp>
#include <specsample/models/gpt2/weights.hpp>
