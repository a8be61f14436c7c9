#pragma once
// Counts every heap allocation a test executable's own code makes (its objects and static
// libraries; not those made inside shared libraries such as libstdc++), for the zero-allocation
// tests.
//
// Include from exactly ONE translation unit of an executable built with
// `specsample_add_allocation_test` (it links with -Wl,--wrap= malloc, calloc, realloc,
// aligned_alloc and posix_memalign). Wrapping malloc also catches Eigen's allocations, which
// bypass operator new, and aligned_alloc the KV cache's and weights' (gpt2's
// huge_page_allocator). The wrap reaches the calls of this executable's own objects and archives,
// not those inside shared libraries, so every replaceable operator new/delete form is defined here:
// the plain forms through the wrapped malloc, the aligned ones through the wrapped aligned_alloc,
// so that new and delete always pair up (ASan checks it).

#include <Eigen/Core>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

namespace specsample::test {
inline std::atomic<std::size_t> allocations{0};

/// Heap allocations so far (malloc, calloc, realloc, aligned_alloc, posix_memalign and every
/// operator new).
inline std::size_t allocation_count() { return allocations.load(); }

/// Makes `p` observable, so the compiler cannot elide the allocation behind it (clang removes an
/// unused new/delete pair, as C++14 allows).
inline void escape(const void* p) { asm volatile("" : : "g"(p) : "memory"); }

/// The counter's own check: allocations it saw while a std::vector is made with make_unique and an
/// Eigen matrix is allocated (at least 3), and while an over-aligned object is made with new and a
/// block with aligned_alloc, gpt2's KV cache's and weights' way (exactly 2).
struct counter_check {
  std::size_t std_and_eigen, aligned;
};
inline counter_check check_the_counter() {
  counter_check seen{};
  std::size_t before = allocation_count();
  {
    auto v = std::make_unique<std::vector<int>>(100);
    Eigen::MatrixXf m(50, 50);
    m.setZero();
    escape(v.get());
    escape(v->data());
    escape(m.data());
    seen.std_and_eigen = allocation_count() - before;
  }
  struct alignas(128) line {
    float x[32];
  };
  before = allocation_count();
  auto l = std::make_unique<line>();
  void* raw = std::aligned_alloc(64, 4096);
  escape(l.get());
  escape(raw);
  seen.aligned = allocation_count() - before;
  std::free(raw);
  return seen;
}
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
void* __real_aligned_alloc(std::size_t, std::size_t);
int __real_posix_memalign(void**, std::size_t, std::size_t);
void* __wrap_aligned_alloc(std::size_t alignment, std::size_t n) {
  ++specsample::test::allocations;
  return __real_aligned_alloc(alignment, n);
}
int __wrap_posix_memalign(void** p, std::size_t alignment, std::size_t n) {
  ++specsample::test::allocations;
  return __real_posix_memalign(p, alignment, n);
}
}

namespace specsample::test {
// An aligned operator new's block: aligned_alloc wants a size that is a multiple of the alignment.
inline void* aligned_block(std::size_t n, std::align_val_t alignment) noexcept {
  const auto a = static_cast<std::size_t>(alignment);
  if (n > SIZE_MAX - (a - 1)) return nullptr;  // (rounded up it would wrap to a small block)
  return std::aligned_alloc(a, n == 0 ? a : (n + a - 1) / a * a);
}
}  // namespace specsample::test

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
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = specsample::test::aligned_block(n, a)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return specsample::test::aligned_block(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return specsample::test::aligned_block(n, a);
}
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
