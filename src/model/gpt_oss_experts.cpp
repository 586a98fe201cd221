#include "model/gpt_oss_experts.h"

#include <cstring>

#include "core/error.h"


namespace spill {

namespace {

std::string shape_of(int ndim, const std::array<int64_t, 4>& shape) {
  std::string s = "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[size_t(d)]);
  return s + "]";
}

bool has_shape(int ndim, const std::array<int64_t, 4>& shape, std::initializer_list<int64_t> want) {
  if (ndim != int(want.size())) return false;
  int d = 0;
  for (int64_t w : want)
    if (shape[size_t(d++)] != w) return false;
  return true;
}

const TensorView& float_tensor(const WeightStore& store, const std::string& name, std::initializer_list<int64_t> want) {
  const TensorView& t = store.get(name);
  if (!dtype_is_float(t.dtype)) fail("{}: tensor '{}' is {}, expected F32, BF16 or F16", store.file_of(name), name, dtype_name(t.dtype));
  if (!has_shape(t.ndim, t.shape, want))
    fail("{}: tensor '{}' has shape {}; gpt-oss with this config.json needs {}", store.file_of(name), name,
         shape_str(t), shape_of(int(want.size()), [&] {
           std::array<int64_t, 4> a{};
           int d = 0;
           for (int64_t w : want) a[size_t(d++)] = w;
           return a;
         }()));
  return t;
}

const ByteTensor& byte_tensor(const WeightStore& store, const std::string& name, std::initializer_list<int64_t> want) {
  const ByteTensor* t = store.find_bytes(name);
  if (!t) fail("{}: missing U8 tensor '{}' (an MXFP4 gpt-oss checkpoint stores its experts as _blocks and _scales)", store.dir(), name);
  if (!has_shape(t->ndim, t->shape, want)) {
    std::array<int64_t, 4> a{};
    int d = 0;
    for (int64_t w : want) a[size_t(d++)] = w;
    fail("{}: tensor '{}' has shape {}; gpt-oss with this config.json needs {}", store.file_of(name), name,
         shape_of(t->ndim, t->shape), shape_of(int(want.size()), a));
  }
  return *t;
}

TensorView view(const void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = int(shape.size());
  int d = 0;
  for (int64_t s : shape) v.shape[size_t(d++)] = s;
  return v;
}

// [E, 2I] interleaved -> two [E, I] (same dtype).
void split_interleaved_bias(const TensorView& b, int64_t E, int64_t I, uint8_t* gate, uint8_t* up) {
  const size_t es = size_t(dtype_traits(b.dtype).block_bytes);
  const auto* src = static_cast<const uint8_t*>(b.data);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < I; ++i) {
      std::memcpy(gate + (e * I + i) * es, src + (e * 2 * I + 2 * i) * es, es);
      std::memcpy(up + (e * I + i) * es, src + (e * 2 * I + 2 * i + 1) * es, es);
    }
}

}  // namespace

void repack_mxfp4_block(const uint8_t codes[16], uint8_t exponent, uint8_t out[17]) {
  uint8_t c[32];
  for (int j = 0; j < 16; ++j) {
    c[2 * j] = codes[j] & 0x0F;
    c[2 * j + 1] = codes[j] >> 4;
  }
  out[0] = exponent;
  for (int l = 0; l < 16; ++l) out[1 + l] = uint8_t(c[l] | (c[l + 16] << 4));
}

GptOssExpertTensors unpack_gpt_oss_experts(const WeightStore& store, const std::string& prefix,
                                           const GptOssExpertShape& shape,
                                           const std::function<uint8_t*(size_t)>& alloc) {
  static_assert(dtype_traits(DType::MXFP4).block_bytes == 17, "ggml MXFP4 block: exponent + 16 bytes of codes");
  const int64_t E = shape.n_experts, H = shape.hidden, I = shape.width;
  GptOssExpertTensors out;
  // Biases: gate/up interleaved like the weights; down as stored.
  const TensorView& gu_bias = float_tensor(store, prefix + "gate_up_proj_bias", {E, 2 * I});
  const size_t bes = size_t(dtype_traits(gu_bias.dtype).block_bytes);
  uint8_t* gb = alloc(size_t(E * I) * bes);
  uint8_t* ub = alloc(size_t(E * I) * bes);
  split_interleaved_bias(gu_bias, E, I, gb, ub);
  out.gate_bias = view(gb, gu_bias.dtype, {E, I});
  out.up_bias = view(ub, gu_bias.dtype, {E, I});
  out.down_bias = float_tensor(store, prefix + "down_proj_bias", {E, H});

  if (store.find(prefix + "gate_up_proj")) {
    // Plain floats: [E, H, 2I] and [E, I, H], inputs first; transpose and de-interleave.
    const TensorView& gu = float_tensor(store, prefix + "gate_up_proj", {E, H, 2 * I});
    const TensorView& dn = float_tensor(store, prefix + "down_proj", {E, I, H});
    const size_t es = size_t(dtype_traits(gu.dtype).block_bytes), ds = size_t(dtype_traits(dn.dtype).block_bytes);
    uint8_t* g = alloc(size_t(E * I * H) * es);
    uint8_t* u = alloc(size_t(E * I * H) * es);
    uint8_t* d = alloc(size_t(E * H * I) * ds);
    const auto* gus = static_cast<const uint8_t*>(gu.data);
    const auto* dns = static_cast<const uint8_t*>(dn.data);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < I; ++i) {
          std::memcpy(g + ((e * I + i) * H + h) * es, gus + ((e * H + h) * 2 * I + 2 * i) * es, es);
          std::memcpy(u + ((e * I + i) * H + h) * es, gus + ((e * H + h) * 2 * I + 2 * i + 1) * es, es);
        }
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < I; ++i)
        for (int64_t h = 0; h < H; ++h)
          std::memcpy(d + ((e * H + h) * I + i) * ds, dns + ((e * I + i) * H + h) * ds, ds);
    out.gate = view(g, gu.dtype, {E, I, H});
    out.up = view(u, gu.dtype, {E, I, H});
    out.down = view(d, dn.dtype, {E, H, I});
    return out;
  }
  // MXFP4: rows are outputs already; repack each block, taking the even rows as gate, odd as up.
  if (H % 32 != 0 || I % 32 != 0)
    fail("{}: MXFP4 experts need hidden ({}) and intermediate ({}) sizes that are multiples of 32", store.dir(), H, I);
  const ByteTensor& gu_blocks = byte_tensor(store, prefix + "gate_up_proj_blocks", {E, 2 * I, H / 32, 16});
  const ByteTensor& gu_scales = byte_tensor(store, prefix + "gate_up_proj_scales", {E, 2 * I, H / 32});
  const ByteTensor& dn_blocks = byte_tensor(store, prefix + "down_proj_blocks", {E, H, I / 32, 16});
  const ByteTensor& dn_scales = byte_tensor(store, prefix + "down_proj_scales", {E, H, I / 32});
  const int64_t g_row = row_bytes(DType::MXFP4, H), d_row = row_bytes(DType::MXFP4, I);
  uint8_t* g = alloc(size_t(E * I * g_row));
  uint8_t* u = alloc(size_t(E * I * g_row));
  uint8_t* d = alloc(size_t(E * H * d_row));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * I; ++r) {
      uint8_t* dst = (r % 2 == 0 ? g : u) + (e * I + r / 2) * g_row;
      for (int64_t b = 0; b < H / 32; ++b) {
        const int64_t block = (e * 2 * I + r) * (H / 32) + b;
        repack_mxfp4_block(gu_blocks.data + block * 16, gu_scales.data[block], dst + b * 17);
      }
    }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < H; ++r)
      for (int64_t b = 0; b < I / 32; ++b) {
        const int64_t block = (e * H + r) * (I / 32) + b;
        repack_mxfp4_block(dn_blocks.data + block * 16, dn_scales.data[block], d + (e * H + r) * d_row + b * 17);
      }
  out.gate = view(g, DType::MXFP4, {E, I, H});
  out.up = view(u, DType::MXFP4, {E, I, H});
  out.down = view(d, DType::MXFP4, {E, H, I});
  return out;
}

}  // namespace spill
