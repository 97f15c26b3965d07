// SPDX-License-Identifier: MIT
// The paths among device threads for results that every device gets the same: when every
// axis of a reduction or an all_gather is placed on device threads and the operand varies
// along all of them, the devices build ONE output together and each returns a reference to
// it (values are never written once made). A reduction folds 1/N of every member per device;
// an all_gather copies each member once, by its own device. A small reduction is one shot
// instead: one barrier, then each device folds the members itself. Each returns nothing
// when its case does not apply; the rule (reduction.hpp, all_gather.hpp) then runs.
#pragma once

#include <namedax/detail/all_gather.hpp>

#include <algorithm>
#include <optional>

namespace namedax::detail {

/// Below this payload size the one-shot rule is faster: each device reads every member,
/// with no second pass over the others' outputs.
inline constexpr std::size_t chunked_reduction_bytes = std::size_t{256} << 10;

/// The names of `axes` when every one is an axis of device threads along which the operand
/// varies (the case of the shared outputs here and of ppermute by reference); else nothing.
inline std::optional<xt::svector<std::string_view, 8>> thread_axes(std::span<const named_axis> axes) {
  xt::svector<std::string_view, 8> names;
  for (const auto& ax : axes) {
    if (ax.place != placement::devices || !ax.varies || !find_frame(ax.name)->shared) return std::nullopt;
    names.push_back(ax.name);
  }
  if (names.empty()) return std::nullopt;
  return names;
}

/// An exchange among the device threads spanned by `names` in which each member offers its
/// input and rank 0 also the output, of `shape`, that all of them then share. The output is
/// given back to the pool when its last reference goes.
template <class T>
class shared_output_exchange {
 public:
  shared_output_exchange(std::span<const std::string_view> names, const T* in, collective_call call,
                         std::span<const std::size_t> shape)
      : mine_{in, &out_} {
    membership m = join(names);
    if (m.rank == 0)
      out_ = shared_storage(uninitialized_array<T>(shape));
    exchange_.emplace(std::move(m), &mine_, std::move(call));
    if (exchange_->rank() != 0) out_ = *offer(0).out;
  }
  shared_output_exchange(const shared_output_exchange&) = delete;  // the others hold pointers into it
  shared_output_exchange& operator=(const shared_output_exchange&) = delete;
  [[nodiscard]] std::size_t rank() const { return exchange_->rank(); }
  [[nodiscard]] std::size_t size() const { return exchange_->size(); }
  [[nodiscard]] const T* input(std::size_t member) const { return offer(member).in; }
  [[nodiscard]] T* output() const { return out_->data(); }
  /// Waits until every member is done writing, and returns the output.
  shared_array<T> finish() {
    exchange_->release();
    return shared_array<T>(std::move(out_));
  }

 private:
  struct offered {
    const T* in;
    const std::shared_ptr<xt::xarray<T>>* out;
  };
  [[nodiscard]] const offered& offer(std::size_t member) const {
    return *static_cast<const offered*>(exchange_->slot(member));
  }

  std::shared_ptr<xt::xarray<T>> out_;
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

/// psum, pmean, pmax, pmin, with the members folded in rank order (the rule's order, so the
/// bits are the same). A payload of at most inline_payload_bytes is copied into the
/// communicator, and each device folds every member into an output of its own: one barrier,
/// and none of the rule's bookkeeping. From chunked_reduction_bytes, device r folds chunk r
/// of the members into the one shared output; after the second barrier it is whole. Returns
/// the result and, with `count_members`, pmean's divisor (else an empty array).
template <class T, class Op>
std::optional<std::pair<shared_array<T>, xt::xarray<float>>> reduce_among_threads(
    std::string_view verb, const strided_block<T>& in, std::span<const named_axis> axes,
    const std::optional<groups_t>& groups, bool count_members, Op op) {
  const std::size_t count = element_count(in.shape), bytes = count * sizeof(T);
  const bool one_shot = bytes > 0 && bytes <= inline_payload_bytes;
  if (groups || (!one_shot && bytes < chunked_reduction_bytes) || in.strides != row_major_strides(in.shape))
    return std::nullopt;
  const auto names = thread_axes(axes);
  if (!names) return std::nullopt;
  auto divisor = [&](std::size_t n) {
    xt::xarray<float> d = empty_array<float>();
    if (count_members) d = uninitialized_array<float>(dims_t(in.shape.size(), 1)), d.fill(static_cast<float>(n));
    return d;
  };
  if (one_shot) {
    pointer_exchange exchange(join(*names), in.data, call_of<T>(verb, axes, "", std::nullopt, in.shape), bytes);
    const std::size_t n = exchange.size();
    auto out = uninitialized_array<T>(in.shape);
    fold_range(n, [&](std::size_t m) { return static_cast<const T*>(exchange.slot(m)); }, 0, count, out.data(), op);
    exchange.release();
    return std::pair{share_array(std::move(out)), divisor(n)};
  }
  shared_output_exchange<T> exchange(*names, in.data, call_of<T>(verb, axes, "", std::nullopt, in.shape), in.shape);
  const std::size_t n = exchange.size(), r = exchange.rank();
  // Chunk r, folded by the rule's own loop, in pieces that stay in cache.
  constexpr std::size_t piece = std::size_t{1} << 16;
  for (std::size_t lo = r * count / n, end = (r + 1) * count / n; lo < end; lo += piece)
    fold_range(n, [&](std::size_t m) { return exchange.input(m); }, lo, std::min(piece, end - lo), exchange.output(), op);
  return std::pair{exchange.finish(), divisor(n)};
}

/// all_gather without groups: each device copies its own member into its place in the one
/// output.
template <class T>
std::optional<shared_array<T>> gather_among_threads(std::string_view verb, const strided_block<T>& in,
                                                    std::size_t positional_rank, std::span<const named_axis> axes,
                                                    const std::optional<groups_t>& groups, int axis, bool tiled) {
  if (groups || element_count(in.shape) * sizeof(T) <= inline_payload_bytes || in.strides != row_major_strides(in.shape))
    return std::nullopt;
  const auto names = thread_axes(axes);
  if (!names) return std::nullopt;
  dims_t positional(in.shape.begin(), in.shape.begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t a = positional_axis(verb, "axis", axis, tiled ? positional_rank : positional_rank + 1, axes);
  const std::size_t tile = tiled ? positional[a] : 1;
  auto out_shape = gathered_positional(std::move(positional), a, member_count(axes), tiled);
  out_shape.insert(out_shape.end(), in.shape.begin() + static_cast<std::ptrdiff_t>(positional_rank), in.shape.end());
  const auto [slot_strides, step] = gathered_slots(out_shape, a, tile, tiled);

  shared_output_exchange<T> exchange(*names, in.data, call_of<T>(verb, axes, gather_options(axis, tiled), std::nullopt, in.shape),
                                     out_shape);
  copy_strided(in, exchange.output() + static_cast<std::ptrdiff_t>(exchange.rank()) * step, slot_strides);
  return exchange.finish();
}

}  // namespace namedax::detail
