#pragma once
/// @file thread_pool.hpp
/// A small persistent thread pool with low wake latency for the GPT-2 kernels.
///
/// Workers spin briefly (`spin`, 50 µs by default) after their last task, then sleep on a futex
/// (`std::atomic::wait`). A `parallel_for` issued while the workers still spin starts within
/// nanoseconds and costs no system call; one issued later pays one `notify_all`. The caller
/// runs chunks too and takes over any chunk no worker has claimed yet, so a sleeping or
/// descheduled worker delays nothing (the model only splits ops that are big enough:
/// `options::min_parallel_work`). No allocation and no lock per `parallel_for`.
///
/// A pool may be shared, e.g. by a draft and its target (`options::pool`): one set of workers
/// serves both and stays awake between their calls. A `parallel_for` issued while the pool runs
/// another one (from a second thread, or from inside a chunk) runs its chunks on its own calling
/// thread, in order, with the same chunk indices: slower, never wrong, as long as per-chunk
/// scratch belongs to the caller (each `gpt2::model` has its own).

#include <specsample/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specsample::gpt2 {

namespace detail {
/// A polite busy-wait hint (PAUSE on x86).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}
}  // namespace detail

/// The hardware threads this process may run on: its CPU affinity's count on Linux (`taskset -c 0`
/// gives 1), else std::thread::hardware_concurrency() (0: unknown).
[[nodiscard]] inline std::size_t usable_hardware_threads() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return static_cast<std::size_t>(CPU_COUNT(&set));
#endif
  return std::thread::hardware_concurrency();
}

/// A fixed set of worker threads (the caller is worker 0) that split a loop into contiguous
/// chunks. Persistent: no thread creation, no lock and no allocation per `parallel_for`.
///
/// Chunks are claimed, not assigned: the caller runs chunk 0, then claims any chunk no worker
/// has started yet (a worker that is asleep or descheduled on a busy machine never holds the
/// caller up), then waits only for chunks already being run. Chunk c covers [n·c/w, n·(c+1)/w)
/// and is passed `c` as its worker index whoever runs it, so results and per-chunk scratch do
/// not depend on which thread ran what.
class thread_pool {
 public:
  /// How long an idle worker spins before it sleeps.
  static constexpr std::chrono::microseconds default_spin{50};
  /// The longest spin a pool keeps: a longer one (`microseconds::max()` for "never sleep") is
  /// this, a day; a negative one is 0. (Added to the clock's now, a spin near the maximum would
  /// overflow into a deadline in the past: no spin at all.)
  static constexpr std::chrono::microseconds max_spin{std::chrono::hours(24)};

  /// The workers a pool asked for `threads` has: `threads`, or for 0 one per hardware thread the
  /// process may run on (`usable_hardware_threads()`, 1 to `max_threads`).
  [[nodiscard]] static std::size_t resolved_threads(std::size_t threads) noexcept {
    return threads != 0 ? threads : std::clamp<std::size_t>(usable_hardware_threads(), 1, max_threads);
  }

  /// `threads` workers in total including the calling thread; 0 = one per usable hardware thread
  /// (at most `max_threads`); idle workers spin for `spin` (clamped to [0, `max_spin`]), then sleep.
  /// Throws `error` for more than `max_threads`.
  explicit thread_pool(std::size_t threads, std::chrono::microseconds spin = default_spin)
      : spin_(std::clamp(spin, std::chrono::microseconds{0}, max_spin)) {
    if (threads > max_threads) {
      throw error(fmt::format("thread_pool: {} threads requested; at most {}", threads, max_threads));
    }
    threads = resolved_threads(threads);
    workers_.reserve(threads - 1);
    try {
      for (std::size_t id = 1; id < threads; ++id) workers_.emplace_back([this] { run(); });
    } catch (const std::exception& e) {  // e.g. no memory for a stack: join those started
      const std::size_t started = workers_.size();
      stop();
      throw error(fmt::format("thread_pool: cannot start thread {} of {}: {}", started + 1, threads,
                              e.what()));
    }
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() { stop(); }

  /// Most threads a pool runs; more are refused. A limit of policy, well below the 65535 chunks
  /// the ticket's 16 bits can count (a task has one per worker at most).
  static constexpr std::size_t max_threads = 1024;

  /// Number of workers, the calling thread included.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size() + 1; }

  /// Calls `f(begin, end, chunk)` on disjoint contiguous chunks covering [0, n), w = min(size(),
  /// n) chunks, chunk c = [n·c/w, n·(c+1)/w), and returns when all are done. If a chunk throws,
  /// chunks not started yet may be skipped, and the first exception is rethrown on the calling
  /// thread once no chunk runs any more (the pool stays whole). Thread-safe: while the workers run
  /// one call, any other call (from another thread, or from inside a chunk) runs all its chunks
  /// on its calling thread.
  template <class F>
  void parallel_for(std::size_t n, F&& f) {
    const std::size_t w = std::min(size(), n);
    if (w <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
      for (std::size_t c = 0; c < w; ++c) f(n * c / w, n * (c + 1) / w, c);
      return;
    }
    using fn_t = std::remove_reference_t<F>;
    // The task fields are published by the release store of ticket_ and read only by a thread
    // that then claims a chunk of this task with an acquire CAS; the caller rewrites them only
    // after every claimed chunk reported done, so they never race.
    ctx_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
    call_ = [](void* ctx, std::size_t b, std::size_t e, std::size_t id) {
      (*static_cast<fn_t*>(ctx))(b, e, id);
    };
    n_ = n;
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
    ticket_.store(make_ticket(gen, w, 1), std::memory_order_release);
    generation_.store(gen, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) generation_.notify_all();
    run_chunk(0, n / w, 0);
    while (claim_and_run(gen)) {
    }
    for (unsigned spins = 0; done_.load(std::memory_order_acquire) != w - 1; ++spins) {
      if (spins < 1024) {
        detail::cpu_relax();
      } else {
        std::this_thread::yield();  // a worker holding a chunk was descheduled
      }
    }
    // The exception is taken before the pool is released: another caller may take it at once and
    // reset failed_ and error_ for its own task.
    std::exception_ptr failure = failed_.load(std::memory_order_relaxed) ? std::exchange(error_, nullptr) : nullptr;
    busy_.store(false, std::memory_order_release);
    if (failure) std::rethrow_exception(std::move(failure));
  }

 private:
  // Wakes every worker to exit, and joins them.
  void stop() noexcept {
    stop_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  // ticket_: generation (bits 63..32) | chunks of the task (31..16) | next unclaimed chunk (15..0)
  static constexpr std::uint64_t make_ticket(std::uint32_t gen, std::size_t chunks,
                                             std::size_t next) noexcept {
    return (std::uint64_t{gen} << 32) | (std::uint64_t{chunks} << 16) | std::uint64_t{next};
  }

  /// Claims and runs one chunk of task `gen`; false when none is left (or the task is over).
  bool claim_and_run(std::uint32_t gen) {
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const auto chunks = static_cast<std::size_t>((t >> 16) & 0xffffu);
      const auto next = static_cast<std::size_t>(t & 0xffffu);
      if (static_cast<std::uint32_t>(t >> 32) != gen || next >= chunks) return false;
      if (ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
        run_chunk(n_ * next / chunks, n_ * (next + 1) / chunks, next);
        done_.fetch_add(1, std::memory_order_release);
        return true;
      }
    }
  }

  // Runs a chunk of the current task unless one has thrown; the first exception is kept for the
  // caller (error_ is written by the thread that set failed_ first, before its done_ increment,
  // and read by the caller after every chunk is done: done_'s release / acquire orders them).
  void run_chunk(std::size_t b, std::size_t e, std::size_t id) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      call_(ctx_, b, e, id);
    } catch (...) {
      if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  void run() {
    using clock = std::chrono::steady_clock;
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t g = generation_.load(std::memory_order_acquire);
      if (g == seen) {
        const auto deadline = clock::now() + spin_;
        for (unsigned i = 1; (g = generation_.load(std::memory_order_acquire)) == seen; ++i) {
          detail::cpu_relax();
          if (i % 64 == 0 && clock::now() >= deadline) {
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            generation_.wait(seen, std::memory_order_seq_cst);
            sleepers_.fetch_sub(1, std::memory_order_seq_cst);
          }
        }
      }
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      while (claim_and_run(g)) {
      }
    }
  }

  std::vector<std::thread> workers_;
  std::chrono::microseconds spin_;
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<std::uint64_t> ticket_{0};
  alignas(64) std::atomic<std::size_t> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> busy_{false};  // a parallel_for holds the workers
  std::atomic<bool> failed_{false};  // a chunk of the current task threw: error_ holds it
  std::exception_ptr error_;
  // The task (written by the caller only while no other thread reads it).
  alignas(64) std::size_t n_ = 0;
  void* ctx_ = nullptr;
  void (*call_)(void*, std::size_t, std::size_t, std::size_t) = nullptr;
};

/// What to tell someone who asked for `threads` kernel threads (0: one per hardware thread) on
/// this machine: "--threads 8 runs 8 kernel threads on the 2 this process can run at once: they
/// take turns, so a forward pass is slower than with 2" when the count passes
/// `usable_hardware_threads()` (`flag`: how the count was given); otherwise, or when that is
/// unknown (0), empty.
[[nodiscard]] inline std::string oversubscription_note(std::string_view flag, std::size_t threads) {
  const std::size_t hardware = usable_hardware_threads();
  if (hardware == 0 || threads <= hardware) return {};
  return fmt::format("{} {} runs {} kernel threads on the {} this process can run at once: they take turns, so a "
                     "forward pass is slower than with {}",
                     flag, threads, threads, hardware, hardware);
}

}  // namespace specsample::gpt2
