// The attention kernels of the GPT-2 model, compiled once for a program built with
// SPECSAMPLE_SEPARATE_KERNELS (the CMake target specsample::kernels; models/gpt2/simd.hpp,
// "Where the kernels are compiled").
#define SPECSAMPLE_DEFINE_ATTENTION_KERNELS
#include <specsample/models/gpt2/simd.hpp>
