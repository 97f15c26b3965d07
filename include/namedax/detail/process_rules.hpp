// SPDX-License-Identifier: MIT
// The process paths: when every axis of a collective is placed on processes (MPI ranks) and
// the operand varies along all of them, member r is process r's whole payload, and the
// collective is one call of the matching MPI collective (MPI_Allreduce, MPI_Allgather,
// MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Sendrecv; for pbroadcast an MPI_Allreduce of
// bytes) instead of gathering every member
// for the shared rule. Each returns nothing when its case does not apply; the rule then runs.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_to_all.hpp>
#include <namedax/detail/collective_frame.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/pbroadcast.hpp>
#include <namedax/detail/ppermute.hpp>
#include <namedax/detail/psum_scatter.hpp>

#include <cstring>
#include <optional>

namespace namedax::detail {

/// The channel of a collective whose members are whole payloads of processes, after the
/// processes agreed on the call; the payload made row-major if it was not.
template <class T>
struct process_call {
  process_channel* channel = nullptr;
  strided_block<T> in;
  xt::xarray<T> contiguous;
  std::string_view verb;
  std::size_t exchanged_among = 0;  // processes, when the agreement carried the exchange (no channel then)
};

/// A process path whose exchange cannot ride on the agreement.
struct agree_alone {
  template <class T>
  std::size_t operator()(process_grid&, const collective_call&, std::span<const std::string_view>,
                         const process_call<T>&) const {
    return 0;
  }
};

/// Whether every axis is placed on processes and the operand varies along it, on a
/// process's own thread (device threads inside a process go through the rule's funnel).
NAMEDAX_DECL bool placed_on_processes(std::span<const named_axis> axes);

/// An asynchronous collective among processes, run by the blocking collective's own code
/// twice: at its start (`starting`) the process path agrees with the other processes and
/// starts its MPI call (MPI_Iallreduce, ...) into `received`, then stops the run
/// (started_among_processes); at wait() (`replaying`), once the call is finished, the path runs
/// again without agreeing or calling MPI and takes `received` as the call's output, so that the
/// result is the blocking one's, bit for bit. One MPI call per start: a single leaf. A
/// collective that meets the processes again after that call (pargmax's second reduction)
/// makes its later calls in the wait (`finished`), as the blocking collective does.
struct process_start {
  enum class phase { starting, replaying, finished } now = phase::starting;
  std::unique_ptr<process_channel::pending_call> pending;
  std::shared_ptr<void> sent, received;  // what keeps the payload sent, and the output (an xt::xarray<T>)
  bool called = false;                   // the run reached the MPI call
  // The operand the start holds until its wait, and where its elements are: a payload sent
  // from there needs no copy.
  std::shared_ptr<void> operand;
  const void *operand_begin = nullptr, *operand_end = nullptr;
};
/// What stops the start's run once its MPI call is started.
struct started_among_processes {};

/// The asynchronous start or wait this thread is in, if any.
inline process_start*& process_start_in_progress() {
  thread_local process_start* current = nullptr;
  return current;
}

/// `at_once(grid, described, names, call)` may make the agreement and the exchange one call
/// and return the number of processes it reached (the call has no channel then), else 0.
template <class T, class AtOnce = agree_alone>
std::optional<process_call<T>> whole_payloads(std::string_view verb, strided_block<T> in,
                                              std::span<const named_axis> axes, const std::optional<groups_t>& groups,
                                              bool equal_groups, std::string_view options, AtOnce at_once = {}) {
  if (!placed_on_processes(axes)) return std::nullopt;
  const process_start* async = process_start_in_progress();
  const bool replaying = async && async->now == process_start::phase::replaying;  // agreed at the start
  if (!replaying) at_fault_point(fault_point::arrival, verb);
  std::vector<std::string_view> names;
  for (const auto& ax : axes) names.push_back(ax.name);
  (void)make_groups(verb, axes, groups, member_count(axes), equal_groups);  // throws on bad groups
  process_call<T> call{nullptr, std::move(in), {}, verb};
  make_row_major(call.in, call.contiguous);
  process_grid& grid = innermost_process_grid();
  if (!replaying) {
    const collective_call described = call_of<T>(verb, axes, options, groups, call.in.shape);
    if ((call.exchanged_among = at_once(grid, described, names, call))) {
      at_fault_point(fault_point::exchanged, verb);  // done: every process has the result
      return call;
    }
    grid.agree(described.signature, described.what);
  }
  call.channel = &grid.channel(names, groups ? &*groups : nullptr);  // made by the first call: no exchange
  // From here on the other processes may be in the MPI call: a failure reaches them by a notice.
  if (!replaying) at_fault_point(fault_point::exchanged, verb);
  return call;
}

/// The MPI call of a process path into `out`: `start(channel, in, out)` starts it, and it is
/// waited for here; in an asynchronous start it is left in flight, holding what it sends (the
/// operand, or the path's row-major copy) and its own output array, and the run stops; in the
/// wait that array becomes `out`.
template <class T, class Start>
void exchange_across_processes(process_call<T>& call, xt::xarray<T>& out, Start start) {
  process_start* async = process_start_in_progress();
  if (!async || async->now == process_start::phase::finished) {
    call_keeping([&] {
      if (auto pending = start(*call.channel, call.in.data, out.data())) pending->wait();
    }, out, call.contiguous);
    return;
  }
  if (async->now == process_start::phase::replaying) {
    // The path made `out` again: back to the pool, for the program's next array of its size
    // (dropped, its pages would go back to malloc, and the next array would fault them in).
    recycle(std::exchange(out, std::move(*std::static_pointer_cast<xt::xarray<T>>(async->received))));
    async->now = process_start::phase::finished;
    return;
  }
  async->called = true;
  // What MPI reads until the call is finished: the operand itself, when the payload lies in
  // it; the row-major copy the path made; else a copy (a bool sum's int32 values).
  const void* in = call.in.data;
  if (call.contiguous.data() == call.in.data) {
    async->sent = std::make_shared<xt::xarray<T>>(std::move(call.contiguous));  // the buffer moves along
  } else if (std::less_equal<>{}(async->operand_begin, in) && std::less<>{}(in, async->operand_end)) {
    async->sent = async->operand;
  } else {
    auto copy = std::make_shared<xt::xarray<T>>(uninitialized_array<T>(call.in.shape));
    std::copy_n(call.in.data, copy->size(), copy->data());
    in = copy->data(), async->sent = std::move(copy);
  }
  // The run stops here, so the call keeps `out`, whose pages are warm when it was reused (a
  // fresh receive buffer made MPI fault its pages in: several times slower). Its holder is
  // made first: once the call is started, nothing may fail before the call owns `out`.
  auto received = std::make_shared<xt::xarray<T>>();
  async->pending = start(*call.channel, static_cast<const T*>(in), out.data());
  *received = std::move(out);
  async->received = std::move(received);
  at_fault_point(fault_point::reading, call.verb);  // MPI may read and write the arrays from now on
  throw started_among_processes{};
}

/// Whether positional dim 0 of length `length` splits into one chunk per group member.
NAMEDAX_DECL bool groups_divide(std::size_t length, std::span<const named_axis> axes,
                                const std::optional<groups_t>& groups, bool tiled);

/// psum, pmean, pmax, pmin: MPI_Allreduce, in the agreement's own call where the transport
/// can (agree_and_allreduce; not in an asynchronous start, whose call stays in flight).
/// Returns the result and pmean's divisor.
template <class T>
std::optional<std::pair<xt::xarray<T>, xt::xarray<float>>> reduce_across_processes(
    std::string_view verb, const strided_block<T>& in, std::span<const named_axis> axes,
    const std::optional<groups_t>& groups, fold_kind fold, std::string_view options = "") {
  // The output, made for the agreement that carries the payload. Not a default xt::xarray,
  // which allocates its one element: a device collective, which returns below, allocates nothing.
  std::optional<xt::xarray<T>> carried;
  auto at_once = [&](process_grid& grid, const collective_call& described, std::span<const std::string_view> names,
                     const process_call<T>& c) -> std::size_t {
    if (process_start_in_progress()) return 0;
    carried = uninitialized_array<T>(c.in.shape);
    return grid.agree_and_allreduce(described.signature, described.what, names, groups ? &*groups : nullptr,
                                    c.in.data, carried->data(), carried->size(), element_kind_of<T>(), fold);
  };
  auto call = whole_payloads<T>(verb, in, axes, groups, false, options, at_once);
  if (!call) return std::nullopt;
  xt::xarray<T> out = carried ? std::move(*carried) : uninitialized_array<T>(call->in.shape);
  if (!call->exchanged_among) {
    exchange_across_processes(*call, out, [&](process_channel& c, const T* in, T* o) {
      return c.start_allreduce(in, o, out.size(), element_kind_of<T>(), fold);
    });
  }
  xt::xarray<float> divisor = xt::xarray<float>::from_shape(std::vector<std::size_t>(in.shape.size(), 1));
  divisor.fill(static_cast<float>(call->exchanged_among ? call->exchanged_among : call->channel->size()));
  return std::pair{std::move(out), std::move(divisor)};
}

/// all_gather along positional axis 0: MPI_Allgather straight into the output, or in the
/// agreement's own call where the transport can (agree_and_allgather; without groups, and
/// not in an asynchronous start).
template <class T>
std::optional<xt::xarray<T>> all_gather_across_processes(std::string_view verb, const strided_block<T>& in,
                                                         std::size_t positional_rank, std::span<const named_axis> axes,
                                                         const std::optional<groups_t>& groups, int axis, bool tiled) {
  if (axis != 0 || (tiled && positional_rank == 0)) return std::nullopt;
  auto gathered_shape = [tiled](dims_t shape, std::size_t g) {
    if (tiled) shape[0] *= g;
    else insert_dim(shape, 0, g);
    return shape;
  };
  std::optional<xt::xarray<T>> carried;  // as in reduce_across_processes
  auto at_once = [&](process_grid& grid, const collective_call& described, std::span<const std::string_view> names,
                     const process_call<T>& c) -> std::size_t {
    if (groups || process_start_in_progress()) return 0;
    carried = uninitialized_array<T>(gathered_shape(c.in.shape, member_count(axes)));
    return grid.agree_and_allgather(described.signature, described.what, names, nullptr, c.in.data, carried->data(),
                                    element_count(c.in.shape) * sizeof(T));
  };
  auto call = whole_payloads<T>(verb, in, axes, groups, true, gather_options(axis, tiled), at_once);
  if (!call) return std::nullopt;
  if (call->exchanged_among) return std::move(*carried);
  const dims_t shape = gathered_shape(call->in.shape, call->channel->size());
  xt::xarray<T> out = carried && std::equal(shape.begin(), shape.end(), carried->shape().begin(), carried->shape().end())
                          ? std::move(*carried)
                          : uninitialized_array<T>(shape);
  exchange_across_processes(*call, out, [&](process_channel& c, const T* in, T* o) {
    return c.start_allgather(in, o, element_count(call->in.shape) * sizeof(T));
  });
  return out;
}

/// psum_scatter along positional axis 0: MPI_Reduce_scatter_block.
template <class T>
std::optional<xt::xarray<T>> psum_scatter_across_processes(std::string_view verb, const strided_block<T>& in,
                                                           std::size_t positional_rank,
                                                           std::span<const named_axis> axes,
                                                           const std::optional<groups_t>& groups,
                                                           int scatter_dimension, bool tiled) {
  if (scatter_dimension != 0 || positional_rank == 0 || !groups_divide(in.shape[0], axes, groups, tiled))
    return std::nullopt;
  auto call = whole_payloads<T>(verb, in, axes, groups, true,
                                scatter_options(scatter_dimension, tiled));
  if (!call) return std::nullopt;
  dims_t shape = call->in.shape;
  const std::size_t g = call->channel->size();
  if (tiled) shape[0] /= g;
  else shape.erase(shape.begin());
  auto out = uninitialized_array<T>(shape);
  exchange_across_processes(*call, out, [&](process_channel& c, const T* in, T* o) {
    return c.start_reduce_scatter(in, o, out.size(), element_kind_of<T>(), fold_kind::sum);
  });
  return out;
}

/// all_to_all (and pswapaxes) with split and concat axis 0: MPI_Alltoall.
template <class T>
std::optional<xt::xarray<T>> all_to_all_across_processes(std::string_view verb, const strided_block<T>& in,
                                                         std::size_t positional_rank, std::span<const named_axis> axes,
                                                         const std::optional<groups_t>& groups, int split_axis,
                                                         int concat_axis, bool tiled) {
  if (split_axis != 0 || concat_axis != 0 || positional_rank == 0 || !groups_divide(in.shape[0], axes, groups, tiled))
    return std::nullopt;
  auto call = whole_payloads<T>(verb, in, axes, groups, true,
                                split_options(split_axis, concat_axis, tiled));
  if (!call) return std::nullopt;
  auto out = uninitialized_array<T>(call->in.shape);  // chunk k of every member lands at k: same shape
  exchange_across_processes(*call, out, [&](process_channel& c, const T* in, T* o) {
    return c.start_alltoall(in, o, out.size() / c.size() * sizeof(T));
  });
  return out;
}

/// ppermute and pshuffle: one MPI_Sendrecv; a process that receives nothing gets zeros.
template <class T>
std::optional<xt::xarray<T>> ppermute_across_processes(std::string_view verb, const strided_block<T>& in,
                                                       std::span<const named_axis> axes, const permutation_t& perm) {
  auto call = whole_payloads<T>(verb, in, axes, std::nullopt, false, pairs_options(perm));
  if (!call) return std::nullopt;
  const auto from = senders(verb, axes, perm, member_count(axes));
  const auto me = static_cast<long>(call->channel->rank());
  long to = -1;
  for (auto [source, destination] : perm)
    if (source == me) to = destination;
  auto out = uninitialized_array<T>(call->in.shape);
  if (from[static_cast<std::size_t>(me)] < 0) std::fill(out.begin(), out.end(), T{});
  call_keeping(
      [&] { call->channel->sendrecv(call->in.data, to, out.data(), from[static_cast<std::size_t>(me)], out.size() * sizeof(T)); },
      out, call->contiguous);
  return out;
}

/// pbroadcast: MPI_Bcast of the source's payload as bytes, so every element type arrives
/// exact (NaN, infinities, bool).
template <class T>
std::optional<xt::xarray<T>> pbroadcast_across_processes(std::string_view verb, const strided_block<T>& in,
                                                         std::span<const named_axis> axes, int source) {
  if (!placed_on_processes(axes)) return std::nullopt;
  check_source(verb, axes, source);
  auto call = whole_payloads<T>(verb, in, axes, std::nullopt, false, source_options(source));
  if (!call) return std::nullopt;
  auto out = uninitialized_array<T>(call->in.shape);
  const std::size_t bytes = out.size() * sizeof(T);
  if (call->channel->rank() == static_cast<std::size_t>(source) && bytes != 0)
    std::memcpy(out.data(), call->in.data, bytes);
  call_keeping([&] { call->channel->broadcast(out.data(), bytes, static_cast<std::size_t>(source)); }, out,
               call->contiguous);
  return out;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL bool placed_on_processes(std::span<const named_axis> axes) {
  return !axes.empty() && !current_device() && std::all_of(axes.begin(), axes.end(), [](const named_axis& ax) {
    return ax.place == placement::devices && ax.varies && find_frame(ax.name)->processes;
  });
}

NAMEDAX_DECL bool groups_divide(std::size_t length, std::span<const named_axis> axes,
                                const std::optional<groups_t>& groups, bool tiled) {
  std::size_t g = member_count(axes);
  if (groups && !groups->empty()) g = groups->front().size();
  return g > 0 && (tiled ? length % g == 0 : length == g);
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                             \
  NAMEDAX_EXTERN template std::optional<process_call<T>> whole_payloads<T, agree_alone>(                                   \
      std::string_view, strided_block<T>, std::span<const named_axis>, const std::optional<groups_t>&, bool,               \
      std::string_view, agree_alone);                                                                                      \
  NAMEDAX_EXTERN template std::optional<std::pair<xt::xarray<T>, xt::xarray<float>>> reduce_across_processes<T>(           \
      std::string_view, const strided_block<T>&, std::span<const named_axis>, const std::optional<groups_t>&, fold_kind,   \
      std::string_view);                                                                                                   \
  NAMEDAX_EXTERN template std::optional<xt::xarray<T>> all_gather_across_processes<T>(                                     \
      std::string_view, const strided_block<T>&, std::size_t, std::span<const named_axis>, const std::optional<groups_t>&, \
      int, bool);                                                                                                          \
  NAMEDAX_EXTERN template std::optional<xt::xarray<T>> psum_scatter_across_processes<T>(                                   \
      std::string_view, const strided_block<T>&, std::size_t, std::span<const named_axis>, const std::optional<groups_t>&, \
      int, bool);                                                                                                          \
  NAMEDAX_EXTERN template std::optional<xt::xarray<T>> all_to_all_across_processes<T>(                                     \
      std::string_view, const strided_block<T>&, std::size_t, std::span<const named_axis>, const std::optional<groups_t>&, \
      int, int, bool);                                                                                                     \
  NAMEDAX_EXTERN template std::optional<xt::xarray<T>> ppermute_across_processes<T>(                                       \
      std::string_view, const strided_block<T>&, std::span<const named_axis>, const permutation_t&);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
