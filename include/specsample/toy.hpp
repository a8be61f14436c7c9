#pragma once
/// @file toy.hpp
/// Toy models: Markov / n-gram tables and the callable adapter.

#include <specsample/models/toy/callable_model.hpp>
#include <specsample/models/toy/markov.hpp>
