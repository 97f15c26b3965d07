// SPDX-License-Identifier: MIT
// Collective tracing: an opt-in recorder of every collective the simulated devices enter,
// keyed by axis name, written as a Chrome / Perfetto trace with one track per device.
//
//   namedax::start_tracing();
//   namedax::pmap<"i">(f)(x);
//   auto events = namedax::stop_tracing();
//   namedax::write_chrome_trace("trace.json", events);   // open in chrome://tracing or ui.perfetto.dev
//
// NAMEDAX_TRACE=trace.json in the environment records from the start of the program and
// rewrites that file whenever an outermost pmap returns or throws.
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/error.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace namedax {

/// One collective that one device entered and completed (or left by an error).
struct trace_event {
  std::string device;      // the device's coordinates, "i=0,j=2"
  std::string op;          // "psum"
  std::string axes;        // "('i', 'j')"
  std::string parameters;  // the options and groups, as the devices compare them
  std::string shape;       // the payload shape, "(3, 4)"
  std::string dtype;       // "float32"
  std::uint64_t sequence = 0;  // this device's n-th collective exchange, from 0
  double arrival_us = 0;       // microseconds since tracing started
  double wait_us = 0;          // from arrival until every member had arrived
  double duration_us = 0;      // from arrival until the collective completed
};

namespace detail {

struct trace_recorder {
  std::atomic<bool> on{false};
  std::mutex lock;
  std::vector<trace_event> events;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
  std::string path;  // NAMEDAX_TRACE, where the trace is rewritten after each outermost pmap
};

/// The one recorder of the program, made on first use (on when NAMEDAX_TRACE names a file).
NAMEDAX_DECL trace_recorder& recorder();

/// Is a recorder on? The only cost of tracing when it is off.
inline bool tracing() { return recorder().on.load(std::memory_order_relaxed); }

/// Microseconds since tracing started.
NAMEDAX_DECL double trace_clock_us();

/// Keeps `event`, if the recorder is on.
NAMEDAX_DECL void record(trace_event event);

/// Appends `text` as a JSON string.
NAMEDAX_DECL void json_string(std::string& out, std::string_view text);
/// A time in microseconds, to the nanosecond, as JSON wants it (no exponent).
NAMEDAX_DECL std::string microseconds(double us);
/// Device paths in natural order: "i=2" before "i=10".
NAMEDAX_DECL bool natural_less(std::string_view a, std::string_view b);

/// After an outermost pmap: rewrite NAMEDAX_TRACE's file with everything recorded so far.
NAMEDAX_DECL void flush_trace_file();

}  // namespace detail

/// Starts recording the collectives of every device (clearing what was recorded before).
NAMEDAX_DECL void start_tracing();
/// Stops recording and returns the events, ordered by device and then by sequence.
NAMEDAX_DECL std::vector<trace_event> stop_tracing();
/// The events as Chrome trace-event JSON: one thread (track) per device, one complete event
/// ("ph": "X") per collective, its parameters under "args".
NAMEDAX_DECL std::string chrome_trace_json(std::span<const trace_event> events);
/// Writes chrome_trace_json(events) to `path`.
NAMEDAX_DECL void write_chrome_trace(const std::string& path, std::span<const trace_event> events);

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL detail::trace_recorder& detail::recorder() {
  // Never destroyed: devices may record while static objects are torn down.
  static trace_recorder* r = [] {
    auto* fresh = new trace_recorder;
    if (const char* path = std::getenv("NAMEDAX_TRACE"); path && *path) fresh->path = path, fresh->on = true;
    return fresh;
  }();
  return *r;
}

NAMEDAX_DECL double detail::trace_clock_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - recorder().origin).count();
}

NAMEDAX_DECL void detail::record(trace_event event) {
  auto& r = recorder();
  std::lock_guard guard(r.lock);
  if (r.on) r.events.push_back(std::move(event));
}

NAMEDAX_DECL void detail::json_string(std::string& out, std::string_view text) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20) out += message("\\u00", "0123456789abcdef"[(c >> 4) & 0xf], "0123456789abcdef"[c & 0xf]);
    else out += c;
  }
  out += '"';
}

NAMEDAX_DECL std::string detail::microseconds(double us) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", us);
  return text;
}

NAMEDAX_DECL bool detail::natural_less(std::string_view a, std::string_view b) {
  std::size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      std::size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      if (ei - i != ej - j) return ei - i < ej - j;
      if (auto c = a.substr(i, ei - i).compare(b.substr(j, ej - j)); c != 0) return c < 0;
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

NAMEDAX_DECL void start_tracing() {
  auto& r = detail::recorder();
  std::lock_guard guard(r.lock);
  r.events.clear();
  r.origin = std::chrono::steady_clock::now();
  r.on = true;
}

NAMEDAX_DECL std::vector<trace_event> stop_tracing() {
  auto& r = detail::recorder();
  std::lock_guard guard(r.lock);
  r.on = false;
  std::vector<trace_event> events = std::move(r.events);
  r.events.clear();
  std::stable_sort(events.begin(), events.end(), [](const trace_event& a, const trace_event& b) {
    if (a.device != b.device) return detail::natural_less(a.device, b.device);
    return a.arrival_us < b.arrival_us;
  });
  return events;
}

NAMEDAX_DECL std::string chrome_trace_json(std::span<const trace_event> events) {
  std::vector<std::string> devices;
  for (const auto& e : events) devices.push_back(e.device);
  std::sort(devices.begin(), devices.end(), detail::natural_less);
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  auto track = [&](const std::string& d) {
    return std::lower_bound(devices.begin(), devices.end(), d, detail::natural_less) - devices.begin() + 1;
  };
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  const char* sep = "";
  for (const auto& d : devices) {
    out += detail::message(sep, R"({"ph": "M", "name": "thread_name", "pid": 1, "tid": )", track(d), R"(, "args": {"name": )");
    detail::json_string(out, "device " + d);
    out += "}}";
    sep = ",\n";
  }
  for (const auto& e : events) {
    out += detail::message(sep, R"({"ph": "X", "cat": "collective", "pid": 1, "tid": )", track(e.device), ", \"name\": ");
    detail::json_string(out, e.op);
    out += detail::message(", \"ts\": ", detail::microseconds(e.arrival_us), ", \"dur\": ",
                           detail::microseconds(e.duration_us), ", \"args\": {\"axes\": ");
    detail::json_string(out, e.axes);
    out += ", \"parameters\": ";
    detail::json_string(out, e.parameters);
    out += ", \"shape\": ";
    detail::json_string(out, e.shape);
    out += ", \"dtype\": ";
    detail::json_string(out, e.dtype);
    out += detail::message(", \"sequence\": ", e.sequence, ", \"wait_us\": ", detail::microseconds(e.wait_us), "}}");
    sep = ",\n";
  }
  out += "\n]}\n";
  return out;
}

NAMEDAX_DECL void write_chrome_trace(const std::string& path, std::span<const trace_event> events) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << chrome_trace_json(events);
  if (!file.flush()) detail::fail("namedax::write_chrome_trace: cannot write '", path, "'");
}

NAMEDAX_DECL void detail::flush_trace_file() {
  auto& r = recorder();
  std::vector<trace_event> events;
  {
    std::lock_guard guard(r.lock);
    if (r.path.empty() || !r.on) return;
    events = r.events;
  }
  // Never in the way of the pmap's own result or exception: a file that cannot be written
  // is reported on stderr.
  try {
    write_chrome_trace(r.path, events);
  } catch (const error& e) {
    std::fprintf(stderr, "%s (NAMEDAX_TRACE)\n", e.what());
  }
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax
