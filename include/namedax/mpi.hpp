// SPDX-License-Identifier: MIT
// The third placement of a named axis: MPI ranks. namedax::mpi::pmap<"i"> runs the mapped
// function once per process, as one index of "i"; the collectives inside reach the other
// processes through MPI. Optional: the rest of namedax never includes mpi.h (CMake:
// find_package(namedax COMPONENTS mpi) and namedax::mpi).
#pragma once

#include <namedax/namedax.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <chrono>
#include <climits>
#include <cmath>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

namespace namedax::mpi {

namespace detail {
/// The MPI datatype of an element kind.
inline MPI_Datatype datatype_of(namedax::detail::element_kind kind) {
  using namedax::detail::element_kind;
  switch (kind) {
    case element_kind::boolean: return MPI_C_BOOL;
    case element_kind::int8: return MPI_INT8_T;
    case element_kind::int16: return MPI_INT16_T;
    case element_kind::int32: return MPI_INT32_T;
    case element_kind::int64: return MPI_INT64_T;
    case element_kind::uint8: return MPI_UINT8_T;
    case element_kind::uint16: return MPI_UINT16_T;
    case element_kind::uint32: return MPI_UINT32_T;
    case element_kind::uint64: return MPI_UINT64_T;
    case element_kind::float32: return MPI_FLOAT;
    case element_kind::float64: return MPI_DOUBLE;
    case element_kind::complex64: return MPI_C_FLOAT_COMPLEX;
    case element_kind::complex128: return MPI_C_DOUBLE_COMPLEX;
  }
  return MPI_DATATYPE_NULL;
}
}  // namespace detail

/// The MPI datatype of an element type (bool, signed and unsigned integers, float, double,
/// std::complex of float and double).
template <class T>
MPI_Datatype datatype() {
  return detail::datatype_of(namedax::detail::element_kind_of<T>());
}

namespace detail {
/// The watchdog's deadline in seconds: NAMEDAX_MPI_TIMEOUT, else 600 (NCCL's default is minutes too).
inline std::atomic<double>& timeout_seconds() {
  static std::atomic<double> seconds = [] {
    const char* text = std::getenv("NAMEDAX_MPI_TIMEOUT");
    char* end = nullptr;
    const double given = text ? std::strtod(text, &end) : 0;
    return text && end != text && given > 0 ? given : 600.0;
  }();
  return seconds;
}
}  // namespace detail

/// How long a process waits for the others in a collective over processes (or in the
/// agreement before one, or where a process map starts and ends) before it gives up: the
/// environment variable NAMEDAX_MPI_TIMEOUT in seconds, else this setting, 600 s by default.
/// When it passes, the process asks every other one where it is; every waiting process then
/// throws a collective_error naming the collective, the call's sequence number and the
/// processes that did not arrive (those that did not answer: returned, died, or busy outside
/// namedax), and later process maps fail at once. End the program then (MPI_Abort; the
/// environment's destructor does it if the program does not): MPI cannot take back the
/// calls left pending. `namedax::mpi::set_timeout(std::chrono::seconds(30))`.
inline void set_timeout(std::chrono::duration<double> t) { detail::timeout_seconds() = t.count(); }
[[nodiscard]] inline std::chrono::duration<double> timeout() { return std::chrono::duration<double>(detail::timeout_seconds()); }

namespace detail {
using namespace namedax::detail;

/// Turns a failed MPI call into a namedax::error with MPI's own error string.
inline void check(int code, std::string_view call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  fail("namedax::mpi: ", call, " failed: ", std::string_view(text, static_cast<std::size_t>(length)));
}

inline int count_of(std::size_t count, std::string_view call) {
  if (count > static_cast<std::size_t>(INT_MAX))
    fail("namedax::mpi: ", call, " of ", count, " elements exceeds MPI's int count (", INT_MAX, ")");
  return static_cast<int>(count);
}

/// max and min that propagate NaN, as pmax and pmin do in the other placements (MPI_MAX
/// and MPI_MIN leave NaN to the comparison, which drops it).
template <class T, bool Max>
void nan_propagating(void* in, void* inout, int* length, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int k = 0; k < *length; ++k)
    b[k] = (std::isnan(a[k]) || std::isnan(b[k])) ? std::numeric_limits<T>::quiet_NaN()
           : Max                                 ? (b[k] < a[k] ? a[k] : b[k])
                                                 : (a[k] < b[k] ? a[k] : b[k]);
}

/// What every agreement exchanges: one MPI_Allreduce on the world of this fixed-size record,
/// merged by merge_records. The signature's hash travels as the maximum of it and of its
/// complement over the processes (hash == ~complement only when every process sent the same);
/// the payload of a small all-reduce rides along and is reduced only where the records agree.
/// Every agreement sends the whole record, with a payload or without: processes that disagree
/// (one sends a payload, another none, or another size) still make matching MPI calls.
struct agreement_header {
  std::uint64_t hash = 0, complement = 0;
  std::uint64_t count = 0;  // payload elements (0: none)
  std::uint32_t kind = 0, fold = 0;  // a fold_kind, or gathered
  std::uint32_t differ = 0;  // a merge met records of the same hash that describe different payloads
  std::uint32_t unused = 0;
};
struct agreement_record {
  static constexpr std::size_t capacity = 1024;  // payload bytes
  // The fold of an all-gather's payload: bytes or'ed, each process's block in its place and
  // zeros elsewhere.
  static constexpr std::uint32_t gathered = 3;
  agreement_header header;
  alignas(16) std::byte payload[capacity];
};

/// `count` elements of `in` folded into `inout` by `op`; the records MPI hands to an
/// operation may be unaligned, so elements are copied in and out.
template <class T, class Op>
void fold_elements(const std::byte* in, std::byte* inout, std::size_t count, Op op) {
  for (std::size_t k = 0; k < count; ++k) {
    T a, b;
    std::memcpy(&a, in + k * sizeof(T), sizeof(T));
    std::memcpy(&b, inout + k * sizeof(T), sizeof(T));
    b = op(a, b);
    std::memcpy(inout + k * sizeof(T), &b, sizeof(T));
  }
}

/// The fold of the MPI call the payload would otherwise make: MPI_SUM (integers wrap),
/// nan_propagating for floating max and min, MPI_LOR and MPI_LAND for bools.
template <class T>
void fold_payload(const std::byte* in, std::byte* inout, std::size_t count, fold_kind fold) {
  if constexpr (std::is_same_v<T, bool>) {
    if (fold == fold_kind::min) fold_elements<T>(in, inout, count, [](bool a, bool b) { return a && b; });
    else fold_elements<T>(in, inout, count, [](bool a, bool b) { return a || b; });
  } else if (fold == fold_kind::sum) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      fold_elements<T>(in, inout, count, [](T a, T b) { return static_cast<T>(static_cast<U>(b) + static_cast<U>(a)); });
    } else {
      fold_elements<T>(in, inout, count, [](T a, T b) { return b + a; });
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    const bool max = fold == fold_kind::max;
    fold_elements<T>(in, inout, count, [max](T a, T b) {
      return (std::isnan(a) || std::isnan(b)) ? std::numeric_limits<T>::quiet_NaN()
             : max                            ? (b < a ? a : b)
                                              : (a < b ? a : b);
    });
  } else if constexpr (std::is_integral_v<T>) {
    if (fold == fold_kind::max) fold_elements<T>(in, inout, count, [](T a, T b) { return b < a ? a : b; });
    else fold_elements<T>(in, inout, count, [](T a, T b) { return a < b ? a : b; });
  }
}

/// Calls `f` with a null pointer of the element type of `kind`.
template <class F>
decltype(auto) with_element_type(element_kind kind, F&& f) {
  switch (kind) {
    case element_kind::boolean: return f(static_cast<bool*>(nullptr));
    case element_kind::int8: return f(static_cast<std::int8_t*>(nullptr));
    case element_kind::int16: return f(static_cast<std::int16_t*>(nullptr));
    case element_kind::int32: return f(static_cast<std::int32_t*>(nullptr));
    case element_kind::int64: return f(static_cast<std::int64_t*>(nullptr));
    case element_kind::uint8: return f(static_cast<std::uint8_t*>(nullptr));
    case element_kind::uint16: return f(static_cast<std::uint16_t*>(nullptr));
    case element_kind::uint32: return f(static_cast<std::uint32_t*>(nullptr));
    case element_kind::uint64: return f(static_cast<std::uint64_t*>(nullptr));
    case element_kind::float32: return f(static_cast<float*>(nullptr));
    case element_kind::float64: return f(static_cast<double*>(nullptr));
    case element_kind::complex64: return f(static_cast<std::complex<float>*>(nullptr));
    case element_kind::complex128: break;
  }
  return f(static_cast<std::complex<double>*>(nullptr));
}

/// The MPI operation of the agreement: headers merge by max (and `differ` marks a mismatch
/// the hashes would miss), payloads fold only between records that describe them alike. When
/// every process agrees, every merge is between agreeing records, so the payload is right.
inline void merge_records(void* in, void* inout, int* length, MPI_Datatype*) {
  for (int r = 0; r < *length; ++r) {
    const auto* a = static_cast<const std::byte*>(in) + static_cast<std::size_t>(r) * sizeof(agreement_record);
    auto* b = static_cast<std::byte*>(inout) + static_cast<std::size_t>(r) * sizeof(agreement_record);
    agreement_header x, y;
    std::memcpy(&x, a, sizeof x);
    std::memcpy(&y, b, sizeof y);
    const bool alike = x.hash == y.hash && x.complement == y.complement && x.count == y.count && x.kind == y.kind &&
                       x.fold == y.fold;
    const std::byte* from = a + offsetof(agreement_record, payload);
    std::byte* into = b + offsetof(agreement_record, payload);
    if (alike && !x.differ && !y.differ && y.fold == agreement_record::gathered && y.count <= agreement_record::capacity)
      for (std::size_t k = 0; k < y.count; ++k) into[k] |= from[k];
    else if (alike && !x.differ && !y.differ && y.count > 0)
      with_element_type(static_cast<element_kind>(y.kind), [&]<class T>(T*) {
        if (y.count * sizeof(T) <= agreement_record::capacity)
          fold_payload<T>(from, into, y.count, static_cast<fold_kind>(y.fold));
      });
    y.hash = std::max(x.hash, y.hash), y.complement = std::max(x.complement, y.complement);
    y.differ = x.differ || y.differ || !alike;
    std::memcpy(b, &y, sizeof y);
  }
}

/// The record's MPI datatype (one record: MPI never splits it) and the merge, made once.
inline std::pair<MPI_Datatype, MPI_Op> agreement_exchange() {
  static const std::pair<MPI_Datatype, MPI_Op> made = [] {
    std::pair<MPI_Datatype, MPI_Op> m{MPI_DATATYPE_NULL, MPI_OP_NULL};
    check(MPI_Type_contiguous(static_cast<int>(sizeof(agreement_record)), MPI_BYTE, &m.first), "MPI_Type_contiguous");
    check(MPI_Type_commit(&m.first), "MPI_Type_commit");
    check(MPI_Op_create(&merge_records, 1, &m.second), "MPI_Op_create");
    return m;
  }();
  return made;
}

/// Waits for `requests` (a nonblocking MPI call on `call`'s behalf) and, meanwhile, for a
/// notice that another process failed: then the call is left pending and this throws a
/// collective_error naming that process (defined after the grid, which names processes).
inline void wait_or_abandon(MPI_Request* requests, int count, std::string_view call);
/// Waits for `requests` with the watchdog only: for the agreements, where a failing process
/// meets the others, so that no notice may end the wait.
inline void wait_watched(MPI_Request* requests, int count, std::string_view call);

/// The requests of the nonblocking calls in flight, which progress_hook tests (defined after
/// the mesh, which keeps them).
inline void track_in_flight(MPI_Request* requests, int count);
inline void untrack_in_flight(MPI_Request* requests);

/// One communicator of the mesh. Each call is the nonblocking form of an MPI collective,
/// waited for by wait_or_abandon, so that no process waits for one that failed.
class channel final : public process_channel {
 public:
  explicit channel(MPI_Comm comm) : comm_(comm) {
    int size = 0, rank = 0;
    MPI_Comm_size(comm_, &size), MPI_Comm_rank(comm_, &rank);
    size_ = static_cast<std::size_t>(size), rank_ = static_cast<std::size_t>(rank);
  }
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  ~channel() override { MPI_Comm_free(&comm_); }

  [[nodiscard]] std::size_t size() const override { return size_; }
  [[nodiscard]] std::size_t rank() const override { return rank_; }
  void allgather(const void* mine, void* all, std::size_t bytes) override { start_allgather(mine, all, bytes)->wait(); }
  void allreduce(const void* in, void* out, std::size_t count, element_kind kind, fold_kind fold) override {
    start_allreduce(in, out, count, kind, fold)->wait();
  }
  void reduce_scatter(const void* in, void* out, std::size_t count_each, element_kind kind, fold_kind fold) override {
    start_reduce_scatter(in, out, count_each, kind, fold)->wait();
  }
  void broadcast(void* data, std::size_t bytes, std::size_t root) override {
    const int n = count_of(bytes, "MPI_Bcast");
    auto started = std::make_unique<pending>(*this, "MPI_Bcast", 1, true);
    check(MPI_Ibcast(data, n, MPI_BYTE, static_cast<int>(root), comm_, &started->requests[0]), "MPI_Bcast");
    started->wait();
  }
  void alltoall(const void* in, void* out, std::size_t bytes_each) override { start_alltoall(in, out, bytes_each)->wait(); }
  std::unique_ptr<pending_call> start_allgather(const void* mine, void* all, std::size_t bytes) override {
    const int n = count_of(bytes, "MPI_Allgather");
    auto started = std::make_unique<pending>(*this, "MPI_Allgather", 1, true);
    check(MPI_Iallgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, comm_, &started->requests[0]), "MPI_Allgather");
    return started;
  }
  std::unique_ptr<pending_call> start_allreduce(const void* in, void* out, std::size_t count, element_kind kind,
                                                fold_kind fold) override {
    auto started = std::make_unique<pending>(*this, "MPI_Allreduce", 1, true);
    check(MPI_Iallreduce(in, out, count_of(count, "MPI_Allreduce"), datatype_of(kind), op(kind, fold), comm_,
                         &started->requests[0]),
          "MPI_Allreduce");
    return started;
  }
  std::unique_ptr<pending_call> start_reduce_scatter(const void* in, void* out, std::size_t count_each, element_kind kind,
                                                     fold_kind fold) override {
    auto started = std::make_unique<pending>(*this, "MPI_Reduce_scatter_block", 1, true);
    check(MPI_Ireduce_scatter_block(in, out, count_of(count_each, "MPI_Reduce_scatter_block"), datatype_of(kind),
                                    op(kind, fold), comm_, &started->requests[0]),
          "MPI_Reduce_scatter_block");
    return started;
  }
  std::unique_ptr<pending_call> start_alltoall(const void* in, void* out, std::size_t bytes_each) override {
    const int n = count_of(bytes_each, "MPI_Alltoall");
    auto started = std::make_unique<pending>(*this, "MPI_Alltoall", 1, true);
    check(MPI_Ialltoall(in, n, MPI_BYTE, out, n, MPI_BYTE, comm_, &started->requests[0]), "MPI_Alltoall");
    return started;
  }
  void alltoallv(const void* in, std::span<const std::size_t> send_bytes, std::span<const std::size_t> send_at,
                 void* out, std::span<const std::size_t> recv_bytes, std::span<const std::size_t> recv_at) override {
    auto ints = [](std::span<const std::size_t> v) {
      std::vector<int> n;
      for (std::size_t x : v) n.push_back(count_of(x, "MPI_Alltoallv"));
      return n;
    };
    // MPI reads the counts until the call completes: a call left pending keeps them.
    auto counts = std::make_shared<std::array<std::vector<int>, 4>>(
        std::array{ints(send_bytes), ints(send_at), ints(recv_bytes), ints(recv_at)});
    auto& [sc, sd, rc, rd] = *counts;
    MPI_Request request;
    check(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_BYTE, out, rc.data(), rd.data(), MPI_BYTE, comm_, &request),
          "MPI_Alltoallv");
    try {
      finish(&request, 1, "MPI_Alltoallv");
    } catch (...) {
      static std::vector<std::shared_ptr<void>> kept;  // only one thread of a process calls MPI
      kept.push_back(counts);
      throw;
    }
  }
  void sendrecv(const void* in, long to, void* out, long from, std::size_t bytes) override {
    const int n = count_of(bytes, "MPI_Sendrecv");
    MPI_Request requests[2];
    check(MPI_Irecv(out, n, MPI_BYTE, from < 0 ? MPI_PROC_NULL : static_cast<int>(from), 0, comm_, &requests[0]),
          "MPI_Sendrecv");
    const int sent = MPI_Isend(in, n, MPI_BYTE, to < 0 ? MPI_PROC_NULL : static_cast<int>(to), 0, comm_, &requests[1]);
    if (sent != MPI_SUCCESS) {
      MPI_Cancel(&requests[0]);
      MPI_Wait(&requests[0], MPI_STATUS_IGNORE);
    }
    check(sent, "MPI_Sendrecv");
    finish(requests, 2, "MPI_Sendrecv");
  }
  /// MPI_Irecv and MPI_Isend now; wait() is the wait of sendrecv (wait_or_abandon).
  std::unique_ptr<pending_call> start_sendrecv(const void* in, long to, void* out, long from,
                                               std::size_t bytes) override {
    const int n = count_of(bytes, "MPI_Sendrecv");
    auto started = std::make_unique<pending>(*this, "MPI_Sendrecv", 2, false);
    check(MPI_Irecv(out, n, MPI_BYTE, from < 0 ? MPI_PROC_NULL : static_cast<int>(from), 0, comm_, &started->requests[0]),
          "MPI_Sendrecv");
    check(MPI_Isend(in, n, MPI_BYTE, to < 0 ? MPI_PROC_NULL : static_cast<int>(to), 0, comm_, &started->requests[1]),
          "MPI_Sendrecv");  // on failure, the receive is let go of as the pending call goes
    return started;
  }
  /// Whether a call on this communicator was left pending (another process failed in it).
  [[nodiscard]] bool abandoned() const { return abandoned_; }

 private:
  static MPI_Op op(element_kind kind, fold_kind fold) {
    if (fold == fold_kind::sum) return MPI_SUM;
    const bool max = fold == fold_kind::max;
    if (kind == element_kind::boolean) return max ? MPI_LOR : MPI_LAND;  // MPI has no max of bools
    if (kind != element_kind::float32 && kind != element_kind::float64) return max ? MPI_MAX : MPI_MIN;
    static const std::array<MPI_Op, 4> ops = [] {
      std::array<MPI_Op, 4> made{};
      MPI_Op_create(&nan_propagating<float, true>, 1, &made[0]);
      MPI_Op_create(&nan_propagating<float, false>, 1, &made[1]);
      MPI_Op_create(&nan_propagating<double, true>, 1, &made[2]);
      MPI_Op_create(&nan_propagating<double, false>, 1, &made[3]);
      return made;
    }();
    return ops[(kind == element_kind::float64 ? 2 : 0) + (max ? 0 : 1)];
  }

  /// A call in flight (`count` requests). Dropped before wait(), a sendrecv's requests are
  /// freed (MPI completes them in the background); a collective's are left as they are, since
  /// MPI forbids freeing them. Either way its owner keeps the buffers for the rest of the program.
  class pending final : public pending_call {
   public:
    pending(channel& c, std::string_view call, int count, bool collective)
        : channel_(c), call_(call), count_(count), collective_(collective) {
      track_in_flight(requests, count_);
    }
    pending(const pending&) = delete;
    pending& operator=(const pending&) = delete;
    ~pending() override {
      untrack_in_flight(requests);
      if (collective_) return;
      for (auto& r : requests)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    void wait() override { channel_.finish(requests, count_, call_); }
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};

   private:
    channel& channel_;
    std::string_view call_;
    int count_;
    bool collective_;
  };

  void finish(MPI_Request* requests, int count, std::string_view call) {
    try {
      wait_or_abandon(requests, count, call);
    } catch (const collective_error&) {
      abandoned_ = true;
      throw;
    }
  }

  MPI_Comm comm_;
  std::size_t size_ = 0, rank_ = 0;
  bool abandoned_ = false;
};

class grid;

/// What every process map of this process shares: the world communicator (a duplicate, so
/// that namedax's traffic never meets the program's own) and every channel made from it.
struct mesh {
  MPI_Comm world = MPI_COMM_NULL;
  std::size_t size = 0, rank = 0;
  std::map<std::string, std::unique_ptr<channel>> channels;
  // The nonblocking calls in flight (their requests and counts), and the one thread that
  // calls MPI (the environment's), on which progress_hook may test them.
  std::vector<std::pair<MPI_Request*, int>> in_flight;
  std::thread::id mpi_thread = std::this_thread::get_id();
  bool failed = false;  // a failure every process knows of (by an agreement): none needs to be told again

  // Failure notices: a process that fails sends "<where>\x02<its message>" to every other one
  // here before it unwinds; a process waiting in an MPI call probes for them (wait_or_abandon).
  MPI_Comm notices = MPI_COMM_NULL;
  std::vector<MPI_Request> notices_sent;
  std::string notice;           // what this process sent, kept until every send completes
  std::vector<char> heard_from;  // by world rank: whose notice this process has received
  bool interrupted = false;     // a notice stopped a call here: this process must still meet the failing one
  // Every process makes the same agreements in the same order (each is one call on the world),
  // so their count names a point of the program on every process; and whether the call that
  // follows the last one completed here. A notice carries both, so that a process waiting in a
  // call the failed process had completed does not give that call up (it will complete).
  std::uint64_t agreements = 0;
  bool call_done = false;
  // The collective this process is in (for messages), set by each agreement.
  const grid* caller = nullptr;
  std::string_view what;
  // Communicators left with a pending call, and what that call may still write to: kept for
  // the rest of the program.
  std::vector<std::unique_ptr<channel>> abandoned;
  // The watchdog: a process that waited past the timeout asks every other one where it is
  // (a query), each one waiting in a namedax call answers, and the first to give up sends
  // its findings (a report) to the others, on a communicator of their own.
  MPI_Comm status = MPI_COMM_NULL;
  std::list<std::pair<MPI_Request, std::string>> status_sent;  // sends in flight, with their text (which must not move)
  bool timed_out = false;  // the processes no longer make the same calls
  // The flight record: the last 16 calls of this process, for the report of a timeout or a failure; a ring
  // whose strings keep their capacity, so that recording a call allocates nothing.
  struct flight {
    std::uint64_t sequence = 0;
    std::string what, signature;
    const char* state = "";
  };
  std::array<flight, 16> flights;
  std::size_t flights_recorded = 0;
  // The record every agreement sends and receives in place, and those of agreements that timed
  // out: their calls stay pending and may still write to them.
  std::unique_ptr<agreement_record> record = std::make_unique<agreement_record>();
  std::vector<std::unique_ptr<agreement_record>> records_left;
  /// The last call recorded (there is one once a process map has started).
  flight& last_flight() { return flights[(flights_recorded + flights.size() - 1) % flights.size()]; }

  mesh() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(world, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &notices), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(notices, MPI_ERRORS_RETURN);
    check(MPI_Comm_dup(MPI_COMM_WORLD, &status), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(status, MPI_ERRORS_RETURN);
    int s = 0, r = 0;
    MPI_Comm_size(world, &s), MPI_Comm_rank(world, &r);
    size = static_cast<std::size_t>(s), rank = static_cast<std::size_t>(r);
    heard_from.assign(size, 0);
  }
  mesh(const mesh&) = delete;
  mesh& operator=(const mesh&) = delete;
  ~mesh() {
    channels.clear();
    for (auto& c : abandoned) (void)c.release();  // their pending calls never complete: never freed
    for (auto& r : records_left) (void)r.release();
    for (auto& [request, text] : status_sent) MPI_Request_free(&request);  // small: MPI completes them
    MPI_Comm_free(&status);
    MPI_Comm_free(&notices);
    MPI_Comm_free(&world);
  }

  /// Tells every other process that this one failed (`where`, `text`), without waiting.
  void send_notices(const std::string& where, std::string_view text) {
    notice = message(agreements, '\x03', call_done ? 1 : 0, '\x03', where, '\x02', text);
    for (std::size_t r = 0; r < size; ++r)
      if (r != rank) {
        MPI_Request request;
        check(MPI_Isend(notice.data(), count_of(notice.size(), "MPI_Isend"), MPI_CHAR, static_cast<int>(r), 0, notices,
                        &request),
              "MPI_Isend");
        notices_sent.push_back(request);
      }
  }

  /// Receives the notice that process `from` sent (it may still be on its way).
  std::string receive_notice(int from) {
    MPI_Status status;
    check(MPI_Probe(from, 0, notices, &status), "MPI_Probe");
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string text(static_cast<std::size_t>(length), '\0');
    check(MPI_Recv(text.data(), length, MPI_CHAR, from, 0, notices, MPI_STATUS_IGNORE), "MPI_Recv");
    heard_from[static_cast<std::size_t>(from)] = 1;
    return text;
  }

  /// After an agreement that every process left knowing of a failure: receives the notices of
  /// the processes that failed (`failed_ranks`) not received yet, completes this process's
  /// own, and drops every communicator (some may hold a call that will never complete), so
  /// that later process maps make new ones.
  void settle_failure(const std::vector<std::size_t>& failed_ranks) {
    for (std::size_t r : failed_ranks)
      if (r != rank && !heard_from[r]) (void)receive_notice(static_cast<int>(r));
    MPI_Waitall(static_cast<int>(notices_sent.size()), notices_sent.data(), MPI_STATUSES_IGNORE);
    notices_sent.clear();
    heard_from.assign(size, 0);
    interrupted = false;
    for (auto& [id, c] : channels)
      if (c->abandoned()) abandoned.push_back(std::move(c));
    channels.clear();
    failed = true;
  }
};

/// Writes the flight record where NAMEDAX_MPI_FLIGHT_RECORD says (defined with the watchdog).
inline void write_flight_record(const mesh& m, std::string_view where, std::string_view ending);

inline std::unique_ptr<mesh>& current_mesh() {
  static std::unique_ptr<mesh> instance;
  return instance;
}

/// MPI's turn, from an array operation (drive_progress): tests the calls in flight, so that
/// a nonblocking collective's next steps start; failures are left for its wait() to report.
inline void progress_in_flight() {
  mesh* m = current_mesh().get();
  if (!m || std::this_thread::get_id() != m->mpi_thread) return;
  for (auto [requests, count] : m->in_flight) {
    int done = 0;
    MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
  }
}

inline void track_in_flight(MPI_Request* requests, int count) {
  mesh* m = current_mesh().get();
  if (!m) return;
  m->in_flight.emplace_back(requests, count);
  progress_hook().store(&progress_in_flight, std::memory_order_relaxed);
}

inline void untrack_in_flight(MPI_Request* requests) {
  mesh* m = current_mesh().get();
  if (!m) return;
  std::erase_if(m->in_flight, [requests](const auto& call) { return call.first == requests; });
  if (m->in_flight.empty()) progress_hook().store(nullptr, std::memory_order_relaxed);
}

/// The process axes of the enclosing process maps. The world rank is, row-major, the indices
/// along them and then this process's place in its block (the processes of one index of the
/// innermost axis, which an inner process map splits further).
class grid final : public process_grid {
 public:
  struct axis {
    std::string name;
    std::size_t size, index;
  };

  explicit grid(mesh& m) : mesh_(&m), block_(m.size), place_(m.rank) {}

  [[nodiscard]] std::size_t block_size() const override { return block_; }

  std::pair<std::shared_ptr<process_grid>, std::size_t> push(std::string_view name, std::size_t n) override {
    auto inner = std::make_shared<grid>(*this);
    inner->block_ = block_ / n;
    const std::size_t index = place_ / inner->block_;
    inner->place_ = place_ % inner->block_;
    inner->axes_.push_back({std::string(name), n, index});
    return {std::move(inner), index};
  }

  process_channel& channel(std::span<const std::string_view> names, const groups_t* groups) override {
    // color: the coordinates along every other axis and the place in the block; key: the
    // rank over `names` in the order given (or the position in this process's group).
    std::string id;
    for (const auto& a : axes_) id += message(a.name, '=', a.size, ';');
    id += message('|', join_names(names), '|', groups ? message(*groups) : std::string());
    auto& slot = mesh_->channels[id];
    if (slot) return *slot;
    std::size_t color = 0, key = 0;
    for (const auto& a : axes_)
      if (std::find(names.begin(), names.end(), a.name) == names.end()) color = color * a.size + a.index;
    color = color * block_ + place_;
    for (auto n : names) {
      const auto& a = *std::find_if(axes_.begin(), axes_.end(), [&](const axis& x) { return x.name == n; });
      key = key * a.size + a.index;
    }
    if (groups) {
      std::size_t group = 0, position = 0;
      for (std::size_t g = 0; g < groups->size(); ++g)
        for (std::size_t p = 0; p < (*groups)[g].size(); ++p)
          if (static_cast<std::size_t>((*groups)[g][p]) == key) group = g, position = p;
      color = color * groups->size() + group, key = position;
    }
    MPI_Comm comm = MPI_COMM_NULL;
    check(MPI_Comm_split(mesh_->world, count_of(color, "MPI_Comm_split"), count_of(key, "MPI_Comm_split"), &comm),
          "MPI_Comm_split");
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    slot = std::make_unique<detail::channel>(comm);
    return *slot;
  }

  void agree(std::string_view signature, std::string_view what) override {
    if (agree_on_every_collective()) {
      agreement(signature, what, nullptr);
    } else {
      mesh_->caller = this, mesh_->what = what, ++mesh_->agreements, mesh_->call_done = false;
      record_flight(signature, what, "started");
    }
  }

  void agree_always(std::string_view signature, std::string_view what) override { agreement(signature, what, nullptr); }

  /// The agreement carries the payload where the channel is every process in world order (the
  /// order of MPI_COMM_WORLD: the same reduction as the channel's MPI_Allreduce) and the payload
  /// fits the record; not with NAMEDAX_MPI_AGREE=0, which makes no agreement.
  std::size_t agree_and_allreduce(std::string_view signature, std::string_view what,
                                  std::span<const std::string_view> names, const groups_t* groups, const void* in,
                                  void* out, std::size_t count, element_kind kind, fold_kind fold) override {
    const bool complex = kind == element_kind::complex64 || kind == element_kind::complex128;
    const std::size_t bytes = with_element_type(kind, []<class T>(T*) { return sizeof(T); }) * count;
    if (!every_process_in_order(names, groups) || (complex && fold != fold_kind::sum) ||
        bytes > agreement_record::capacity)
      return 0;
    const carried payload{in, bytes, 0, out, bytes, count, kind, static_cast<std::uint32_t>(fold)};
    agreement(signature, what, &payload);
    return mesh_->size;
  }

  /// The same for an all-gather whose blocks together fit the record: each process sends its
  /// block in its place (its world rank) and zeros elsewhere, which the merge ORs together.
  std::size_t agree_and_allgather(std::string_view signature, std::string_view what,
                                  std::span<const std::string_view> names, const groups_t* groups, const void* in,
                                  void* out, std::size_t bytes) override {
    if (!every_process_in_order(names, groups) || bytes * mesh_->size > agreement_record::capacity) return 0;
    const carried payload{in,  bytes,          bytes * mesh_->rank,       out, bytes * mesh_->size,
                          bytes * mesh_->size, element_kind::uint8, agreement_record::gathered};
    agreement(signature, what, &payload);
    return mesh_->size;
  }

  [[noreturn]] void raise_everywhere(std::exception_ptr error) override {
    if (mesh_->failed) std::rethrow_exception(error);  // it came from an agreement, or was told already
    if (mesh_->interrupted) {
      // A notice stopped this process's call: it meets the failing process in the agreement
      // that one makes, and the collective_error it threw already names it.
      try {
        agree_always(interrupted_marker, "");
      } catch (const collective_error&) {
      }
      std::rethrow_exception(error);
    }
    std::string text = "an exception that is not a std::exception";
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      text = e.what();
    } catch (...) {
    }
    // Processes waiting in an MPI call (this one failed after the agreement before it) learn
    // of it by a notice; the others in their next agreement. Every agreement is one
    // MPI_Allreduce on the world: this one meets the others' next, in a collective, at the
    // start or at the end of a map, which then fails on every process.
    mesh_->send_notices(path(), text);
    try {
      agree_always(message(threw_marker, text), "");
    } catch (const collective_error&) {
    }
    rethrow_noting(error, message(" (thrown on process ", path(), ")"));
  }

  /// "i=2 (rank 5)": the coordinates along the process axes and the world rank ("rank 5"
  /// outside every process map).
  [[nodiscard]] std::string path() const {
    if (axes_.empty()) return message("rank ", mesh_->rank);
    std::string p;
    for (const auto& a : axes_) append_coordinate(p, a.name, a.index);
    return message(p, " (rank ", mesh_->rank, ")");
  }

 private:
  /// The payload an agreement carries: `in_bytes` at `in`, placed at `at` in the record's
  /// payload (zeros around it), whose first `out_bytes` are the result; as the header says it.
  struct carried {
    const void* in;
    std::size_t in_bytes, at;
    void* out;
    std::size_t out_bytes, count;
    element_kind kind;
    std::uint32_t fold;
  };

  /// Whether channel(names, groups) is every process, ranked as in MPI_COMM_WORLD (so that the
  /// agreement's call computes what the channel's would), and the agreement is made at all
  /// (not with NAMEDAX_MPI_AGREE=0).
  bool every_process_in_order(std::span<const std::string_view> names, const groups_t* groups) const {
    if (!agree_on_every_collective() || groups || block_ != 1 || names.size() != axes_.size()) return false;
    for (std::size_t k = 0; k < names.size(); ++k)
      if (names[k] != axes_[k].name) return false;
    return true;
  }

  /// Every process's `signature` in one MPI_Allreduce of the record on the world (with
  /// `payload`, also the all-reduce); throws a collective_error on every process when they differ.
  void agreement(std::string_view signature, std::string_view what, const carried* payload) {
    mesh_->caller = this, mesh_->what = what, ++mesh_->agreements, mesh_->call_done = false;
    record_flight(signature, what, "agreeing");
    agreement_record& record = *mesh_->record;
    const std::uint64_t mine = fingerprint_of(signature);
    record.header = {mine, ~mine, 0, 0, 0, 0, 0};
    if (payload) {
      record.header.count = payload->count;
      record.header.kind = static_cast<std::uint32_t>(payload->kind), record.header.fold = payload->fold;
      std::memset(record.payload, 0, payload->at);
      if (payload->in_bytes) std::memcpy(record.payload + payload->at, payload->in, payload->in_bytes);
      std::memset(record.payload + payload->at + payload->in_bytes, 0, payload->out_bytes - payload->at - payload->in_bytes);
    }
    const auto [type, op] = agreement_exchange();
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, &record, 1, type, op, mesh_->world, &request), "MPI_Allreduce");
    try {
      wait_watched(&request, 1,
                   payload ? "MPI_Allreduce, which carries the agreement" : "the agreement before it, MPI_Allreduce");
    } catch (...) {
      mesh_->records_left.push_back(std::exchange(mesh_->record, std::make_unique<agreement_record>()));
      throw;
    }
    mesh_->last_flight().state = "started";
    if (record.header.hash == ~record.header.complement && !record.header.differ) {
      if (payload) {
        if (payload->out_bytes) std::memcpy(payload->out, record.payload, payload->out_bytes);
        mesh_->call_done = true, mesh_->last_flight().state = "done";
      }
      // Every process threw the same: each one sent its notice to every other.
      if (signature.starts_with(threw_marker)) {
        std::vector<std::size_t> everyone(mesh_->size);
        std::iota(everyone.begin(), everyone.end(), std::size_t{0});
        mesh_->settle_failure(everyone);
      }
      return;
    }
    mesh_->failed = true;
    const std::string found = disagreement(signature);
    write_flight_record(*mesh_, path(), found);
    throw collective_error(message(what, " on process ", path(), ": ", found, detail::enclosing_function_note()));
  }

  /// Keeps the call in the flight record.
  void record_flight(std::string_view signature, std::string_view what, const char* state) {
    auto& f = mesh_->flights[mesh_->flights_recorded++ % mesh_->flights.size()];
    f.sequence = mesh_->agreements, f.what.assign(what), f.signature.assign(signature), f.state = state;
    for (char& c : f.signature)
      if (static_cast<unsigned char>(c) < 0x20) c = '?';  // the markers of a failure
  }

  static constexpr std::string_view threw_marker = "\x01threw: ";
  static constexpr std::string_view interrupted_marker = "\x01interrupted";

  /// Rethrows `error` with `note` (where it was thrown) appended to its message: a
  /// namedax::error or collective_error as the same type, a standard exception as
  /// rethrow_from_device does; any other type unchanged.
  [[noreturn]] static void rethrow_noting(std::exception_ptr error, const std::string& note) {
    try {
      std::rethrow_exception(error);
    } catch (const namedax::error& e) {
      if (typeid(e) == typeid(collective_error)) throw collective_error(e.what() + note);
      if (typeid(e) == typeid(namedax::error)) throw namedax::error(e.what() + note);
      throw;
    } catch (...) {
    }
    rethrow_from_device(error, note);
  }

  /// NAMEDAX_MPI_AGREE=0 skips the agreement before each collective (an MPI_Allreduce of the
  /// agreement record, which a small all-reduce's payload rides on), for measuring: processes
  /// that make different calls may then hang.
  static bool agree_on_every_collective() {
    static const bool on = [] {
      const char* text = std::getenv("NAMEDAX_MPI_AGREE");
      return !(text && std::string_view(text) == "0");
    }();
    return on;
  }

  /// Every process's path and signature, for the message (only after a disagreement).
  std::string disagreement(std::string_view signature) const {
    const std::string mine = message(path(), '\x02', signature);
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(mesh_->size), offsets(mesh_->size);
    check(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, mesh_->world), "MPI_Allgather");
    std::size_t total = 0;
    for (std::size_t r = 0; r < lengths.size(); ++r) offsets[r] = static_cast<int>(total), total += static_cast<std::size_t>(lengths[r]);
    std::string all(total, '\0');
    check(MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, mesh_->world),
          "MPI_Allgatherv");
    std::vector<std::pair<std::string, std::string>> calls;  // (path, signature) by world rank
    for (std::size_t r = 0; r < lengths.size(); ++r) {
      std::string entry = all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r]));
      const auto cut = entry.find('\x02');
      calls.emplace_back(entry.substr(0, cut), entry.substr(cut + 1));
    }
    std::vector<std::size_t> threw;
    for (std::size_t r = 0; r < calls.size(); ++r)
      if (calls[r].second.starts_with(threw_marker)) threw.push_back(r);
    if (!threw.empty()) {
      mesh_->settle_failure(threw);
      const auto& [who, call] = calls[threw.front()];
      return message("process ", who, " threw: ", call.substr(threw_marker.size()));
    }
    std::size_t other = 0;
    while (calls[other].second == calls[0].second) ++other;
    return message("processes made different calls at the same point: process ", calls[0].first, " called ",
                   calls[0].second, ", process ", calls[other].first, " called ", calls[other].second,
                   "; every process must make the same collective calls in the same order");
  }

  mesh* mesh_;
  std::vector<axis> axes_;
  std::size_t block_;  // processes per index of the innermost axis
  std::size_t place_;  // this process's place among them
};

// ---------------------------------------------------------------- the watchdog

/// The call a message names: `what` of the call, or the process map where none is set yet.
inline std::string_view call_name(std::string_view what) { return what.empty() ? "namedax::mpi::pmap" : what; }

/// This process, as the messages name it: its coordinates in the current process map.
inline std::string process_path(const mesh& m) { return m.caller ? m.caller->path() : message("rank ", m.rank); }

/// Where this process is, as an answer to a query: "<sequence>\x03<what>", and the namedax
/// function that made the call where one did (" (in namedax::all_gather_matmul)").
inline std::string whereabouts(const mesh& m) {
  return message(m.agreements, '\x03', call_name(m.what), detail::enclosing_function_note());
}

inline void send_status(mesh& m, int to, int tag, std::string text) {
  auto& [request, kept] = m.status_sent.emplace_back(MPI_REQUEST_NULL, std::move(text));
  check(MPI_Isend(kept.data(), count_of(kept.size(), "MPI_Isend"), MPI_CHAR, to, tag, m.status, &request), "MPI_Isend");
}

inline std::string receive_status(mesh& m, const MPI_Status& probed) {
  int length = 0;
  MPI_Get_count(&probed, MPI_CHAR, &length);
  std::string text(static_cast<std::size_t>(length), '\0');
  check(MPI_Recv(text.data(), length, MPI_CHAR, probed.MPI_SOURCE, probed.MPI_TAG, m.status, MPI_STATUS_IGNORE),
        "MPI_Recv");
  return text;
}

enum status_tag : int { query = 1, answer = 2, report = 3 };

/// Answers the queries of processes that gave up waiting, and lets go of completed sends.
inline void answer_queries(mesh& m) {
  int arrived = 0;
  MPI_Status probed;
  for (;;) {
    check(MPI_Iprobe(MPI_ANY_SOURCE, status_tag::query, m.status, &arrived, &probed), "MPI_Iprobe");
    if (!arrived) break;
    (void)receive_status(m, probed);
    send_status(m, probed.MPI_SOURCE, status_tag::answer, whereabouts(m));
  }
  std::erase_if(m.status_sent, [](auto& sent) {
    int done = 0;
    MPI_Test(&sent.first, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
}

/// Writes the flight record where NAMEDAX_MPI_FLIGHT_RECORD says: "stderr", or a path to
/// which ".<rank>" is appended; `ending` is what ended the calls (a timeout, a failure).
inline void write_flight_record(const mesh& m, std::string_view where, std::string_view ending) {
  const char* target = std::getenv("NAMEDAX_MPI_FLIGHT_RECORD");
  if (!target || !*target) return;
  const std::size_t kept = std::min(m.flights_recorded, m.flights.size());
  std::string text = message("namedax flight record of process ", where, ", its last ", kept,
                             " collective calls (oldest first):\n");
  for (std::size_t k = m.flights_recorded - kept; k < m.flights_recorded; ++k) {
    const auto& f = m.flights[k % m.flights.size()];
    text += message("  call ", f.sequence, ": ", call_name(f.what),
                    " [", f.signature, "] ", f.state, "\n");
  }
  text += message("  then: ", ending, "\n");
  if (std::string_view(target) == "stderr") {
    std::fputs(text.c_str(), stderr);
  } else if (std::FILE* file = std::fopen(message(target, '.', m.rank).c_str(), "w")) {
    std::fputs(text.c_str(), file);
    std::fclose(file);
  }
}

/// What the processes answer within `grace` seconds of this one's query: which did not
/// arrive at call `sequence` (no answer, or an answer from another call).
inline std::string census(mesh& m, double grace) {
  std::vector<std::string> answers(m.size);
  std::vector<char> answered(m.size, 0);
  answered[m.rank] = 1;
  for (std::size_t r = 0; r < m.size; ++r)
    if (r != m.rank) send_status(m, static_cast<int>(r), status_tag::query, "?");
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace);
  std::size_t missing = m.size - 1;
  while (missing > 0 && std::chrono::steady_clock::now() < until) {
    answer_queries(m);  // the others may be asking too
    int arrived = 0;
    MPI_Status probed;
    check(MPI_Iprobe(MPI_ANY_SOURCE, status_tag::answer, m.status, &arrived, &probed), "MPI_Iprobe");
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    const auto from = static_cast<std::size_t>(probed.MPI_SOURCE);
    answers[from] = receive_status(m, probed);
    if (!answered[from]) answered[from] = 1, --missing;
  }
  std::string silent, elsewhere;
  for (std::size_t r = 0; r < m.size; ++r) {
    if (!answered[r]) {
      silent += message(silent.empty() ? "" : ", ", "rank ", r);
    } else if (r != m.rank) {
      const auto cut = answers[r].find('\x03');
      const std::uint64_t at = std::stoull(answers[r].substr(0, cut));
      if (at != m.agreements)
        elsewhere += message(elsewhere.empty() ? "" : ", ", "rank ", r, " waits in call ", at, " (",
                             answers[r].substr(cut + 1), ")");
    }
  }
  if (silent.empty() && elsewhere.empty())
    return "every process waits in this call (it is slow, or MPI makes no progress)";
  std::string text = "processes that did not arrive: ";
  if (!silent.empty()) text += message(silent, " (no answer: returned, died, or busy outside namedax's calls)");
  if (!elsewhere.empty()) text += message(silent.empty() ? "" : "; ", elsewhere);
  return text;
}

/// "<what> on process <path>", for the messages of a wait; "<what> (in namedax::<function>) on
/// process <path>" inside a function such as a collective matmul.
inline std::string waiter(const mesh& m) {
  return message(call_name(m.what), detail::enclosing_function_note(), " on process ", process_path(m));
}

/// The watchdog's turn in a wait that has spun for a while: answers queries, ends the wait
/// with the report of a process that gave up, or gives up itself past the deadline: asks
/// the others where they are, tells them what it found, and throws.
inline void watch(mesh& m, std::string_view call, std::chrono::steady_clock::time_point since) {
  answer_queries(m);
  int arrived = 0;
  MPI_Status probed;
  check(MPI_Iprobe(MPI_ANY_SOURCE, status_tag::report, m.status, &arrived, &probed), "MPI_Iprobe");
  if (arrived) {
    const std::string report = receive_status(m, probed);
    m.failed = m.timed_out = true;
    if (m.flights_recorded) m.last_flight().state = "waiting";
    write_flight_record(m, process_path(m), report);
    throw collective_error(message(waiter(m), ": ", report));
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  const double limit = timeout_seconds();
  if (waited < limit) return;
  const std::string found = census(m, std::clamp(limit / 4, 0.2, 2.0));
  const std::string path = process_path(m);
  const std::string what_happened =
      message("waited ", limit, " s in collective call ", m.agreements, " (", call, ") and gave up; ", found);
  for (std::size_t r = 0; r < m.size; ++r)
    if (r != m.rank) send_status(m, static_cast<int>(r), status_tag::report, message("process ", path, ' ', what_happened));
  m.failed = m.timed_out = true;
  if (m.flights_recorded) m.last_flight().state = "timed out";
  write_flight_record(m, path, what_happened);
  throw collective_error(message(waiter(m), ": ", what_happened, "; end the program (MPI_Abort)"));
}

/// The one waiting loop: polls `requests` until they complete (true) or `stop()`, asked after
/// each poll that did not complete them, says to leave them pending (false). It spins first (a
/// small call completes within microseconds), then yields the core to the other processes and
/// threads on it, then sleeps between polls: its core goes to those still computing (a peer's
/// oversubscribed threads, whose work the call waits for); and once past spinning, the
/// watchdog takes its turn at each poll.
template <class Stop>
bool wait_polling(mesh& m, MPI_Request* requests, int count, std::string_view call, Stop stop) {
  const auto since = std::chrono::steady_clock::now();
  int done = 0;
  for (unsigned polls = 0;; ++polls) {
    check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), call);
    if (done) return true;
    if (stop()) return false;
    if (polls > 4096) std::this_thread::sleep_for(std::chrono::microseconds(20));
    else if (polls > 256) std::this_thread::yield();
    if (polls > 256) watch(m, call, since);
  }
}

inline void wait_watched(MPI_Request* requests, int count, std::string_view call) {
  (void)wait_polling(*current_mesh(), requests, count, call, [] { return false; });
}

inline void wait_or_abandon(MPI_Request* requests, int count, std::string_view call) {
  mesh& m = *current_mesh();
  std::string notice;
  // A process failed. Unless it had completed this very call (it failed after it, before the
  // next agreement, where every process learns of it), this call may never complete.
  auto notified = [&] {
    int noticed = 0;
    MPI_Status status;
    check(MPI_Iprobe(MPI_ANY_SOURCE, 0, m.notices, &noticed, &status), "MPI_Iprobe");
    if (!noticed) return false;
    notice = m.receive_notice(status.MPI_SOURCE);
    const auto first = notice.find('\x03'), second = notice.find('\x03', first + 1);
    const std::uint64_t at = std::stoull(notice.substr(0, first));
    const bool completed = notice[first + 1] == '1';
    notice.erase(0, second + 1);
    return at < m.agreements || (at == m.agreements && !completed);
  };
  if (wait_polling(m, requests, count, call, notified)) {
    m.call_done = true;
    if (m.flights_recorded) m.last_flight().state = "done";
    return;
  }
  // This call stays pending (its communicator is dropped at the agreement that settles the failure).
  const auto cut = notice.find('\x02');
  m.interrupted = true;
  const std::string found = message("process ", notice.substr(0, cut), " threw: ", notice.substr(cut + 1));
  write_flight_record(m, process_path(m), found);
  throw collective_error(message(waiter(m), ": ", found));
}

/// The grid a new process map splits: the innermost enclosing one's, or all processes.
inline std::shared_ptr<process_grid> enclosing_grid(std::string_view name) {
  if (current_device())
    fail("namedax::mpi::pmap<\"", name, "\">: a process map cannot run inside the device threads of a pmap; "
         "put the process map outside");
  auto& m = current_mesh();
  if (!m) fail("namedax::mpi::pmap<\"", name, "\">: MPI is not set up; create a namedax::mpi::environment first");
  if (m->timed_out)
    fail<collective_error>("namedax::mpi::pmap<\"", name, "\">: a collective over processes timed out earlier in this "
                           "program, so the processes no longer make the same calls; end the program (MPI_Abort)");
  m->failed = false;  // a failure caught by the program is over: the next one must be told
  m->caller = nullptr, m->what = {};
  const auto& stack = frames();
  for (auto it = stack.rbegin(); it != stack.rend(); ++it)
    if (it->processes) return it->processes;
  return std::make_shared<grid>(*m);
}
}  // namespace detail

/// Sets up MPI for namedax for its lifetime: initializes MPI (unless the program already
/// did) and finalizes it at the end (if it initialized it). Create one in main, first.
class environment {
 public:
  environment(int& argc, char**& argv) { start(&argc, &argv); }
  environment() { start(nullptr, nullptr); }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    // After a timeout MPI_Finalize could wait forever for a process that never comes.
    if (detail::current_mesh() && detail::current_mesh()->timed_out) MPI_Abort(MPI_COMM_WORLD, 1);
    detail::current_mesh().reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }
  /// This process's rank and the number of processes in MPI_COMM_WORLD.
  [[nodiscard]] int rank() const { return static_cast<int>(detail::current_mesh()->rank); }
  [[nodiscard]] int size() const { return static_cast<int>(detail::current_mesh()->size); }

 private:
  void start(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      // Only the thread that runs the process map calls MPI, one call at a time.
      detail::check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    detail::current_mesh() = std::make_unique<detail::mesh>();
  }
  bool owns_ = false;
};

namespace detail {
/// mpi::pmap as an object, as mapped_function is pmap's: called with traced arguments (grad
/// outside the map), the maps' derivative rule records it, and its pullback is the same
/// process map of the function's pullback.
template <class Binding, class F, class InAxes, class OutAxes>
class process_function {
 public:
  process_function(F f, InAxes in_axes, OutAxes out_axes, std::size_t axis_size)
      : f_(std::move(f)), in_axes_(std::move(in_axes)), out_axes_(std::move(out_axes)), axis_size_(axis_size) {}

  template <class... Args>
  auto operator()(const Args&... args) const {
    auto run = [&](const auto&... a) {
      auto grid = enclosing_grid(Binding::axis_type::name);
      // A check of this process's own arguments that fails throws before the map's first
      // agreement: the others learn of it there, instead of waiting for this process.
      try {
        return namedax::detail::call_map<Binding, true>("mpi::pmap", f_, in_axes_, out_axes_, axis_size_, grid.get(), a...);
      } catch (...) {
        grid->raise_everywhere(std::current_exception());
        throw;  // not reached (raise_everywhere rethrows); GCC does not see [[noreturn]] through the virtual call
      }
    };
    return run_or_record(*this, run, args...);
  }

  /// The same process map of another function, with other in_axes and out_axes.
  template <class G, class In, class Out>
  auto remapped(G g, In in_axes, Out out_axes) const {
    return process_function<Binding, G, In, Out>(std::move(g), std::move(in_axes), std::move(out_axes), axis_size_);
  }
  [[nodiscard]] const F& function() const { return f_; }
  [[nodiscard]] const InAxes& in_axes() const { return in_axes_; }
  [[nodiscard]] const OutAxes& out_axes() const { return out_axes_; }

 private:
  F f_;
  InAxes in_axes_;
  OutAxes out_axes_;
  std::size_t axis_size_;
};

/// mpi::pmap with its binding: mpi::pmap's own, or a process axis of a shard_map's mesh.
template <class Binding, class F, class InAxes, class OutAxes>
auto process_map(F f, InAxes in_axes, OutAxes out_axes, std::size_t axis_size) {
  return process_function<Binding, F, InAxes, OutAxes>(std::move(f), std::move(in_axes), std::move(out_axes), axis_size);
}
}  // namespace detail

/// Maps `f` over axis `Name` with one MPI process per index: JAX's pmap, with each rank as
/// one device. Every process calls the returned function. Mapped arguments are either the
/// whole arrays (their extent along in_axes is the axis size; process i takes slice i, and
/// every process receives the whole result, stacked along out_axes, as namedax::pmap
/// returns it), or each process's own slice (extent 1; each process receives its own slice
/// of the result, extent 1 along out_axes, as JAX's multi-process pmap). The axis size is
/// the arguments' extent, else `axis_size`, else the number of processes.
///   namedax::mpi::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(xt::arange<int>(4))  // {6, 6, 6, 6}
template <fixed_string Name, std::size_t Extent = dynamic_extent, class F, class InAxes = int, class OutAxes = int>
auto pmap(F f, InAxes in_axes = 0, OutAxes out_axes = 0, std::size_t axis_size = 0) {
  return detail::process_map<binding<axis<Name>, placement::devices, Extent>>(std::move(f), std::move(in_axes),
                                                                              std::move(out_axes), axis_size);
}

/// A mesh axis of `size` MPI processes, one index per process, as mpi::pmap binds it:
/// `namedax::mesh m{namedax::mpi::processes<"node">(2), namedax::devices<"core">(4)}`. Process
/// axes come first in a mesh (the processes split before their threads do), and `size`
/// divides the number of processes. Every process calls the shard_map and receives the whole
/// result.
template <fixed_string Name>
struct process_axis {
  using axis_type = axis<Name>;
  static constexpr placement place = placement::devices;
  static constexpr bool on_processes = true;
  std::size_t size;

  /// mpi::pmap over this axis, its binding recording the mesh (as mesh_axis::map's does).
  template <class F, class InAxes, class OutAxes>
  auto map(F f, const InAxes& in_axes, const OutAxes& out_axes) const {
    return detail::process_map<mesh_binding<axis<Name>, placement::devices>>(
        std::move(f), in_axes, out_axes, size);
  }
};
template <fixed_string Name>
constexpr process_axis<Name> processes(std::size_t size) {
  return {size};
}

}  // namespace namedax::mpi
