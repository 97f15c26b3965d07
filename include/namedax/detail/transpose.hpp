// SPDX-License-Identifier: MIT
// What the transposes of the collectives share: the names of a mask, the sum that makes a
// cotangent the same along names, the match of a result to its primal's type, the local
// slice that transposes all_gather, the local placement that transposes pbroadcast, and
// positional permutes, reshapes and contractions.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/collectives.hpp>
#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/structure.hpp>

#include <algorithm>
#include <bit>
#include <numeric>
#include <optional>
#include <string_view>
#include <vector>

namespace namedax::detail {

/// The positional shape of a cotangent given to a pullback, or of the output it stands for:
/// a named or traced value's, an array's shape, [] for a scalar; none for a value that has no
/// shape yet (axis_index waiting for its environment).
template <class X>
std::optional<std::vector<std::size_t>> positional_shape_of(const X& x) {
  if constexpr (std::is_arithmetic_v<X>) {
    return std::vector<std::size_t>{};
  } else if constexpr (requires { x.shape(); }) {
    const auto& shape = x.shape();  // a named value's is a new vector on each call
    return std::vector<std::size_t>(shape.begin(), shape.end());
  } else {
    return std::nullopt;
  }
}

/// The error for a cotangent or tangent (`what`: "namedax::vjp: the cotangent") whose positional
/// shape `given` is not `expected`, that of the value it stands for (`of`: "the output it
/// stands for"), before any operation on it (xtensor would broadcast a smaller one silently,
/// or fail with its own text, different in each placement); `fix` says what to give.
[[noreturn]] NAMEDAX_DECL void fail_derivative_shape(std::string_view what, std::string_view of, std::string_view fix,
                                                     const std::vector<std::size_t>& given,
                                                     const std::vector<std::size_t>& expected);

/// Each leaf of the derivative `d` (a cotangent or tangent) against the leaf of `value` it
/// stands for, as fail_derivative_shape says; `what(k)` names leaf k of d, made on failure only.
template <class Value, class D, class What>
void check_derivative_shapes(const Value& value, const D& d, What what, std::string_view of, std::string_view fix) {
  const auto value_leaves = tree_leaves(value);
  const auto d_leaves = tree_leaves(d);
  [&]<std::size_t... K>(std::index_sequence<K...>) {
    (
        [&] {
          const auto expected = positional_shape_of(std::get<K>(value_leaves));
          const auto given = positional_shape_of(std::get<K>(d_leaves));
          if (expected && given && *given != *expected)
            fail_derivative_shape(what(is_node<Value> ? message(" of result ", K) : std::string()), of, fix, *given,
                                  *expected);
        }(),
        ...);
  }(std::make_index_sequence<leaf_count<Value>()>{});
}

/// vjp's words for a cotangent of another shape than the output it stands for (JAX's rule).
inline constexpr std::string_view cotangent_stands_for = "the output it stands for";
inline constexpr std::string_view cotangent_fix = "give the pullback a cotangent of the output's shape, as jax.vjp";

/// A cotangent given to vjp's pullback against the output it stands for.
template <class Out, class C>
void check_cotangent_shapes(const Out& out, const C& ct) {
  check_derivative_shapes(
      out, ct, [](const std::string& result) { return message("namedax::vjp: the cotangent", result); },
      cotangent_stands_for, cotangent_fix);
}


template <axis_mask M>
constexpr auto set_bits() {
  std::array<std::size_t, std::popcount(M)> bits{};
  std::size_t n = 0;
  for (std::size_t k = 0; k < 64; ++k)
    if ((M >> k) & 1) bits[n++] = k;
  return bits;
}
// A variable template, so that a lambda may read it in a constant expression without capture.
template <axis_mask M>
inline constexpr auto set_bits_v = set_bits<M>();

/// The names of `Env` in mask `M`, outermost first, as an axis list.
template <class Env, axis_mask M>
constexpr auto axes_of_mask() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return axis_list<0, typename binding_at<Env, set_bits_v<M>[I]>::type::axis_type...>{};
  }(std::make_index_sequence<std::popcount(M)>{});
}

/// The verb that unbound names in a transpose are reported under.
struct transpose_verb {
  static constexpr std::string_view name = "transpose";
};

template <class X>
constexpr void require_named_cotangent() {
  static_assert(NamedValue<X>, "namedax::transpose: the cotangent must be a mapped value (computed inside the "
                               "function given to vmap or pmap)");
}

/// psum of `ct` over those of `Names` along which it varies: a value paired once with
/// each index, as a cotangent of a result that is the same along `Names` must be.
template <class... Names, class C>
auto sum_along_varying(const C& ct, type_list<Names...>) {
  require_named_cotangent<C>();
  using Env = typename C::env_type;
  require_bound<transpose_verb, Env, Names...>();
  constexpr axis_mask m = Env::template mask_of<Names...>() & C::varying;
  if constexpr (m == 0) return ct;
  else return psum(ct, axes_of_mask<Env, m>());
}

/// Gives a transposed value `r` the variance of the primal `X`: a sum over the names `r`
/// varies along and `X` does not (the transpose of the pvary that made `X` meet a varying
/// value), then pvary along the names `X` varies along and `r` does not.
template <class X, class R>
auto match_variance(const R& r) {
  require_named_cotangent<R>();
  if constexpr (!NamedValue<X>) {
    return r;
  } else {
    using Env = typename R::env_type;
    constexpr axis_mask extra = R::varying & ~X::varying;
    constexpr axis_mask missing = X::varying & ~R::varying;
    auto summed = [&] {
      if constexpr (extra == 0) return r;
      else return psum(r, axes_of_mask<Env, extra>());
    }();
    if constexpr (missing == 0) return summed;
    else return pvary(summed, axes_of_mask<Env, missing>());
  }
}

/// The transpose of all_gather on a cotangent that is the same along the names: the rank at
/// position p of its group takes chunk p (along `axis`) of its own value. Nothing is
/// exchanged: the operand does not vary along the names. When the gathered value's type
/// varies (`scaled`: all_gather with options), its cotangent pairs with every member of the
/// group, so the chunk is multiplied by the group's size.
template <class T>
xt::xarray<T> own_chunk_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                             std::span<const named_axis> axes, const std::optional<groups_t>& groups, int axis,
                             bool tiled, bool scaled) {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, groups, true, gather_options(axis, tiled));
  const std::size_t g = frame.groups().members.front().size();
  std::vector<std::size_t> positional(frame.in_shape().begin(),
                                      frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t d = positional_axis(verb, "axis", axis, positional_rank, axes);
  const std::size_t chunk = chunk_length(verb, "axis", axis, positional[d], g, tiled, axes, groups.has_value());
  if (tiled) positional[d] = chunk;
  else positional.erase(positional.begin() + static_cast<std::ptrdiff_t>(d));
  auto out = xt::xarray<T>::from_shape(frame.output_shape(positional, true));
  const auto out_strides = row_major_strides(out.shape());
  frame.for_each_owned(true, [&](std::size_t rank) {
    const std::size_t p = frame.groups().position_of[rank];
    auto piece = tiled ? chunk_of(frame.member(rank), d, p, chunk) : drop_dim(frame.member(rank), d, p);
    copy_strided(piece, frame.at_rank(out.data(), rank, out_strides, positional.size()), out_strides);
  });
  frame.release();
  if (scaled && g != 1)
    for (auto& v : out) v = static_cast<T>(v * static_cast<T>(g));
  return out;
}

/// The names of a type list as JAX prints a tuple of names, for messages: "('i',)", "('i', 'j')".
template <class... Names>
std::string names_text(type_list<Names...>) {
  std::string out = "(";
  const char* separator = "'";
  ((out += separator, out += Names::name, out += '\'', separator = ", '"), ...);
  return out + (sizeof...(Names) == 1 ? ",)" : ")");
}

/// The transpose of pbroadcast from `source` on a cotangent that is the same along the names:
/// the cotangent at index source (row-major over several names), zeros at every other index.
/// Nothing is exchanged: a pairing with the invariant result reads index source's value once.
template <class C, class A>
auto at_source_only(const C& ct, const A& axes, int source) {
  using names = decltype(names_only(to_axis_list(axes)));
  const int size = axis_size(axes);
  if (source < 0 || source >= size)
    fail("namedax::transpose of pbroadcast: source ", source, " is out of range for axis ", names_text(names{}),
         " of size ", size, "; ", valid_indices(static_cast<std::size_t>(size)));
  using T = typename C::value_type;
  return namedax::eval(where(axis_index(axes) == source, ct, T{}));
}

/// A permutation of 0..rank-1 given as ints (negative counting from the end), or an error.
NAMEDAX_DECL std::vector<std::size_t> checked_permutation(std::string_view verb, const std::vector<int>& perm,
                                                          std::size_t rank);

/// Positional dim k of the result is dim perm[k] of x (numpy.transpose); named axes stay.
template <class X>
auto permute_positional(std::string_view verb, const X& x, const std::vector<int>& perm) {
  require_named_cotangent<X>();
  using T = typename X::value_type;
  using Env = typename X::env_type;
  const std::size_t rank = x.dimension();
  const auto p = checked_permutation(verb, perm, rank);
  // The identity on an array of the result's type: x itself, since values never write the
  // arrays they share.
  if constexpr (std::is_same_v<X, named<shared_array<T>, Env, X::varying>>)
    if (std::is_sorted(p.begin(), p.end())) return x;
  xt::xarray<T> storage;
  strided_block<T> b = block_in_memory<T>(x.payload(), storage);
  strided_block<T> view{b.data, {}, {}};
  for (std::size_t k = 0; k < b.shape.size(); ++k) {
    const std::size_t from = k < rank ? p[k] : k;
    view.shape.push_back(b.shape[from]), view.strides.push_back(b.strides[from]);
  }
  auto out = xt::xarray<T>::from_shape(view.shape);
  copy_strided(view, out.data());
  return make_named<shared_array<T>, Env, X::varying>(share_array<T>(std::move(out)));
}

NAMEDAX_DECL std::vector<int> inverse_permutation(const std::vector<std::size_t>& p);

/// x with positional shape `shape` (row-major order of elements, as numpy.reshape).
template <class X>
auto reshape_positional(std::string_view verb, const X& x, const std::vector<std::size_t>& shape) {
  require_named_cotangent<X>();
  using T = typename X::value_type;
  using Env = typename X::env_type;
  xt::xarray<T> a = evaluate(x.payload());
  const std::size_t rank = a.dimension() - Env::vectorized_count;
  std::size_t from = 1, to = 1;
  for (std::size_t k = 0; k < rank; ++k) from *= a.shape()[k];
  for (auto s : shape) to *= s;
  if (from != to)
    fail("namedax::", verb, ": cannot reshape positional shape ", x.shape(), " (", from, " elements) to ", shape,
         " (", to, " elements)");
  std::vector<std::size_t> full = shape;
  full.insert(full.end(), a.shape().begin() + static_cast<std::ptrdiff_t>(rank), a.shape().end());
  a.reshape(full);
  return make_named<shared_array<T>, Env, X::varying>(share_array<T>(std::move(a)));
}

/// The transpose of a sum over positional `dims` of a value of positional shape `shape`:
/// `ct` repeated along those dims.
template <class C>
auto broadcast_positional(const C& ct, const std::vector<std::size_t>& dims, const std::vector<std::size_t>& shape) {
  require_named_cotangent<C>();
  using T = typename C::value_type;
  using Env = typename C::env_type;
  xt::xarray<T> storage;
  strided_block<T> b = block_in_memory<T>(ct.payload(), storage);
  strided_block<T> view{b.data, {}, {}};
  std::size_t next = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    view.shape.push_back(shape[k]);
    if (std::find(dims.begin(), dims.end(), k) != dims.end()) view.strides.push_back(0);
    else view.strides.push_back(b.strides[next++]);
  }
  for (; next < b.shape.size(); ++next) view.shape.push_back(b.shape[next]), view.strides.push_back(b.strides[next]);
  auto out = xt::xarray<T>::from_shape(view.shape);
  copy_strided(view, out.data());
  return make_named<shared_array<T>, Env, C::varying>(share_array<T>(std::move(out)));
}

/// A matrix's transpose: a view of a named value, a copy of a plain array.
template <class W>
auto matrix_transpose(const W& w) {
  if constexpr (NamedOperand<W>) return namedax::permute_dims(w, {1, 0});
  else return xt::xarray<typename W::value_type>(xt::transpose(w));
}

/// The positional rank of a named value or an xtensor expression.
template <class X>
std::size_t positional_rank_of(const X& x) {
  return x.dimension();
}

NAMEDAX_DECL std::vector<std::size_t> canonical_dims(std::string_view verb, const std::vector<int>& dims,
                                                     std::size_t rank, const char* which);

/// How the transpose of u -> dot_general(u, v) (or, with `u_is_rhs`, of u -> dot_general(v, u))
/// computes from the cotangent ct, whose dims are (batch, lhs free, rhs free): ct is contracted
/// with v over v's free dims (`free`) and batched over the batch dims (`batch`), each pair in
/// the product's operand order (ct first when u is the lhs, v first when it is the rhs), then
/// `perm` puts the product's dims into u's order. Depends on ranks and dims alone, so it is
/// computed once in the compiled part, not once per operand type.
struct dot_transpose_plan {
  dimension_pairs free, batch;
  std::vector<int> perm;
};
NAMEDAX_DECL dot_transpose_plan plan_dot_transpose(std::string_view verb, std::size_t u_rank, std::size_t v_rank,
                                                   const dimension_pairs& contract, const dimension_pairs& batch,
                                                   bool u_is_rhs);

/// The transpose of u -> dot_general(u, v) (or, with `u_is_rhs`, of u -> dot_general(v, u))
/// applied to `ct` (see dot_transpose_plan). ct comes first when u is the lhs and v first when
/// it is the rhs, which leaves ct's dims where they are; gemm reads either operand transposed
/// in place, so that neither is copied.
template <class C, class V>
auto dot_transpose(std::string_view verb, const C& ct, const V& v, std::size_t u_rank, const dimension_pairs& contract,
                   const dimension_pairs& batch, bool u_is_rhs) {
  const auto plan = plan_dot_transpose(verb, u_rank, positional_rank_of(v), contract, batch, u_is_rhs);
  auto product =
      u_is_rhs ? local_dot(verb, v, ct, plan.free, plan.batch) : local_dot(verb, ct, v, plan.free, plan.batch);
  return permute_positional(verb, product, plan.perm);  // into u's order; no copy when already in it
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::vector<std::size_t> checked_permutation(std::string_view verb, const std::vector<int>& perm,
                                                          std::size_t rank) {
  if (perm.size() != rank)
    fail("namedax::", verb, ": the permutation ", perm, " must have one entry per positional dimension (", rank, ")");
  std::vector<std::size_t> out;
  std::vector<bool> seen(rank, false);
  for (int p : perm) {
    const int d = p < 0 ? p + static_cast<int>(rank) : p;
    if (d < 0 || d >= static_cast<int>(rank) || seen[static_cast<std::size_t>(d)])
      fail("namedax::", verb, ": ", perm, " is not a permutation of the ", rank, " positional dimensions");
    seen[static_cast<std::size_t>(d)] = true;
    out.push_back(static_cast<std::size_t>(d));
  }
  return out;
}

NAMEDAX_DECL std::vector<int> inverse_permutation(const std::vector<std::size_t>& p) {
  std::vector<int> inv(p.size());
  for (std::size_t k = 0; k < p.size(); ++k) inv[p[k]] = static_cast<int>(k);
  return inv;
}

NAMEDAX_DECL std::vector<std::size_t> canonical_dims(std::string_view verb, const std::vector<int>& dims,
                                                     std::size_t rank, const char* which) {
  std::vector<std::size_t> out;
  for (int d : dims) {
    const int c = d < 0 ? d + static_cast<int>(rank) : d;
    if (c < 0 || c >= static_cast<int>(rank))
      fail("namedax::", verb, ": dimension ", d, " of ", which, " is out of range for positional rank ", rank);
    out.push_back(static_cast<std::size_t>(c));
  }
  return out;
}

NAMEDAX_DECL void fail_derivative_shape(std::string_view what, std::string_view of, std::string_view fix,
                                        const std::vector<std::size_t>& given, const std::vector<std::size_t>& expected) {
  std::string differs;
  if (given.size() != expected.size()) {
    differs = message("rank ", given.size(), ", not ", expected.size());
  } else {
    std::size_t d = 0;
    while (given[d] == expected[d]) ++d;
    differs = message("dim ", d, " has size ", given[d], ", not ", expected[d]);
  }
  fail(what, " has positional shape ", given, " but ", of, " has positional shape ", expected, " (", differs, "); ", fix);
}
NAMEDAX_DECL dot_transpose_plan plan_dot_transpose(std::string_view verb, std::size_t u_rank, std::size_t v_rank,
                                                   const dimension_pairs& contract, const dimension_pairs& batch,
                                                   bool u_is_rhs) {
  const auto& u_contract_in = u_is_rhs ? contract.second : contract.first;
  const auto& v_contract_in = u_is_rhs ? contract.first : contract.second;
  const auto& u_batch_in = u_is_rhs ? batch.second : batch.first;
  const auto& v_batch_in = u_is_rhs ? batch.first : batch.second;
  const auto uc = canonical_dims(verb, u_contract_in, u_rank, u_is_rhs ? "y" : "x");
  const auto vc = canonical_dims(verb, v_contract_in, v_rank, u_is_rhs ? "x" : "y");
  const auto ub = canonical_dims(verb, u_batch_in, u_rank, u_is_rhs ? "y" : "x");
  const auto vb = canonical_dims(verb, v_batch_in, v_rank, u_is_rhs ? "x" : "y");
  auto free_dims = [](std::size_t rank, const std::vector<std::size_t>& c, const std::vector<std::size_t>& b) {
    std::vector<std::size_t> f;
    for (std::size_t d = 0; d < rank; ++d)
      if (std::find(c.begin(), c.end(), d) == c.end() && std::find(b.begin(), b.end(), d) == b.end()) f.push_back(d);
    return f;
  };
  const auto uf = free_dims(u_rank, uc, ub), vf = free_dims(v_rank, vc, vb);
  const std::size_t nb = ub.size();
  // The product's dims are the batch dims, then u's free and contracted dims (u's free dims
  // last when u is the rhs).
  dot_transpose_plan plan;
  const std::size_t ct_vf_start = u_is_rhs ? nb : nb + uf.size();
  for (std::size_t k = 0; k < vf.size(); ++k)
    plan.free.first.push_back(static_cast<int>(ct_vf_start + k)), plan.free.second.push_back(static_cast<int>(vf[k]));
  for (std::size_t k = 0; k < nb; ++k)
    plan.batch.first.push_back(static_cast<int>(k)), plan.batch.second.push_back(static_cast<int>(vb[k]));
  // v's dims left in the product are the ones contracted with u, in v's order.
  std::vector<std::size_t> v_contracted_sorted = vc;
  std::sort(v_contracted_sorted.begin(), v_contracted_sorted.end());
  const std::size_t contracted_start = u_is_rhs ? nb : nb + uf.size(), free_start = u_is_rhs ? nb + uc.size() : nb;
  plan.perm.resize(u_rank);
  for (std::size_t k = 0; k < nb; ++k) plan.perm[ub[k]] = static_cast<int>(k);
  for (std::size_t k = 0; k < uf.size(); ++k) plan.perm[uf[k]] = static_cast<int>(free_start + k);
  for (std::size_t k = 0; k < uc.size(); ++k) {
    const auto at = std::find(v_contracted_sorted.begin(), v_contracted_sorted.end(), vc[k]) - v_contracted_sorted.begin();
    plan.perm[uc[k]] = static_cast<int>(contracted_start + static_cast<std::size_t>(at));
  }
  if (u_is_rhs) {  // the pairs in the product's operand order: v first
    std::swap(plan.free.first, plan.free.second);
    std::swap(plan.batch.first, plan.batch.second);
  }
  return plan;
}

#endif  // NAMEDAX_DEFINITIONS


}  // namespace namedax::detail
