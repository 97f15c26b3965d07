// SPDX-License-Identifier: MIT
// The paths among device threads for results that every device gets the same: when every
// axis of a reduction or an all_gather is placed on device threads and the operand varies
// along all of them, the devices build ONE output together and each returns a reference to
// it (values are never written once made). A large reduction folds 1/N of every member per
// device; a smaller one is folded whole by each device, after one barrier when it fits in
// the communicator. The leaves of a pytree are reduced in one exchange. An all_gather copies
// each member once, by its own device. Each returns nothing when its case does not apply;
// the rule (reduction.hpp, all_gather.hpp) then runs.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/compilation.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace namedax::detail {

/// Below this payload size the one-shot rule is faster: each device reads every member,
/// with no second pass over the others' outputs.
inline constexpr std::size_t chunked_reduction_bytes = std::size_t{256} << 10;

/// The names of `axes` when every one is an axis of device threads along which the operand
/// varies (the case of the shared outputs here and of ppermute by reference); else nothing,
/// and nothing while a wait() reads the members an asynchronous start left (received_members).
NAMEDAX_DECL std::optional<xt::svector<std::string_view, 8>> thread_axes(std::span<const named_axis> axes);

/// An exchange among the device threads spanned by `names` in which each member offers its
/// inputs, one per leaf, and gets outputs of `shapes`: with `shared`, rank 0's, which all of
/// them then share; else outputs of its own. An output is given back to the pool when its
/// last reference goes.
template <class T, std::size_t K = 1>
class output_exchange {
 public:
  output_exchange(std::span<const std::string_view> names, const std::array<const T*, K>& in, collective_call call,
                  const std::array<std::span<const std::size_t>, K>& shapes, bool shared = true)
      : mine_{in, &out_} {
    membership m = join(names);
    if (!shared || m.rank == 0)
      for (std::size_t k = 0; k < K; ++k) out_[k] = shared_storage(uninitialized_array<T>(shapes[k]));
    exchange_.emplace(std::move(m), &mine_, std::move(call), 0, exchange_form::offer);
    if (shared && exchange_->rank() != 0) out_ = *offer(0).out;
  }
  output_exchange(const output_exchange&) = delete;  // the others hold pointers into it
  output_exchange& operator=(const output_exchange&) = delete;
  [[nodiscard]] std::size_t rank() const { return exchange_->rank(); }
  [[nodiscard]] std::size_t size() const { return exchange_->size(); }
  [[nodiscard]] const T* input(std::size_t member, std::size_t leaf = 0) const { return offer(member).in[leaf]; }
  [[nodiscard]] T* output(std::size_t leaf = 0) const { return out_[leaf]->data(); }
  /// Waits until every member is done reading and writing, and returns the outputs.
  std::array<std::shared_ptr<xt::xarray<T>>, K> finish() {
    exchange_->release();
    return std::move(out_);
  }

 private:
  struct offered {
    std::array<const T*, K> in;
    const std::array<std::shared_ptr<xt::xarray<T>>, K>* out;
  };
  [[nodiscard]] const offered& offer(std::size_t member) const {
    return *static_cast<const offered*>(exchange_->slot(member));
  }

  std::array<std::shared_ptr<xt::xarray<T>>, K> out_;
  offered mine_;
  std::optional<pointer_exchange> exchange_;
};

/// Folds elements [lo, lo + length) of the members `member(m)`, m < n, into `out + lo`, in
/// rank order, with the rule's kernel.
template <class T, class Member, class Op>
void fold_range(std::size_t n, Member member, std::size_t lo, std::size_t length, T* out, Op op) {
  xt::svector<const T*, 16> sources(n);
  for (std::size_t m = 0; m < n; ++m) sources[m] = member(m) + lo;
  const std::size_t extent[] = {length};
  const std::ptrdiff_t unit[] = {1};
  fold_members<T>(std::span<const T* const>(sources.data(), n), extent, unit, out + lo, unit, op);
}

/// pmean's divisor for a result of `rank` dims: n members (with `count_members`; else empty).
NAMEDAX_DECL xt::xarray<float> members_divisor(std::size_t rank, std::size_t n, bool count_members);

/// psum, pmean, pmax, pmin of the leaves of a pytree, all of element type T, in one exchange
/// instead of one per leaf, among the device threads spanned by `names` (thread_axes of
/// `axes`; no groups). Laid end to end, they are copied into the communicator when they fit
/// there together (one barrier), else lent. From chunked_reduction_bytes in all, device r
/// folds chunk r of the leaves laid end to end into outputs that every device shares; below,
/// each device folds every member into outputs of its own. Members are folded in rank order,
/// as for one leaf, so the bits are the same. Returns the leaves' results and the member
/// count; nothing when there is nothing to reduce.
template <class T, std::size_t K, class Op>
std::optional<std::pair<std::array<std::shared_ptr<xt::xarray<T>>, K>, std::size_t>> reduce_leaves_among_threads(
    std::string_view verb, std::array<strided_block<T>, K> leaves, std::span<const named_axis> axes,
    std::span<const std::string_view> names, Op op) {
  std::array<std::size_t, K + 1> offset{};
  for (std::size_t k = 0; k < K; ++k) offset[k + 1] = offset[k] + element_count(leaves[k].shape);
  const std::size_t total = offset[K], bytes = total * sizeof(T);
  if (bytes == 0) return std::nullopt;
  // Which path a call takes depends only on what every device agrees on (the signature): a
  // device whose leaf is a strided view copies it, so that every member offers the same form.
  auto contiguous = empty_arrays<T, K>();
  for (std::size_t k = 0; k < K; ++k) make_row_major(leaves[k], contiguous[k]);
  // Devices must agree on every leaf's shape, not only on the total.
  thread_local std::string shapes;
  shapes.clear();
  if constexpr (K > 1) {
    write_part(shapes, " of "), write_part(shapes, K), shapes += " leaves of shapes";
    for (std::size_t k = 0; k < K; ++k) shapes += k ? ", " : " ", write_part(shapes, leaves[k].shape);
  }
  const std::size_t laid_shape[] = {total};
  const collective_call call = call_of<T>(verb, axes, shapes, std::nullopt,
                                          K == 1 ? std::span<const std::size_t>(leaves[0].shape) : laid_shape);
  // Folds elements [lo, end) of leaf k of the members into `out`, in pieces that stay in cache.
  auto fold_leaf = [&](T* out, std::size_t n, auto member, std::size_t lo, std::size_t end) {
    constexpr std::size_t piece = std::size_t{1} << 16;
    for (; lo < end; lo += piece) fold_range(n, member, lo, std::min(piece, end - lo), out, op);
  };

  if (bytes <= inline_payload_bytes) {
    alignas(64) std::byte laid[K == 1 ? 1 : inline_payload_bytes];
    if constexpr (K > 1)
      for (std::size_t k = 0; k < K; ++k)
        std::memcpy(laid + offset[k] * sizeof(T), leaves[k].data, (offset[k + 1] - offset[k]) * sizeof(T));
    pointer_exchange exchange(join(names), K == 1 ? static_cast<const void*>(leaves[0].data) : laid, call, bytes);
    const std::size_t n = exchange.size();
    std::array<std::shared_ptr<xt::xarray<T>>, K> out;
    for (std::size_t k = 0; k < K; ++k) {
      out[k] = shared_storage(uninitialized_array<T>(leaves[k].shape));
      fold_leaf(out[k]->data(), n, [&](std::size_t m) { return static_cast<const T*>(exchange.slot(m)) + offset[k]; }, 0,
                offset[k + 1] - offset[k]);
    }
    exchange.release();
    return std::pair{std::move(out), n};
  }
  std::array<const T*, K> inputs;
  std::array<std::span<const std::size_t>, K> leaf_shapes;
  for (std::size_t k = 0; k < K; ++k) inputs[k] = leaves[k].data, leaf_shapes[k] = leaves[k].shape;
  const bool chunked = bytes >= chunked_reduction_bytes;
  output_exchange<T, K> exchange(names, inputs, call, leaf_shapes, chunked);
  const std::size_t n = exchange.size(), r = exchange.rank();
  for (std::size_t k = 0; k < K; ++k) {
    auto member = [&](std::size_t m) { return exchange.input(m, k); };
    if (!chunked) {
      fold_leaf(exchange.output(k), n, member, 0, offset[k + 1] - offset[k]);
      continue;
    }
    // The part of chunk r that lies in leaf k, in the leaf's own indices.
    const std::size_t lo = std::max(offset[k], r * total / n), end = std::min(offset[k + 1], (r + 1) * total / n);
    if (lo < end) fold_leaf(exchange.output(k), n, member, lo - offset[k], end - offset[k]);
  }
  return std::pair{exchange.finish(), n};
}

/// The same for one leaf, with pmean's divisor (`count_members`; else an empty array), where
/// every axis is an axis of device threads and there are no groups; else nothing.
template <class T, class Op>
std::optional<std::pair<shared_array<T>, xt::xarray<float>>> reduce_among_threads(
    std::string_view verb, const strided_block<T>& in, std::span<const named_axis> axes,
    const std::optional<groups_t>& groups, bool count_members, Op op) {
  if (groups) return std::nullopt;
  const auto names = thread_axes(axes);
  if (!names) return std::nullopt;
  auto done = reduce_leaves_among_threads<T, 1>(verb, std::array{in}, axes, *names, op);
  if (!done) return std::nullopt;
  return std::pair{shared_array<T>(std::move(done->first[0])), members_divisor(in.shape.size(), done->second, count_members)};
}

/// The same in the wait of an asynchronous call among device threads, for an operand that
/// the blocking call would fold in chunks: the members fold one output together
/// (shared_fold), each claiming pieces until none is left, then waiting until every piece is
/// folded, in rank order as everywhere. Nothing in every other case: the rule then folds
/// every member on each device.
template <class T, class Op>
std::optional<std::pair<shared_array<T>, xt::xarray<float>>> reduce_in_wait(const strided_block<T>& in,
                                                                           std::span<const named_axis> axes,
                                                                           const std::optional<groups_t>& groups,
                                                                           bool count_members, Op op) {
  received_members* received = members_received();
  const std::size_t total = element_count(in.shape);
  if (!received || groups || total * sizeof(T) < chunked_reduction_bytes ||
      !std::all_of(axes.begin(), axes.end(), [](const named_axis& a) { return a.place == placement::devices && a.varies; }))
    return std::nullopt;
  received_members::entry* mine = received->unread(in.data, in.shape);
  if (!mine || !mine->shared) return std::nullopt;
  const std::vector<const void*> members = std::exchange(mine->members, {});
  const std::shared_ptr<shared_fold> fold = mine->shared();
  std::shared_ptr<xt::xarray<T>> out;
  {
    std::lock_guard lock(fold->making);
    if (!fold->out) fold->out = shared_storage(uninitialized_array<T>(in.shape));
    out = std::static_pointer_cast<xt::xarray<T>>(fold->out);
  }
  constexpr std::size_t piece = std::size_t{1} << 16;
  const std::size_t pieces = (total + piece - 1) / piece;
  auto member = [&](std::size_t m) { return static_cast<const T*>(members[m]); };
  for (std::size_t p; (p = fold->claimed.fetch_add(1, std::memory_order_relaxed)) < pieces;) {
    fold_range(members.size(), member, p * piece, std::min(piece, total - p * piece), out->data(), op);
    fold->folded.fetch_add(1, std::memory_order_release);
  }
  while (fold->folded.load(std::memory_order_acquire) < pieces) std::this_thread::yield();  // pieces others fold now
  return std::pair{shared_array<T>(std::move(out)), members_divisor(in.shape.size(), members.size(), count_members)};
}

/// all_gather without groups: each device copies its own member into its place in the one
/// output.
template <class T>
std::optional<shared_array<T>> gather_among_threads(std::string_view verb, strided_block<T> in,
                                                    std::size_t positional_rank, std::span<const named_axis> axes,
                                                    const std::optional<groups_t>& groups, int axis, bool tiled) {
  if (groups || element_count(in.shape) * sizeof(T) <= inline_payload_bytes) return std::nullopt;
  const auto names = thread_axes(axes);
  if (!names) return std::nullopt;
  xt::xarray<T> contiguous = empty_array<T>();  // the same path for every form of operand
  make_row_major(in, contiguous);
  dims_t positional(in.shape.begin(), in.shape.begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t a = positional_axis(verb, "axis", axis, tiled ? positional_rank : positional_rank + 1, axes);
  const std::size_t tile = tiled ? positional[a] : 1;
  auto out_shape = gathered_positional(std::move(positional), a, member_count(axes), tiled);
  out_shape.insert(out_shape.end(), in.shape.begin() + static_cast<std::ptrdiff_t>(positional_rank), in.shape.end());
  const auto [slot_strides, step] = gathered_slots(out_shape, a, tile, tiled);

  output_exchange<T> exchange(*names, {in.data}, call_of<T>(verb, axes, gather_options(axis, tiled), std::nullopt, in.shape),
                              {out_shape});
  copy_strided(in, exchange.output() + static_cast<std::ptrdiff_t>(exchange.rank()) * step, slot_strides);
  return shared_array<T>(std::move(exchange.finish()[0]));
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::optional<xt::svector<std::string_view, 8>> thread_axes(std::span<const named_axis> axes) {
  if (members_received()) return std::nullopt;
  xt::svector<std::string_view, 8> names;
  for (const auto& ax : axes) {
    if (ax.place != placement::devices || !ax.varies || !find_frame(ax.name)->shared) return std::nullopt;
    names.push_back(ax.name);
  }
  if (names.empty()) return std::nullopt;
  return names;
}

NAMEDAX_DECL xt::xarray<float> members_divisor(std::size_t rank, std::size_t n, bool count_members) {
  xt::xarray<float> d = empty_array<float>();
  if (count_members) d = uninitialized_array<float>(dims_t(rank, 1)), d.fill(static_cast<float>(n));
  return d;
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T, Op)                                                                                       \
  NAMEDAX_EXTERN template std::optional<std::pair<shared_array<T>, xt::xarray<float>>> reduce_among_threads<T, Op>(      \
      std::string_view, const strided_block<T>&, std::span<const named_axis>, const std::optional<groups_t>&, bool, Op); \
  NAMEDAX_EXTERN template std::optional<std::pair<std::array<std::shared_ptr<xt::xarray<T>>, 1>, std::size_t>>           \
  reduce_leaves_among_threads<T, 1, Op>(std::string_view, std::array<strided_block<T>, 1>, std::span<const named_axis>,  \
                                        std::span<const std::string_view>, Op);
#define NAMEDAX_INSTANTIATE_TYPE(T)                                                                                      \
  NAMEDAX_EXTERN template std::optional<shared_array<T>> gather_among_threads<T>(                                        \
      std::string_view, strided_block<T>, std::size_t, std::span<const named_axis>, const std::optional<groups_t>&, int, \
      bool);
NAMEDAX_FOR_EACH_ELEMENT_FOLD(NAMEDAX_INSTANTIATE)
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE_TYPE)
#undef NAMEDAX_INSTANTIATE
#undef NAMEDAX_INSTANTIATE_TYPE
#endif

}  // namespace namedax::detail
