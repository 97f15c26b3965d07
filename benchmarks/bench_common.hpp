// SPDX-License-Identifier: MIT
// Shared pieces of the collective benchmarks: command-line lists, the repetition policy, a
// team of persistent threads, the in-process copy that gives the memory-traffic bound, and
// the raw CSV every benchmark program writes (benchmarks/report.py joins them).
#pragma once

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace bench {

using clock = std::chrono::steady_clock;

inline double since(clock::time_point start) {
  return std::chrono::duration<double>(clock::now() - start).count();
}

/// "a,b,c" -> {"a", "b", "c"}; empty items are skipped.
inline std::vector<std::string> parse_names(const std::string& text) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    if (comma > pos) out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

/// "2,4,8" -> {2, 4, 8}.
inline std::vector<std::size_t> parse_list(const std::string& text) {
  std::vector<std::size_t> out;
  for (const auto& item : parse_names(text)) out.push_back(std::stoull(item));
  return out;
}

/// `--key value` options with defaults.
struct options {
  std::map<std::string, std::string> values;
  options(int argc, char** argv, std::map<std::string, std::string> defaults) : values(std::move(defaults)) {
    for (int i = 1; i + 1 < argc; i += 2) {
      std::string key = argv[i];
      if (key.rfind("--", 0) != 0 || !values.count(key.substr(2))) {
        std::fprintf(stderr, "unknown option %s\n", argv[i]);
        std::exit(2);
      }
      values[key.substr(2)] = argv[i + 1];
    }
  }
  const std::string& operator[](const std::string& key) const { return values.at(key); }
};

/// Best-of-`reps` timings: fewer repetitions where one run already takes long.
inline int repetitions(std::size_t bytes) {
  if (bytes >= (std::size_t{64} << 20)) return 2;
  if (bytes >= (std::size_t{16} << 20)) return 3;
  if (bytes >= (std::size_t{1} << 20)) return 5;
  return 7;
}

/// Iterations per timed batch so that a batch lasts about `batch_seconds`, given the time of
/// one iteration measured during the warm-up.
inline int iterations_for(double one_iteration, double batch_seconds = 0.02, int most = 2000) {
  if (one_iteration <= 0) return most;
  return std::clamp(static_cast<int>(batch_seconds / one_iteration), 1, most);
}

/// Times `f` (one iteration of the operation): warm-up, then the best of `reps` batches of
/// iterations, per iteration.
template <class F>
double best_time(F&& f, std::size_t bytes, int reps = 0) {
  if (reps == 0) reps = repetitions(bytes);
  f();
  auto start = clock::now();
  f();
  const int k = iterations_for(since(start));
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    start = clock::now();
    for (int i = 0; i < k; ++i) f();
    best = std::min(best, since(start) / k);
  }
  return best;
}

/// N persistent threads meeting at a std::barrier: the hand-written reference for the device
/// collectives, and the copy team of the memory bound. `run(work)` calls work(t) on every
/// thread t and returns when all are done.
class thread_team {
 public:
  explicit thread_team(std::size_t n) : n_(n), sync_(static_cast<std::ptrdiff_t>(n + 1)), inner_(static_cast<std::ptrdiff_t>(n)) {
    for (std::size_t t = 0; t < n; ++t)
      threads_.emplace_back([this, t] {
        for (;;) {
          sync_.arrive_and_wait();
          if (stop_) return;
          work_(t);
          sync_.arrive_and_wait();
        }
      });
  }
  ~thread_team() {
    stop_ = true;
    sync_.arrive_and_wait();
    for (auto& th : threads_) th.join();
  }
  thread_team(const thread_team&) = delete;
  thread_team& operator=(const thread_team&) = delete;

  std::size_t size() const { return n_; }
  void run(const std::function<void(std::size_t)>& work) {
    work_ = work;
    sync_.arrive_and_wait();
    sync_.arrive_and_wait();
  }
  /// The barrier among the team's threads alone (for use inside `work`).
  void barrier() { inner_.arrive_and_wait(); }

 private:
  std::size_t n_;
  std::barrier<> sync_;
  std::barrier<> inner_;
  std::function<void(std::size_t)> work_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

/// Bytes that one array of `bytes` is, rounded up to whole floats (at least one).
inline std::size_t floats_for(std::size_t bytes) { return std::max<std::size_t>(1, bytes / sizeof(float)); }

inline std::size_t hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

/// STREAM-style copy bandwidth in bytes per second (bytes read plus bytes written, per second)
/// for a copy of `bytes`, with `threads` threads each copying its own part; buffers are
/// touched first, so page faults are not counted. Cached per (bytes, threads).
inline double copy_bandwidth(std::size_t bytes, std::size_t threads) {
  static std::map<std::pair<std::size_t, std::size_t>, double> cache;
  bytes = std::max<std::size_t>(bytes, 64);
  auto key = std::pair{bytes, threads};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  double t = 0;
  if (threads <= 1) {
    t = best_time([&] { std::memcpy(dst.data(), src.data(), bytes); asm volatile("" ::: "memory"); }, bytes);
  } else {
    thread_team team(threads);
    const std::size_t part = (bytes + threads - 1) / threads;
    auto copy_part = [&](std::size_t p) {
      const std::size_t begin = std::min(bytes, p * part), end = std::min(bytes, begin + part);
      std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
    };
    team.run(copy_part);  // first touch by the thread that copies that part
    t = best_time([&] { team.run(copy_part); }, bytes);
  }
  return cache[key] = 2.0 * static_cast<double>(bytes) / t;
}

/// The raw results file: one row per (implementation, case).
class csv_file {
 public:
  explicit csv_file(const std::string& path) : f_(std::fopen(path.c_str(), "w")) {
    if (!f_) {
      std::perror(path.c_str());
      std::exit(1);
    }
    std::fprintf(f_, "impl,collective,devices,bytes,actual_bytes,seconds\n");
  }
  ~csv_file() { std::fclose(f_); }
  csv_file(const csv_file&) = delete;
  csv_file& operator=(const csv_file&) = delete;
  void row(const std::string& impl, const std::string& collective, std::size_t devices, std::size_t bytes,
           std::size_t actual_bytes, double seconds) {
    std::fprintf(f_, "%s,%s,%zu,%zu,%zu,%.9g\n", impl.c_str(), collective.c_str(), devices, bytes, actual_bytes,
                 seconds);
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

inline std::string human_bytes(std::size_t b) {
  char text[32];
  if (b >= (std::size_t{1} << 20) && b % (std::size_t{1} << 20) == 0)
    std::snprintf(text, sizeof text, "%zu MiB", b >> 20);
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(text, sizeof text, "%zu KiB", b >> 10);
  else
    std::snprintf(text, sizeof text, "%zu B", b);
  return text;
}

}  // namespace bench
