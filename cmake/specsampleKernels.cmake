# specsample::kernels: the library with the GPT-2 model's SIMD kernels, and its loading and forward
# pass, compiled once, in three TUs of their own, instead of in every TU that runs the model
# (models/gpt2/simd.hpp, "Where the kernels are compiled"; models/gpt2/model.hpp; docs/gpt2.md).
# Every TU linked to it is built with SPECSAMPLE_SEPARATE_KERNELS. Built only when a target links
# it, in the project that defines it, with that project's flags. One definition for both ways of
# adopting specsample: the source tree (CMakeLists.txt) and an installed package
# (specsampleConfig.cmake, the TUs installed beside it).
#   specsample_add_kernels(<directory of the three TUs> <the specsample target to link>)
function(specsample_add_kernels src_dir specsample_target)
  add_library(specsample_kernels STATIC EXCLUDE_FROM_ALL "${src_dir}/matmul_kernels.cpp" "${src_dir}/attention_kernels.cpp"
    "${src_dir}/gpt2_model.cpp")
  add_library(specsample::kernels ALIAS specsample_kernels)
  target_link_libraries(specsample_kernels PUBLIC ${specsample_target})
  target_compile_definitions(specsample_kernels PUBLIC SPECSAMPLE_SEPARATE_KERNELS)
endfunction()
