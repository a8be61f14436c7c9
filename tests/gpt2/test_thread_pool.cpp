// The thread pool the GPT-2 kernels split their loops on. Built into test_gpt2, and in the
// sanitized build also on its own under ThreadSanitizer (test_thread_pool_tsan: the pool is the
// library's one piece of lock-free code, and a race in it would move logits, not crash).
#include <specsample/models/gpt2/thread_pool.hpp>

#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cfenv>
#include <chrono>
#include <cstddef>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sched.h>
#endif

using specsample::gpt2::basic_thread_pool;
using specsample::gpt2::thread_pool;

TEST_CASE("the thread pool covers every index exactly once for any size", "[gpt2][thread_pool]") {
  for (std::size_t threads = 1; threads <= 4; ++threads) {
    thread_pool pool(threads);
    REQUIRE(pool.size() == threads);
    for (std::size_t n = 0; n <= 23; ++n) {
      std::vector<int> hits(n, 0);
      std::vector<int> worker_used(threads, 0);
      pool.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t w) {
        for (std::size_t i = b; i < e; ++i) ++hits[i];
        worker_used[w] = 1;
      });
      REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
      for (std::size_t w = 0; w < threads; ++w) REQUIRE(worker_used[w] == (w < std::min(threads, n) ? 1 : 0));
    }
  }
  thread_pool all(0);
  REQUIRE(all.size() >= 1);
  REQUIRE(all.size() <= thread_pool::max_threads);
}

TEST_CASE("the thread pool lays a loop's chunks out from the last worker's to the caller's",
          "[gpt2][thread_pool]") {
  // The caller's chunk 0 ends the loop, chunk w − 1 starts it, each next to the one before it
  // (docs/gpt2.md, "Threads": measured faster than the caller's chunk first).
  for (std::size_t threads = 2; threads <= 4; ++threads) {
    thread_pool pool(threads, thread_pool::max_spin);
    for (std::size_t n = threads; n <= 23; ++n) {
      INFO(threads << " threads, " << n << " indices");
      const std::size_t w = std::min(threads, n);
      std::vector<std::size_t> begin(w, n + 1), end(w, n + 1);
      pool.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t c) {
        begin[c] = b;
        end[c] = e;
      });
      REQUIRE(begin[w - 1] == 0);
      REQUIRE(end[0] == n);
      for (std::size_t c = 0; c + 1 < w; ++c) REQUIRE(begin[c] == end[c + 1]);
    }
  }
}

TEST_CASE("a thread pool refuses more threads than it can run", "[gpt2][thread_pool]") {
  // It capped them silently at max_threads; the size asked for is the caller's mistake to hear of.
  REQUIRE_THROWS_WITH(thread_pool(thread_pool::max_threads + 1),
                      "thread_pool: 1025 threads requested; at most 1024");
  REQUIRE_THROWS_AS(thread_pool(std::numeric_limits<std::size_t>::max()), specsample::error);
}

TEST_CASE("more threads than the process can run get a note, as many or fewer none", "[gpt2][thread_pool]") {
  using specsample::gpt2::oversubscription_note;
  const std::size_t usable = specsample::gpt2::usable_hardware_threads();
  REQUIRE(usable >= 1);
  REQUIRE(usable <= std::max(1u, std::thread::hardware_concurrency()));  // (the affinity is within the machine)
  CHECK(oversubscription_note("--threads", 0).empty());  // 0: one per hardware thread
  CHECK(oversubscription_note("--threads", usable).empty());
  CHECK(oversubscription_note("--threads", usable + 1) ==
        fmt::format("--threads {} runs {} kernel threads on the {} this process can run at once: they take turns, so "
                    "a forward pass is slower than with {}",
                    usable + 1, usable + 1, usable, usable));
}

#if defined(__linux__)
TEST_CASE("a pool of 0 threads runs one per CPU the process may run on", "[gpt2][thread_pool]") {
  // It took std::thread::hardware_concurrency(): under `taskset -c 0` two workers took turns on one CPU.
  cpu_set_t before;
  REQUIRE(::sched_getaffinity(0, sizeof before, &before) == 0);
  CHECK(thread_pool(0).size() == std::clamp<std::size_t>(specsample::gpt2::usable_hardware_threads(), 1,
                                                             thread_pool::max_threads));
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &before)) ++first;
  REQUIRE(first < CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(::sched_setaffinity(0, sizeof one, &one) == 0);  // this thread, as `taskset -c` would pin the process
  const std::size_t usable = specsample::gpt2::usable_hardware_threads();
  const std::size_t resolved = thread_pool::resolved_threads(0);
  const std::size_t started = thread_pool(0).size();
  REQUIRE(::sched_setaffinity(0, sizeof before, &before) == 0);
  CHECK(usable == 1);
  CHECK(resolved == 1);
  CHECK(started == 1);
}
#endif

TEST_CASE("the thread pool survives rapid and sleepy back-to-back tasks", "[gpt2][thread_pool]") {
  // Rapid calls hit spinning workers; the pauses let them fall asleep on the futex first.
  thread_pool pool(3, std::chrono::microseconds(20));
  std::vector<long> hits(64, 0);
  for (int round = 0; round < 3000; ++round) {
    if (round % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.parallel_for(hits.size(), [&](std::size_t b, std::size_t e, std::size_t) {
      for (std::size_t i = b; i < e; ++i) ++hits[i];
    });
  }
  REQUIRE(std::all_of(hits.begin(), hits.end(), [](long h) { return h == 3000; }));
}

TEST_CASE("a thread pool runs loops issued concurrently or from inside a chunk, each whole",
          "[gpt2][thread_pool]") {
  thread_pool pool(3);
  // From inside a chunk: the inner loop runs its chunks in order on that chunk's thread, chunk c
  // = [n·c/w, n·(c+1)/w), with the same chunk indices as on the workers.
  // (Catch2's assertions are for the test's thread: the chunks record, the test checks.)
  std::vector<std::vector<std::size_t>> chunk_of(3, std::vector<std::size_t>(10, 99));
  pool.parallel_for(3, [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t o = b; o < e; ++o) {
      pool.parallel_for(10, [&](std::size_t ib, std::size_t ie, std::size_t c) {
        for (std::size_t i = ib; i < ie; ++i) chunk_of[o][i] = chunk_of[o][i] == 99 ? c : 98;
      });
    }
  });
  std::vector<std::size_t> expected;  // chunk c = [10c/3, 10(c+1)/3): 3 + 3 + 4 indices
  for (std::size_t c = 0; c < 3; ++c) expected.insert(expected.end(), 10 * (c + 1) / 3 - 10 * c / 3, c);
  for (const auto& row : chunk_of) REQUIRE(row == expected);
  // Chunk bounds past SIZE_MAX / w in a loop issued from inside a chunk (the pool busy): n·c
  // would wrap (chunks [0, 3074457345618258602), [3074457345618258602, 0), [0, ...) for n = 2^63).
  // The bounds only: no index is run. floor(n·c/3) for c = 0..3, worked out by hand.
  const std::pair<std::size_t, std::array<std::size_t, 4>> huge[] = {
      {std::size_t{1} << 63, {0, 3074457345618258602u, 6148914691236517205u, std::size_t{1} << 63}},
      {std::numeric_limits<std::size_t>::max(),
       {0, 6148914691236517205u, 12297829382473034410u, std::numeric_limits<std::size_t>::max()}}};
  for (const auto& entry : huge) {
    const std::size_t n = entry.first;  // (not a structured binding: clang 14 cannot capture one)
    const std::array<std::size_t, 4>& expected_bounds = entry.second;
    std::vector<std::array<std::size_t, 2>> bounds;
    pool.parallel_for(3, [&](std::size_t, std::size_t, std::size_t c) {
      if (c != 0) return;
      pool.parallel_for(n, [&](std::size_t ib, std::size_t ie, std::size_t) { bounds.push_back({ib, ie}); });
    });
    CAPTURE(n);
    REQUIRE(bounds.size() == 3);
    for (std::size_t c = 0; c < 3; ++c) {
      CHECK(bounds[c][0] == expected_bounds[c]);
      CHECK(bounds[c][1] == expected_bounds[c + 1]);
    }
  }
  // From two threads at once (two models sharing a pool, used from two threads): each caller's
  // loops still cover their indices exactly once.
  const int rounds = 2000;
  std::vector<std::vector<long>> hits(2, std::vector<long>(64, 0));
  std::vector<std::thread> callers;
  for (std::size_t who = 0; who < 2; ++who) {
    callers.emplace_back([&, who] {
      for (int round = 0; round < rounds; ++round) {
        pool.parallel_for(64, [&](std::size_t b, std::size_t e, std::size_t) {
          for (std::size_t i = b; i < e; ++i) ++hits[who][i];
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (const auto& h : hits) REQUIRE(std::all_of(h.begin(), h.end(), [&](long n) { return n == rounds; }));
}


namespace {

// One parallel_for over [0, n) writing tag·1000 + i into out (plain writes: under ThreadSanitizer
// the caller's read after the call must be ordered after every chunk's write); with `nested`, each
// chunk also runs a loop of its own on the pool (from inside a chunk it runs on that chunk's
// thread). False when a value is wrong.
bool one_call(thread_pool& pool, std::vector<long>& out, std::size_t n, long tag, bool nested) {
  std::vector<int> inner_ok(std::min(pool.size(), n), 1);
  pool.parallel_for(n, [&](std::size_t b, std::size_t e, std::size_t c) {
    for (std::size_t i = b; i < e; ++i) out[i] = tag * 1000 + static_cast<long>(i);
    if (nested) {
      std::vector<long> inner(7, -1);
      pool.parallel_for(inner.size(), [&](std::size_t ib, std::size_t ie, std::size_t) {
        for (std::size_t j = ib; j < ie; ++j) inner[j] = static_cast<long>(c * 100 + j);
      });
      for (std::size_t j = 0; j < inner.size(); ++j) {
        if (inner[j] != static_cast<long>(c * 100 + j)) inner_ok[c] = 0;
      }
    }
  });
  for (std::size_t i = 0; i < n; ++i) {
    if (out[i] != tag * 1000 + static_cast<long>(i)) return false;
  }
  return std::all_of(inner_ok.begin(), inner_ok.end(), [](int ok) { return ok == 1; });
}

}  // namespace

TEST_CASE("a thread pool shared by three callers, with nested loops and sleeping workers, loses no write",
          "[gpt2][thread_pool]") {
  // The pool's hand-offs under load: three threads issue loops of every size up to 64 on one pool
  // (one holds the workers, the others run theirs inline), some nested, with pauses that let the
  // workers fall asleep on the futex; pools that never spin; pools destroyed right after a loop
  // and after their workers slept. Each caller checks its own writes.
  const int rounds = 20000;
  for (const std::size_t threads : {std::size_t{2}, std::size_t{3}, std::size_t{4}}) {
    for (const auto spin : {thread_pool::default_spin, std::chrono::microseconds(0)}) {
      thread_pool pool(threads, spin);
      std::vector<int> ok(3, 1);
      const auto caller = [&](std::size_t who) {
        std::vector<long> out(64);
        for (int round = 0; round < rounds && ok[who] == 1; ++round) {
          const auto n = static_cast<std::size_t>(1 + (round * 7 + static_cast<int>(who)) % 64);
          if (!one_call(pool, out, n, static_cast<long>(who) * 100000 + round % 1000, round % 3 == 0)) ok[who] = 0;
          if (round % 997 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      };
      std::thread a(caller, 0), b(caller, 1);
      caller(2);
      a.join();
      b.join();
      INFO(threads << " threads, spin " << spin.count() << " us");
      REQUIRE(ok == std::vector<int>(3, 1));
    }
  }
  bool all_ok = true;
  for (int round = 0; round < 200; ++round) {
    std::vector<long> out(16);
    { thread_pool idle(1 + static_cast<std::size_t>(round % 4)); }
    {
      thread_pool pool(1 + static_cast<std::size_t>(round % 4), std::chrono::microseconds(round % 2 ? 0 : 50));
      all_ok = one_call(pool, out, 16, round, false) && all_ok;
    }
    if (round % 50 == 0) {
      thread_pool pool(3);
      all_ok = one_call(pool, out, 16, round, false) && all_ok;
      std::this_thread::sleep_for(std::chrono::microseconds(300));
      all_ok = one_call(pool, out, 16, round + 1, true) && all_ok;
    }
  }
  REQUIRE(all_ok);
}

namespace {
// Whether chunk 1 of a two-chunk loop runs beside chunk 0 on a worker: chunk 0 (the caller's)
// waits up to 10 s for it to start. A pool whose workers no longer take tasks runs chunk 1 after
// chunk 0, on the caller, once the wait has timed out.
// Whether chunk 1 of a 2-chunk loop ran beside the caller's chunk 0, so on a worker (`second`, when
// given, runs in it first).
bool runs_chunks_side_by_side(thread_pool& pool, const std::function<void()>& second = {}) {
  std::atomic<bool> second_started{false};
  bool seen = false;
  pool.parallel_for(2, [&](std::size_t, std::size_t, std::size_t chunk) {
    if (chunk == 1) {
      if (second) second();
      second_started.store(true);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!second_started.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    seen = second_started.load();
  });
  return seen;
}
}  // namespace

TEST_CASE("an exception a chunk throws reaches the caller, and the pool stays whole", "[gpt2][thread_pool]") {
  thread_pool pool(2);
  REQUIRE(runs_chunks_side_by_side(pool));
  for (std::size_t thrower : {std::size_t{0}, std::size_t{1}}) {  // the caller's chunk, a worker's
    INFO("chunk " << thrower << " throws");
    std::atomic<int> ran{0};
    REQUIRE_THROWS_WITH(pool.parallel_for(2,
                                          [&](std::size_t, std::size_t, std::size_t chunk) {
                                            ran.fetch_add(1);
                                            if (chunk == thrower) throw std::runtime_error("chunk failed");
                                          }),
                        "chunk failed");
    REQUIRE(ran.load() >= 1);
    REQUIRE(runs_chunks_side_by_side(pool));  // its workers take tasks again
  }
  // Two callers sharing the pool, each loop throwing: each gets its own exception (the first
  // taken it before the pool was released; the other ran its chunks on its own thread).
  std::atomic<int> wrong{0};
  const auto caller = [&](const std::string& name) {
    for (int i = 0; i < 2000; ++i) {
      try {
        pool.parallel_for(2, [&](std::size_t, std::size_t, std::size_t chunk) {
          if (chunk == 0) throw std::runtime_error(name);
        });
        wrong.fetch_add(1);
      } catch (const std::runtime_error& e) {
        if (e.what() != name) wrong.fetch_add(1);
      }
    }
  };
  std::thread other(caller, "other");
  caller("this");
  other.join();
  REQUIRE(wrong.load() == 0);
  // Every chunk of a larger loop throwing: one exception, the others' dropped.
  thread_pool four(4);
  REQUIRE_THROWS_WITH(four.parallel_for(100, [](std::size_t b, std::size_t, std::size_t) {
    throw std::runtime_error("at " + std::to_string(b));
  }),
                      Catch::Matchers::StartsWith("at "));
  std::vector<int> hits(100, 0);
  four.parallel_for(hits.size(), [&](std::size_t b, std::size_t e, std::size_t) {
    for (std::size_t i = b; i < e; ++i) ++hits[i];
  });
  REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
}

TEST_CASE("a thread pool's workers compute under the caller's rounding mode and flush-to-zero", "[gpt2][thread_pool]") {
  // A chunk's bits must not depend on the thread that ran it (batch invariance for every thread
  // count): the workers take on the caller's floating-point controls.
  std::fenv_t saved;
  REQUIRE(std::fegetenv(&saved) == 0);
  struct restore {
    std::fenv_t* env;
    ~restore() { std::fesetenv(env); }
  } guard{&saved};
  thread_pool pool(2);
  volatile float one = 1.0f, three = 3.0f, smallest = std::numeric_limits<float>::min(), half = 0.5f;
  const auto third = [&] { return one / three; };
  const auto below_normal = [&] { return smallest * half; };  // subnormal, or 0 when flushed
  const auto on_the_worker = [&](auto compute) {
    float value = -1.0f;
    REQUIRE(runs_chunks_side_by_side(pool, [&] { value = compute(); }));
    return value;
  };
  const float nearest = third();
  REQUIRE(std::fesetround(FE_DOWNWARD) == 0);
  const float down = third();
  const float worker_down = on_the_worker(third);
  REQUIRE(std::fesetround(FE_TONEAREST) == 0);
  REQUIRE(down != nearest);  // the mode changes this quotient
  CHECK(worker_down == down);
  CHECK(on_the_worker(third) == nearest);  // and back
#if defined(__x86_64__) || defined(__i386__)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040U);  // flush-to-zero (bit 15) and denormals-are-zero (bit 6)
  const float flushed = below_normal();
  const float worker_flushed = on_the_worker(below_normal);
  _mm_setcsr(csr);
  REQUIRE(flushed == 0.0f);
  CHECK(worker_flushed == 0.0f);
  REQUIRE(below_normal() > 0.0f);
  CHECK(on_the_worker(below_normal) > 0.0f);
#endif
}

TEST_CASE("a thread pool's spin is clamped to [0, max_spin]: never sleeping, or at once", "[gpt2][thread_pool]") {
  // microseconds::max() added to the clock's now overflowed (UBSan's report in the sanitized
  // build) into a deadline in the past.
  for (const auto spin : {std::chrono::microseconds::max(), std::chrono::microseconds(-5)}) {
    thread_pool pool(2, spin);
    for (int round = 0; round < 50; ++round) {
      std::atomic<int> hits{0};
      pool.parallel_for(8, [&](std::size_t b, std::size_t e, std::size_t) { hits.fetch_add(static_cast<int>(e - b)); });
      REQUIRE(hits.load() == 8);
      if (round % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

namespace {
// A clock of simulated work: each thread's own count of the microseconds its chunks said they
// worked (`work`). A pool timed by it measures the speeds the work describes, whatever else the
// machine runs: descheduling, a busy neighbour and the sanitizers' slowdown add nothing to it.
struct work_clock {
  using duration = std::chrono::microseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<work_clock>;
  static time_point now() noexcept { return time_point(duration(elapsed())); }
  static void work(rep us) noexcept { elapsed() += us; }

 private:
  static rep& elapsed() noexcept {
    thread_local rep us = 0;
    return us;
  }
};
}  // namespace

TEST_CASE("a thread pool gives a slower thread a smaller chunk", "[gpt2][thread_pool]") {
  // 300 loops of 32 indices; an index takes the caller 10 µs of work and the worker `slow` times
  // that. The caller's chunk waits (in real time) until the worker has started chunk 1, so the
  // worker runs its own chunk in every loop and each loop is measured. The speed converges on
  // 1/slow, clamped to [1/8, 8], and the worker's chunk shrinks with it: a third of the caller's
  // speed is about a quarter of the loop (8 of 32), the clamp's eighth 4 of 32. An even split
  // (speed 1, chunk 16) fails every case but the last.
  struct expectation {
    double slow, min_speed, max_speed;
    std::size_t min_chunk, max_chunk;
  };
  for (const auto& x : {expectation{3.0, 0.30, 0.37, 7, 9}, expectation{20.0, 0.125, 0.14, 3, 5},
                        expectation{0.5, 1.8, 2.1, 20, 22}, expectation{1.0, 1.0, 1.0, 16, 16}}) {
    INFO("the worker takes " << x.slow << "x the caller's time per index");
    basic_thread_pool<work_clock> pool(2);
    const auto caller = std::this_thread::get_id();
    std::size_t chunk1 = 0;
    for (int round = 0; round < 300; ++round) {
      std::vector<int> hits(32, 0);
      std::atomic<bool> started{false};
      bool on_worker = false, waited = true;
      pool.parallel_for(hits.size(), [&](std::size_t b, std::size_t e, std::size_t chunk) {
        for (std::size_t i = b; i < e; ++i) ++hits[i];
        const bool on_caller = std::this_thread::get_id() == caller;
        if (chunk == 1) {
          chunk1 = e - b;
          on_worker = !on_caller;
          started.store(true);
        } else {
          const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!started.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
          waited = started.load();
        }
        work_clock::work(static_cast<work_clock::rep>(static_cast<double>(e - b) * 10.0 * (on_caller ? 1.0 : x.slow)));
      });
      REQUIRE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
      REQUIRE(waited);     // the worker started chunk 1 within 10 s
      REQUIRE(on_worker);  // and it was the worker
    }
    CHECK(pool.speed(0) == 1.0);
    CHECK(pool.speed(1) >= x.min_speed);
    CHECK(pool.speed(1) <= x.max_speed);
    CHECK(chunk1 >= x.min_chunk);
    CHECK(chunk1 <= x.max_chunk);
  }
}
