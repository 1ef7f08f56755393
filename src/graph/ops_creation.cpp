// Creation ops: leaves that hold data, filled on the CPU at once.
#include <cmath>
#include <cstring>

#include "hetrain/base/dispatch.h"
#include "hetrain/base/thread_pool.h"
#include "hetrain/graph/ops.h"

namespace hetrain {

namespace {

Array new_array(const Shape& shape, Dtype dtype) {
  for (auto d : shape)
    if (d < 0) fail("[create] negative dimension in shape ", shape_str(shape));
  Array a;
  a.shape = shape;
  a.dtype = dtype;
  a.tag = MemoryTagScope::current();
  a.allocate();
  return a;
}

template <class F>
Tensor fill_with(const Shape& shape, Dtype dtype, F&& value_at) {
  Array a = new_array(shape, dtype);
  dispatch_all(dtype, "create", [&]<class T>() {
    T* p = a.data<T>();
    parallel_for(a.numel(), 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = from_compute<T>(value_at(i));
    });
  });
  return make_leaf(std::move(a));
}

// Philox 4x32-10 (Salmon et al., SC'11).
struct Philox {
  static void round(uint32_t c[4], uint32_t k[2]) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c[1] ^ k[0], n2 = hi0 ^ c[3] ^ k[1];
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
  static void block(uint64_t seed, uint64_t counter, uint32_t out[4]) {
    uint32_t c[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0};
    uint32_t k[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
    for (int r = 0; r < 10; ++r) {
      round(c, k);
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    std::memcpy(out, c, sizeof(c));
  }
};

double u01(uint32_t u) { return (static_cast<double>(u) + 0.5) * (1.0 / 4294967296.0); }

}  // namespace

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

Tensor full(const Shape& shape, double value, Dtype dtype) {
  return fill_with(shape, dtype, [value](int64_t) { return value; });
}
Tensor zeros(const Shape& shape, Dtype dtype) { return full(shape, 0.0, dtype); }
Tensor ones(const Shape& shape, Dtype dtype) { return full(shape, 1.0, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }
Tensor scalar(double value, Dtype dtype) { return full({}, value, dtype); }

Tensor arange(double start, double stop, double step, Dtype dtype) {
  if (step == 0) fail("[arange] step must not be zero");
  double n = std::ceil((stop - start) / step);
  int64_t count = n > 0 ? static_cast<int64_t>(n) : 0;
  return fill_with({count}, dtype,
                   [=](int64_t i) { return start + step * static_cast<double>(i); });
}

Tensor from_blob(const void* data, const Shape& shape, Dtype dtype) {
  Array a = new_array(shape, dtype);
  if (a.nbytes()) std::memcpy(a.raw(), data, a.nbytes());
  return make_leaf(std::move(a));
}

Tensor rand(const Shape& shape, double low, double high, Dtype dtype, Generator& gen) {
  if (!is_floating(dtype)) fail("[rand] needs a floating dtype, got ", dtype_name(dtype));
  if (!(high > low)) fail("[rand] high (", high, ") must be greater than low (", low, ")");
  const uint64_t seed = gen.seed(), base = gen.advance(static_cast<uint64_t>(numel(shape))) / 4;
  return fill_with(shape, dtype, [=](int64_t i) {
    uint32_t r[4];
    Philox::block(seed, base + static_cast<uint64_t>(i) / 4, r);
    return low + (high - low) * (u01(r[i % 4]) - 0.5 / 4294967296.0);
  });
}

Tensor randn(const Shape& shape, Dtype dtype, Generator& gen) {
  if (!is_floating(dtype)) fail("[randn] needs a floating dtype, got ", dtype_name(dtype));
  const uint64_t seed = gen.seed(), base = gen.advance(static_cast<uint64_t>(numel(shape))) / 4;
  return fill_with(shape, dtype, [=](int64_t i) {
    uint32_t r[4];
    Philox::block(seed, base + static_cast<uint64_t>(i) / 4, r);
    int pair = static_cast<int>(i % 4) / 2 * 2;
    double rad = std::sqrt(-2.0 * std::log(u01(r[pair])));
    double th = 2.0 * M_PI * u01(r[pair + 1]);
    return (i % 2 == 0) ? rad * std::cos(th) : rad * std::sin(th);
  });
}

Tensor bernoulli(const Shape& shape, double p, Dtype dtype, Generator& gen) {
  if (!(p >= 0 && p <= 1)) fail("[bernoulli] p must be in [0, 1], got ", p);
  const uint64_t seed = gen.seed(), base = gen.advance(static_cast<uint64_t>(numel(shape))) / 4;
  return fill_with(shape, dtype, [=](int64_t i) {
    uint32_t r[4];
    Philox::block(seed, base + static_cast<uint64_t>(i) / 4, r);
    return u01(r[i % 4]) < p ? 1.0 : 0.0;
  });
}

}  // namespace hetrain
