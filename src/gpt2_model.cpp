// The GPT-2 model's loading, construction and forward pass, compiled once for a program built with
// SPECSAMPLE_SEPARATE_KERNELS (the CMake target specsample::kernels; models/gpt2/model.hpp).
#define SPECSAMPLE_DEFINE_GPT2_MODEL
#include <specsample/models/gpt2/model.hpp>
