#include "model/synthetic_source.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "quant/quant.h"

namespace spill {

namespace {

uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [offset - scale, offset + scale) from a counter: any row can be drawn on any thread.
void uniform_row(uint64_t stream, float scale, float offset, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = splitmix64(stream + uint64_t(i));
    const float u = float(bits >> 40) * (1.0f / 16777216.0f);
    out[i] = (u * 2.0f - 1.0f) * scale + offset;
  }
}

// Anonymous memory, committed only where it is written: an unfilled 100 GB model costs nothing.
class Arena {
 public:
  ~Arena() {
    for (auto& [p, n] : regions_) munmap(p, n);
  }
  uint8_t* reserve(size_t n) {
    void* p = mmap(nullptr, std::max<size_t>(n, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) fail("synthetic model: cannot reserve {} bytes of address space", n);
    // Huge pages where the kernel gives them: a 100 GB model written at start-up faults 512 times
    // less often (a dropped range inside a huge page splits it).
    if (n >= (size_t(2) << 20)) madvise(p, n, MADV_HUGEPAGE);
    regions_.emplace_back(p, std::max<size_t>(n, 1));
    return static_cast<uint8_t*>(p);
  }

 private:
  std::vector<std::pair<void*, size_t>> regions_;
};

class SyntheticSource final : public WeightSource {
 public:
  SyntheticSource(const ModelSpec& spec, const SyntheticOptions& options) : spec_(spec), options_(options) {
    where_ = fmt::format("synthetic {} model ({} layers, hidden {}, {} experts)", spec.model_type, spec.n_layers,
                         spec.hidden_size, spec.n_experts);
    const int64_t H = spec.hidden_size, Q = spec.q_dim(), KV = spec.kv_dim(), V = spec.vocab_size;
    add({WeightRole::Embed}, "token_embd.weight", {V, H}, Init::Embedding);
    add({WeightRole::FinalNorm}, "output_norm.weight", {H}, Init::Norm);
    if (!spec.tie_word_embeddings) add({WeightRole::LmHead}, "output.weight", {V, H}, Init::Linear);
    for (int32_t l = 0; l < int32_t(spec.n_layers); ++l) {
      const std::string p = fmt::format("blk.{}.", l);
      auto key = [l](WeightRole r) { return WeightKey{r, l}; };
      add(key(WeightRole::AttnNorm), p + "attn_norm.weight", {H}, Init::Norm);
      add(key(WeightRole::MlpNorm), p + "ffn_norm.weight", {H}, Init::Norm);
      if (spec.attention == AttentionKind::Mla) {
        const MlaSpec& m = spec.mla;
        const int64_t heads = spec.n_heads;
        if (m.q_lora_rank > 0) {
          add(key(WeightRole::QA), p + "attn_q_a.weight", {m.q_lora_rank, H}, Init::Linear);
          add(key(WeightRole::QANorm), p + "attn_q_a_norm.weight", {m.q_lora_rank}, Init::Norm);
          add(key(WeightRole::QB), p + "attn_q_b.weight", {heads * m.qk_head_dim(), m.q_lora_rank}, Init::Linear);
        } else {
          add(key(WeightRole::Q), p + "attn_q.weight", {heads * m.qk_head_dim(), H}, Init::Linear);
        }
        add(key(WeightRole::KVA), p + "attn_kv_a_mqa.weight", {m.cache_values(), H}, Init::Linear);
        add(key(WeightRole::KVANorm), p + "attn_kv_a_norm.weight", {m.kv_lora_rank}, Init::Norm);
        add(key(WeightRole::KVB), p + "attn_kv_b.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
            Init::Linear);
        add(key(WeightRole::O), p + "attn_output.weight", {H, heads * m.v_head_dim}, Init::Linear);
      } else {
        add(key(WeightRole::Q), p + "attn_q.weight", {Q, H}, Init::Linear);
        add(key(WeightRole::K), p + "attn_k.weight", {KV, H}, Init::Linear);
        add(key(WeightRole::V), p + "attn_v.weight", {KV, H}, Init::Linear);
        add(key(WeightRole::O), p + "attn_output.weight", {H, Q}, Init::Linear);
      }
      if (spec.attention_bias) {
        add(key(WeightRole::QBias), p + "attn_q.bias", {Q}, Init::Bias);
        add(key(WeightRole::KBias), p + "attn_k.bias", {KV}, Init::Bias);
        add(key(WeightRole::VBias), p + "attn_v.bias", {KV}, Init::Bias);
        if (spec.attention_out_bias) add(key(WeightRole::OBias), p + "attn_output.bias", {H}, Init::Bias);
      }
      if (spec.attention_sinks) add(key(WeightRole::Sinks), p + "attn_sinks.weight", {spec.n_heads}, Init::Bias);
      if (spec.qk_norm == QkNorm::PerHead) {
        add(key(WeightRole::QNorm), p + "attn_q_norm.weight", {spec.head_dim}, Init::Norm);
        add(key(WeightRole::KNorm), p + "attn_k_norm.weight", {spec.head_dim}, Init::Norm);
      } else if (spec.qk_norm == QkNorm::WholeProjection) {
        add(key(WeightRole::QNorm), p + "attn_q_norm.weight", {Q}, Init::Norm);
        add(key(WeightRole::KNorm), p + "attn_k_norm.weight", {KV}, Init::Norm);
      }
      if (!spec.layer_is_moe[size_t(l)]) {
        const int64_t I = spec.intermediate_size;
        add(key(WeightRole::DenseGate), p + "ffn_gate.weight", {I, H}, Init::Linear);
        add(key(WeightRole::DenseUp), p + "ffn_up.weight", {I, H}, Init::Linear);
        add(key(WeightRole::DenseDown), p + "ffn_down.weight", {H, I}, Init::Linear);
        continue;
      }
      const int64_t E = spec.n_experts, I = spec.moe_intermediate_size;
      add(key(WeightRole::Router), p + "ffn_gate_inp.weight", {E, H}, Init::Router);
      if (options.routing_skew > 0) add(key(WeightRole::RouterBias), p + "ffn_gate_inp.bias", {E}, Init::SkewBias);
      else if (spec.router_bias) add(key(WeightRole::RouterBias), p + "ffn_gate_inp.bias", {E}, Init::Bias);
      if (spec.router.correction_bias) add(key(WeightRole::RouterCorrectionBias), p + "exp_probs_b.bias", {E}, Init::Bias);
      if (spec.n_shared_experts > 0) {
        const int64_t S = spec.shared_intermediate_size();
        add(key(WeightRole::SharedGate), p + "ffn_gate_shexp.weight", {S, H}, Init::Linear);
        add(key(WeightRole::SharedUp), p + "ffn_up_shexp.weight", {S, H}, Init::Linear);
        add(key(WeightRole::SharedDown), p + "ffn_down_shexp.weight", {H, S}, Init::Linear);
      }
      if (spec.expert_bias) {
        add(key(WeightRole::ExpertsGateBias), p + "ffn_gate_exps.bias", {E, I}, Init::Bias);
        add(key(WeightRole::ExpertsUpBias), p + "ffn_up_exps.bias", {E, I}, Init::Bias);
        add(key(WeightRole::ExpertsDownBias), p + "ffn_down_exps.bias", {E, H}, Init::Bias);
      }
      // One contiguous [E, rows, cols] tensor per projection, as GGUF stores experts: expert e is a slice.
      add(key(WeightRole::ExpertsGate), p + "ffn_gate_exps.weight", {E, I, H}, Init::Linear);
      add(key(WeightRole::ExpertsUp), p + "ffn_up_exps.weight", {E, I, H}, Init::Linear);
      add(key(WeightRole::ExpertsDown), p + "ffn_down_exps.weight", {E, H, I}, Init::Linear);
    }
    for (size_t i = 0; i < pending_.size(); ++i) by_address_[uintptr_t(tensors_.at(pending_[i].name).data)] = i;
    if (options.fill != SyntheticFill::Never) fill_at_construction();
    options_.pool = nullptr;  // the caller's; gone after construction
  }

  const std::string& where() const override { return where_; }
  const TensorView* find(const WeightKey& key) const override {
    auto it = by_key_.find(pack(key));
    return it == by_key_.end() ? nullptr : &tensors_.at(it->second);
  }
  std::string describe(const WeightKey& key) const override {
    auto it = by_key_.find(pack(key));
    return fmt::format("{}: {}", where_, it == by_key_.end() ? weight_role_name(key.role) : it->second);
  }
  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }

  void prepare(const void* ptr, size_t bytes) const override {
    if (options_.fill != SyntheticFill::OnDemand || bytes == 0) return;
    const Pending* p = tiled_at(uintptr_t(ptr));
    if (!p) return;
    const TensorView& t = tensors_.at(p->name);
    const int64_t b0 = int64_t(uintptr_t(ptr) - uintptr_t(t.data));
    const int64_t b1 = std::min<int64_t>(int64_t(t.nbytes()), b0 + int64_t(bytes));
    const uint8_t* pool_rows = nullptr;
    {
      std::lock_guard<std::mutex> lock(pools_mutex_);
      auto it = pools_.find(p->name);
      if (it == pools_.end()) {
        ThreadPool one(1);
        it = pools_.emplace(p->name, make_pool(*p, one)).first;
      }
      pool_rows = it->second.data();  // a node of the map: stable while others are added
    }
    copy_from_pool(*p, pool_rows, b0, b1);
  }

  void drop(const void* ptr, size_t bytes) const override {
    // After prepare_all a reader may read any tensor in place at any time: nothing is given back.
    if (options_.fill != SyntheticFill::OnDemand || all_prepared_ || bytes == 0 || !tiled_at(uintptr_t(ptr))) return;
    // Only the pages wholly inside the range: a page shared with a neighbour keeps its bytes.
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t b = (uintptr_t(ptr) + page - 1) / page * page, e = (uintptr_t(ptr) + bytes) / page * page;
    if (e > b) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  }

  void prepare_all() const override {
    if (options_.fill != SyntheticFill::OnDemand) return;
    all_prepared_ = true;
    for (const Pending& p : pending_)
      if (pool_tiled(p.init)) {
        const TensorView& t = tensors_.at(p.name);
        prepare(t.data, t.nbytes());
      }
  }

 private:
  enum class Init { Embedding, Linear, Norm, Bias, Router, SkewBias };
  struct Pending {
    std::string name;
    Init init;
    uint64_t stream;
  };

  static uint64_t pack(const WeightKey& k) {
    return (uint64_t(k.role) << 48) | (uint64_t(uint32_t(k.layer + 1)) << 24) | uint64_t(uint32_t(k.expert + 1));
  }

  void add(const WeightKey& key, const std::string& name, std::initializer_list<int64_t> shape, Init init) {
    TensorView t;
    t.ndim = int(shape.size());
    int d = 0;
    for (int64_t s : shape) t.shape[d++] = s;
    t.dtype = options_.type_for ? options_.type_for(key, t.rows(), t.cols()) : DType::F32;
    if (!row_fits(t.dtype, t.cols()))
      fail("synthetic model: {} has rows of {} weights, which {} (blocks of {}) cannot hold; choose another type",
           name, t.cols(), dtype_name(t.dtype), dtype_block_elems(t.dtype));
    t.data = arena_.reserve(t.nbytes());
    tensors_[name] = t;
    by_key_[pack(key)] = name;
    pending_.push_back({name, init, splitmix64(options_.seed ^ (uint64_t(pending_.size() + 1) << 32))});
  }

  // Rows of a big matrix are copies of a pool of kPoolRows rows, each quantized once.
  static constexpr int64_t kPoolRows = 64;

  static bool pool_tiled(Init init) { return init == Init::Embedding || init == Init::Linear; }
  TensorView& view(const Pending& p) { return tensors_.at(p.name); }

  // A tensor drawn row by row (norms, biases, routers, the skew bias): all of it, now.
  void fill_drawn(const Pending& p) {
    TensorView& t = view(p);
    const int64_t rows = t.rows(), cols = t.cols(), rb = t.row_bytes();
    uint8_t* dst = static_cast<uint8_t*>(const_cast<void*>(t.data));
    std::vector<float> row(static_cast<size_t>(cols));
    if (p.init == Init::SkewBias) {
      // Bias -s * ln(rank) in router-logit standard deviations (router logits have unit variance).
      std::vector<int64_t> rank(static_cast<size_t>(cols));
      std::iota(rank.begin(), rank.end(), 1);
      for (int64_t i = cols - 1; i > 0; --i) std::swap(rank[size_t(i)], rank[splitmix64(p.stream + uint64_t(i)) % uint64_t(i + 1)]);
      for (int64_t e = 0; e < cols; ++e) row[size_t(e)] = float(-options_.routing_skew * std::log(double(rank[size_t(e)])));
      quant::quantize_row(t.dtype, row.data(), dst, cols);
      return;
    }
    const float scale = p.init == Init::Norm ? 0.1f : p.init == Init::Bias ? 0.1f : std::sqrt(3.0f / float(cols));
    const float offset = p.init == Init::Norm ? 1.0f : 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      uniform_row(p.stream + uint64_t(r) * uint64_t(cols), scale, offset, row.data(), cols);
      quant::quantize_row(t.dtype, row.data(), dst + r * rb, cols);
    }
  }

  // The quantized pool rows of a pool-tiled tensor. Embedding rows have unit variance; a linear
  // layer's rows give unit-variance outputs.
  std::vector<uint8_t> make_pool(const Pending& p, ThreadPool& pool) const {
    const TensorView& t = tensors_.at(p.name);
    const int64_t cols = t.cols(), rb = t.row_bytes(), n_pool = std::min(t.rows(), kPoolRows);
    const float scale = p.init == Init::Embedding ? std::sqrt(3.0f) : std::sqrt(3.0f / float(cols));
    std::vector<uint8_t> rows(static_cast<size_t>(n_pool * rb));
    pool.parallel_for(n_pool, [&](int64_t r0, int64_t r1) {
      std::vector<float> f(static_cast<size_t>(cols));
      for (int64_t r = r0; r < r1; ++r) {
        uniform_row(p.stream + uint64_t(r) * uint64_t(cols), scale, 0.0f, f.data(), cols);
        quant::quantize_row(t.dtype, f.data(), rows.data() + r * rb, cols);
      }
    });
    return rows;
  }

  // Bytes [b0, b1) of a pool-tiled tensor from its pool: row r is pool row pick(r), whole or in part.
  void copy_from_pool(const Pending& p, const uint8_t* pool_rows, int64_t b0, int64_t b1) const {
    const TensorView& t = tensors_.at(p.name);
    const int64_t rows = t.rows(), rb = t.row_bytes(), n_pool = std::min(rows, kPoolRows);
    uint8_t* dst = static_cast<uint8_t*>(const_cast<void*>(t.data));
    for (int64_t r = b0 / rb; r * rb < b1; ++r) {
      const uint64_t pick = rows <= kPoolRows ? uint64_t(r) : splitmix64(p.stream ^ uint64_t(r)) % uint64_t(n_pool);
      const int64_t from = std::max(b0, r * rb), to = std::min(b1, (r + 1) * rb);
      std::memcpy(dst + from, pool_rows + pick * uint64_t(rb) + (from - r * rb), size_t(to - from));
    }
  }

  void fill_at_construction() {
    ThreadPool local(1);
    ThreadPool& pool = options_.pool ? *options_.pool : local;
    for (const Pending& p : pending_) {
      if (!pool_tiled(p.init)) {
        fill_drawn(p);
        continue;
      }
      if (options_.fill == SyntheticFill::OnDemand) continue;
      const std::vector<uint8_t> pool_rows = make_pool(p, pool);
      const TensorView& t = view(p);
      const int64_t rb = t.row_bytes();
      pool.parallel_for(t.rows(), [&](int64_t r0, int64_t r1) { copy_from_pool(p, pool_rows.data(), r0 * rb, r1 * rb); });
    }
  }

  // The pool-tiled tensor that holds address a, or null.
  const Pending* tiled_at(uintptr_t a) const {
    auto it = by_address_.upper_bound(a);
    if (it == by_address_.begin()) return nullptr;
    const Pending& p = pending_[std::prev(it)->second];
    const TensorView& t = tensors_.at(p.name);
    const uintptr_t base = uintptr_t(t.data);
    return a < base + t.nbytes() && pool_tiled(p.init) ? &p : nullptr;
  }

  ModelSpec spec_;
  SyntheticOptions options_;
  std::string where_;
  Arena arena_;
  std::map<std::string, TensorView> tensors_;
  std::map<uint64_t, std::string> by_key_;
  std::vector<Pending> pending_;
  std::map<uintptr_t, size_t> by_address_;  // tensor start -> pending_ index
  mutable std::mutex pools_mutex_;
  mutable std::atomic<bool> all_prepared_{false};
  mutable std::map<std::string, std::vector<uint8_t>> pools_;  // OnDemand: pool rows made so far
};

}  // namespace

std::unique_ptr<WeightSource> make_synthetic_source(const ModelSpec& spec, const SyntheticOptions& options) {
  return std::make_unique<SyntheticSource>(spec, options);
}

}  // namespace spill
