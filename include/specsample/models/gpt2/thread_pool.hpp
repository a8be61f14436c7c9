#pragma once
/// @file thread_pool.hpp
/// A small persistent thread pool with low wake latency for the GPT-2 kernels.
///
/// Workers spin briefly (`spin`, 50 µs by default) after their last task, then sleep on a futex
/// (`std::atomic::wait`). A `parallel_for` issued while the workers still spin starts within
/// nanoseconds and costs no system call; one issued later pays one `notify_all`. The caller
/// runs chunks too and takes over any chunk no worker has claimed yet, so a sleeping or
/// descheduled worker delays nothing (the model only splits ops that are big enough:
/// `options::min_parallel_work`). Each thread's chunk is sized by its measured speed, so a
/// thread on a slower core (a busy neighbour on its core's other hyperthread) does less of each
/// loop instead of holding up all of it. No allocation and no lock per `parallel_for`.
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
#include <cfenv>
#include <chrono>
#include <cmath>
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

/// The calling thread's floating-point control state, which a pool's workers take on for each
/// chunk they run: the rounding mode, and on x86 flush-to-zero and denormals-are-zero (MXCSR,
/// which every kernel's SSE/AVX arithmetic reads; the x87 unit computes nothing here). A chunk's
/// bits must not depend on the thread that ran it. Elsewhere the whole `std::fenv_t`.
struct float_controls {
#if defined(__x86_64__) || defined(__i386__)
  unsigned csr = 0;
  [[nodiscard]] static float_controls of_this_thread() noexcept { return {_mm_getcsr()}; }
  void apply() const noexcept {
    if (_mm_getcsr() != csr) _mm_setcsr(csr);
  }
#else
  std::fenv_t env{};
  [[nodiscard]] static float_controls of_this_thread() noexcept {
    float_controls c;
    std::fegetenv(&c.env);
    return c;
  }
  void apply() const noexcept { std::fesetenv(&env); }
#endif
};
}  // namespace detail

/// The hardware threads this process may run on: its CPU affinity's count on Linux (`taskset -c 0`
/// gives 1), else std::thread::hardware_concurrency() (0: unknown).
[[nodiscard]] inline std::size_t usable_hardware_threads() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) {
    return static_cast<std::size_t>(CPU_COUNT(&set));
  }
#endif
  return std::thread::hardware_concurrency();
}

/// A fixed set of worker threads (the caller is worker 0) that split a loop into contiguous
/// chunks, one per thread, sized by how fast each thread has been. Persistent: no thread
/// creation, no lock and no allocation per `parallel_for`.
///
/// Chunk c is meant for thread c, and its size follows thread c's speed relative to the caller's,
/// measured on the chunks of earlier loops (`speed`): on a machine whose cores run at different
/// speeds — a cloud VM's virtual CPU sharing its core with a neighbour's busy hyperthread runs at
/// about half speed, for minutes — an even split would make every loop wait for the slow core.
/// Chunks are claimed, not assigned: each thread takes its own chunk first, then any chunk no
/// thread has started yet, so a worker that is asleep or descheduled on a busy machine never
/// holds the caller up; the caller then waits only for chunks already being run. A chunk is
/// passed its index c whoever runs it, so per-chunk scratch does not depend on which thread ran
/// what; where the boundaries fall varies with the measured speeds, so a loop whose results may
/// depend only on each index (the kernels': each output of a matmul panel, each attention task)
/// gets the same bits whatever the split.
///
/// `Clock` times the chunks for the speeds (`now()` on the thread that runs the chunk, before and
/// after it); the library's pool is `thread_pool`, timed by `std::chrono::steady_clock`. Another
/// clock serves tests: one that counts each thread's simulated work gives speeds that do not
/// depend on how busy the machine is.
template <class Clock>
class basic_thread_pool {
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
  explicit basic_thread_pool(std::size_t threads, std::chrono::microseconds spin = default_spin)
      : spin_(std::clamp(spin, std::chrono::microseconds{0}, max_spin)) {
    if (threads > max_threads) {
      throw error(fmt::format("thread_pool: {} threads requested; at most {}", threads, max_threads));
    }
    threads = resolved_threads(threads);
    chunks_ = std::make_unique<chunk[]>(threads);
    ranges_ = std::make_unique<range[]>(threads);
    speed_.assign(threads, 1.0);
    workers_.reserve(threads - 1);
    try {
      for (std::size_t id = 1; id < threads; ++id) workers_.emplace_back([this, id] { run(id); });
    } catch (const std::exception& e) {  // e.g. no memory for a stack: join those started
      const std::size_t started = workers_.size();
      stop();
      throw error(fmt::format("thread_pool: cannot start thread {} of {}: {}", started + 1, threads,
                              e.what()));
    }
  }
  basic_thread_pool(const basic_thread_pool&) = delete;
  basic_thread_pool& operator=(const basic_thread_pool&) = delete;
  ~basic_thread_pool() { stop(); }

  /// Most threads a pool runs; more are refused. A limit of policy (the claims and the split are
  /// per thread, so a larger pool would only cost memory).
  static constexpr std::size_t max_threads = 1024;

  /// Number of workers, the calling thread included.
  [[nodiscard]] std::size_t size() const noexcept { return workers_.size() + 1; }

  /// Thread `worker`'s speed relative to the caller's (worker 0: 1) as the pool has measured it:
  /// items per second of its recent chunks over the caller's on the same loops, a moving average
  /// of the ratios' logarithms (each ratio clamped to [1/8, 8]; 1 before any loop; 0 for a worker
  /// the pool does not have). `parallel_for` sizes the chunks by it. Meant for benchmarks and
  /// tests; read it only while no `parallel_for` runs.
  [[nodiscard]] double speed(std::size_t worker) const noexcept {
    return worker < speed_.size() ? speed_[worker] : 0.0;
  }

  /// Calls `f(begin, end, chunk)` on disjoint contiguous chunks covering [0, n), w = min(size(),
  /// n) chunks, chunk c (c = 0..w−1) at least one index, its share of n proportional to
  /// `speed(c)`; the chunks lie along [0, n) from chunk w − 1 to chunk 0, the caller's chunk last
  /// (measured faster than first: docs/gpt2.md, "Threads"). The workers run their chunks under the
  /// caller's floating-point controls (rounding mode; flush-to-zero and denormals-are-zero on x86:
  /// `detail::float_controls`), so no result depends on which thread computed it; the exception
  /// flags a worker's arithmetic raises stay on the worker. Returns when all are done. If a chunk
  /// throws, chunks not started yet may be skipped, and the first exception is rethrown on the
  /// calling thread once no chunk runs any more (the pool stays whole). Thread-safe: while the
  /// workers run one call, any other call (from another thread, or from inside a chunk) runs all
  /// its chunks on its calling thread, in order, chunk c = [n·c/w, n·(c+1)/w) (computed without
  /// overflow for any n).
  template <class F>
  void parallel_for(std::size_t n, F&& f) {
    const std::size_t w = std::min(size(), n);
    if (w <= 1 || busy_.exchange(true, std::memory_order_acquire)) {
      // n·c/w = c·(n/w) + (n%w)·c/w: no product past n (n·c would wrap for n > SIZE_MAX / w).
      // (Divided only inside the loop: w is 0 for n = 0.)
      const auto bound = [&](std::size_t c) { return c * (n / w) + (n % w) * c / w; };
      for (std::size_t c = 0; c < w; ++c) f(bound(c), bound(c + 1), c);
      return;
    }
    using fn_t = std::remove_reference_t<F>;
    // The task fields, the ranges and the claim words are published by the release store of
    // task_ and read only by a thread that loaded it with acquire; a chunk's record is written by
    // the thread that ran it before its release increment of done_, read by the caller after
    // done_'s acquire. The caller rewrites any of them only after every claimed chunk reported
    // done, so they never race.
    ctx_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
    controls_ = detail::float_controls::of_this_thread();
    call_ = [](void* ctx, std::size_t b, std::size_t e, std::size_t id) {
      (*static_cast<fn_t*>(ctx))(b, e, id);
    };
    plan(n, w);
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const std::uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
    chunks_[0].claim.store(gen, std::memory_order_relaxed);  // the caller's own
    for (std::size_t c = 1; c < w; ++c) chunks_[c].claim.store(gen - 1, std::memory_order_relaxed);  // free
    task_.store((std::uint64_t{gen} << 32) | w, std::memory_order_release);
    generation_.store(gen, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) generation_.notify_all();
    run_chunk(0, 0);
    take_free(gen, w, 0);
    for (unsigned spins = 0; done_.load(std::memory_order_acquire) != w - 1; ++spins) {
      if (spins < 1024) {
        detail::cpu_relax();
      } else {
        std::this_thread::yield();  // a worker holding a chunk was descheduled
      }
    }
    learn(w);
    // The exception is taken before the pool is released: another caller may take it at once and
    // reset failed_ and error_ for its own task.
    std::exception_ptr failure = failed_.load(std::memory_order_relaxed) ? std::exchange(error_, nullptr) : nullptr;
    busy_.store(false, std::memory_order_release);
    if (failure) std::rethrow_exception(std::move(failure));
  }

 private:
  // A chunk of the current task: who claimed it (the task's generation once claimed, the one
  // before while free), and, once run, by which thread and in how many seconds.
  struct alignas(64) chunk {
    std::atomic<std::uint32_t> claim{0};
    std::size_t runner = 0;
    double seconds = 0.0;
  };
  // The indices [begin, end) of a chunk of the current task (`plan`).
  struct range {
    std::size_t begin = 0, end = 0;
    [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  };

  // Wakes every worker to exit, and joins them.
  void stop() noexcept {
    stop_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  // ranges_[0..w): chunk c's [begin, end), its share of n proportional to speed_[c], at least one
  // index each; the chunks lie along [0, n) from chunk w − 1 to chunk 0, the caller's last (see
  // parallel_for).
  void plan(std::size_t n, std::size_t w) noexcept {
    double total = 0.0;
    for (std::size_t c = 0; c < w; ++c) total += speed_[c];
    double sum = 0.0;
    std::size_t begin = 0;
    for (std::size_t k = 0; k < w; ++k) {  // the k-th range along [0, n) is chunk w − 1 − k's
      const std::size_t c = w - 1 - k;
      sum += speed_[c];
      const auto at = static_cast<std::size_t>(static_cast<double>(n) * sum / total + 0.5);
      const std::size_t end = k + 1 == w ? n : std::clamp(at, begin + 1, n - (w - 1 - k));
      ranges_[c] = {begin, end};
      begin = end;
    }
  }

  // Folds this task's chunk times into speed_: each chunk run by its own thread against the
  // caller's chunk 0, in items per second; a moving average of the logarithm with weight 1/64
  // per task (a forward pass of the bundled target splits 31 loops: the estimate follows a
  // change within two or three calls, and the noise of single loops — a 2-against-1 split of 6
  // panels, a chunk's cold start — averages out: with 1/8 it swung between 0.5 and 1.8 within
  // one steady phase).
  void learn(std::size_t w) noexcept {
    const chunk& own = chunks_[0];
    if (own.runner != 0 || !(own.seconds > 0.0)) return;
    const double caller = static_cast<double>(ranges_[0].size()) / own.seconds;
    for (std::size_t c = 1; c < w; ++c) {
      const chunk& k = chunks_[c];
      if (k.runner != c || !(k.seconds > 0.0)) continue;
      const double r = std::clamp(static_cast<double>(ranges_[c].size()) / k.seconds / caller, 0.125, 8.0);
      speed_[c] *= std::exp((std::log(r) - std::log(speed_[c])) / 64.0);
    }
  }

  // Claims chunk c of task gen for the calling thread; false if some thread has (or the task is
  // over: every chunk of a finished task was claimed, in it or in a later one).
  bool claim(std::size_t c, std::uint32_t gen) noexcept {
    std::uint32_t v = chunks_[c].claim.load(std::memory_order_relaxed);
    if (v != gen - 1) return false;
    return chunks_[c].claim.compare_exchange_strong(v, gen, std::memory_order_acq_rel, std::memory_order_relaxed);
  }

  // Runs chunk c of the current task on thread `self`, timed, unless a chunk has thrown; the
  // first exception is kept for the caller (error_ is written by the thread that set failed_
  // first, before its done_ increment, and read by the caller after every chunk is done).
  void run_chunk(std::size_t c, std::size_t self) noexcept {
    chunk& k = chunks_[c];
    k.runner = self;
    k.seconds = 0.0;
    if (failed_.load(std::memory_order_relaxed)) return;
    if (self != 0) controls_.apply();  // (the caller's own chunks run under its state already)
    try {
      const auto t0 = Clock::now();
      call_(ctx_, ranges_[c].begin, ranges_[c].end, c);
      k.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    } catch (...) {
      if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  void run(std::size_t self) {
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
      // The task and its chunk count in one word: a worker that read them and was then
      // descheduled past the task's end claims nothing (every chunk of it is claimed).
      const std::uint64_t task = task_.load(std::memory_order_acquire);
      const auto gen = static_cast<std::uint32_t>(task >> 32);
      take_free(gen, static_cast<std::size_t>(task & 0xffffffffu), self);
    }
  }

  // Thread `self`'s part of task gen (of w chunks) beyond chunk 0, which the caller runs first:
  // its own chunk, then every other one still free (in order from its own), each claimed, run and
  // counted in done_.
  void take_free(std::uint32_t gen, std::size_t w, std::size_t self) noexcept {
    for (std::size_t i = 0; i < w; ++i) {
      const std::size_t c = (self + i) % w;
      if (c != 0 && claim(c, gen)) {
        run_chunk(c, self);
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  std::vector<std::thread> workers_;
  std::chrono::microseconds spin_;
  std::unique_ptr<chunk[]> chunks_;          // per chunk (at most one per thread)
  std::unique_ptr<range[]> ranges_;          // the current task's chunks (`plan`)
  std::vector<double> speed_;                // per thread (`speed`), written by the caller holding busy_
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
  alignas(64) std::atomic<std::uint64_t> task_{0};  // generation (bits 63..32) | chunks (31..0)
  alignas(64) std::atomic<std::size_t> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> busy_{false};  // a parallel_for holds the workers
  std::atomic<bool> failed_{false};  // a chunk of the current task threw: error_ holds it
  std::exception_ptr error_;
  // The task (written by the caller only while no other thread reads it).
  alignas(64) void* ctx_ = nullptr;
  void (*call_)(void*, std::size_t, std::size_t, std::size_t) = nullptr;
  detail::float_controls controls_{};  // the caller's, for the workers' chunks (published with task_)
};

/// The library's pool: chunks timed by the steady clock.
using thread_pool = basic_thread_pool<std::chrono::steady_clock>;

/// A tool's kernel-thread count as given with `flag` (e.g. `--threads`): `threads` itself when it is
/// 0 (one per CPU the process may run on) to `thread_pool::max_threads`, else a
/// `specsample::error` naming the flag ("--threads must be at most 1024 (0: one per CPU it may run
/// on), got 5000").
[[nodiscard]] inline std::size_t threads_option(std::string_view flag, std::size_t threads) {
  if (threads > thread_pool::max_threads) {
    throw error(fmt::format("{} must be at most {} (0: one per CPU it may run on), got {}", flag,
                            thread_pool::max_threads, threads));
  }
  return threads;
}

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
