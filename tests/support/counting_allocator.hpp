#pragma once
// Counts every heap allocation of a test executable, for the zero-allocation tests.
//
// Include from exactly ONE translation unit of an executable built with
// `specsample_add_allocation_test` (it links with -Wl,--wrap=malloc,calloc,realloc). Wrapping
// malloc also catches Eigen's allocations, which bypass operator new; every replaceable
// non-aligned operator new/delete form is routed through the wrapped malloc so that new and
// delete always pair up (ASan checks it). The aligned forms stay the library's.

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace specsample::test {
inline std::atomic<std::size_t> allocations{0};

/// Heap allocations so far (malloc, calloc, realloc and every operator new).
inline std::size_t allocation_count() { return allocations.load(); }

/// Makes `p` observable, so the compiler cannot elide the allocation behind it (clang removes an
/// unused new/delete pair, as C++14 allows).
inline void escape(const void* p) { asm volatile("" : : "g"(p) : "memory"); }
}  // namespace specsample::test

extern "C" {
void* __real_malloc(std::size_t);
void* __real_calloc(std::size_t, std::size_t);
void* __real_realloc(void*, std::size_t);
void* __wrap_malloc(std::size_t n) {
  ++specsample::test::allocations;
  return __real_malloc(n);
}
void* __wrap_calloc(std::size_t n, std::size_t m) {
  ++specsample::test::allocations;
  return __real_calloc(n, m);
}
void* __wrap_realloc(void* p, std::size_t n) {
  ++specsample::test::allocations;
  return __real_realloc(p, n);
}
}

void* operator new(std::size_t n) {
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n == 0 ? 1 : n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return std::malloc(n == 0 ? 1 : n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
