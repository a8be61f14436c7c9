#pragma once
/// @file tokenizer.hpp
/// Public entry for tokenization: `bpe_tokenizer` (GPT-2 byte-level BPE), `stream_decoder`,
/// `same_vocabulary` / `vocabulary_difference` / `check_same_vocabulary` / `check_model_vocabulary`.
/// See docs/tokenizer.md.

#include <specsample/io/bpe_tokenizer.hpp>
