// Experts for the expert store's tests: random valid blocks for a few MoE layers, written as a real
// GGUF file (spill's writer; fused [experts, rows, cols] tensors as llama.cpp stores them) and
// opened with spill's reader, so the store sees read-only file pages exactly as it does with a
// downloaded model; or the same bytes in anonymous memory (what quantize-on-load leaves).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "offload/expert_layout.h"
#include "offload/plan_file.h"
#include "quant/random_blocks.h"

namespace spill::test {

struct ExpertShape {
  int64_t n_layers = 3;
  std::vector<bool> moe{true, false, true};  // [n_layers]
  int64_t hidden = 768, width = 512, n_experts = 12, top_k = 3;
  DType gate_up = DType::Q4_K, down = DType::Q6_K;

  int64_t gate_bytes() const { return width * row_bytes(gate_up, hidden); }
  int64_t down_bytes() const { return hidden * row_bytes(down, width); }
  int64_t expert_bytes() const { return 2 * gate_bytes() + down_bytes(); }
};

// The fused tensors of every MoE layer: gate, up, down, each [n_experts, rows, cols].
struct ExpertBytes {
  ExpertShape shape;
  std::vector<std::vector<uint8_t>> gate, up, down;  // [n_layers], empty for dense layers

  explicit ExpertBytes(const ExpertShape& s, uint64_t seed = 7) : shape(s) {
    gate.resize(size_t(s.n_layers));
    up.resize(size_t(s.n_layers));
    down.resize(size_t(s.n_layers));
    for (int64_t l = 0; l < s.n_layers; ++l) {
      if (!s.moe[size_t(l)]) continue;
      const int64_t gb = s.width * (s.hidden / dtype_traits(s.gate_up).block_elems);
      const int64_t db = s.hidden * (s.width / dtype_traits(s.down).block_elems);
      gate[size_t(l)].resize(size_t(s.n_experts * s.gate_bytes()));
      up[size_t(l)].resize(size_t(s.n_experts * s.gate_bytes()));
      down[size_t(l)].resize(size_t(s.n_experts * s.down_bytes()));
      quant::fill_random_blocks(s.gate_up, gate[size_t(l)].data(), s.n_experts * gb, seed * 100 + uint64_t(3 * l));
      quant::fill_random_blocks(s.gate_up, up[size_t(l)].data(), s.n_experts * gb, seed * 100 + uint64_t(3 * l + 1));
      quant::fill_random_blocks(s.down, down[size_t(l)].data(), s.n_experts * db, seed * 100 + uint64_t(3 * l + 2));
    }
  }

  // Sources pointing at these (anonymous, writable) bytes: the store must copy host experts.
  offload::ExpertSources sources() const {
    offload::ExpertSources src{.where = "anonymous test experts", .n_layers = shape.n_layers, .top_k = shape.top_k};
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      if (!shape.moe[size_t(l)]) continue;
      offload::MoeLayerSource ml{.layer = l, .hidden = shape.hidden, .width = shape.width,
                                 .gate_up_type = shape.gate_up, .down_type = shape.down};
      for (int64_t e = 0; e < shape.n_experts; ++e)
        ml.experts.push_back({gate[size_t(l)].data() + e * shape.gate_bytes(), up[size_t(l)].data() + e * shape.gate_bytes(),
                              down[size_t(l)].data() + e * shape.down_bytes()});
      src.moe_layers.push_back(std::move(ml));
    }
    return src;
  }

  // Writes the experts as a GGUF (ggml's tensor names for fused experts) to `path`.
  void write_gguf(const std::string& path) const {
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::string("spill-offload-test"));
    for (int64_t l = 0; l < shape.n_layers; ++l) {
      if (!shape.moe[size_t(l)]) continue;
      const std::string blk = "blk." + std::to_string(l) + ".";
      w.add_tensor(blk + "ffn_gate_exps.weight", shape.gate_up, {shape.n_experts, shape.width, shape.hidden}, gate[size_t(l)].data());
      w.add_tensor(blk + "ffn_up_exps.weight", shape.gate_up, {shape.n_experts, shape.width, shape.hidden}, up[size_t(l)].data());
      w.add_tensor(blk + "ffn_down_exps.weight", shape.down, {shape.n_experts, shape.hidden, shape.width}, down[size_t(l)].data());
    }
    w.write(path);
  }
};

// Sources pointing into an opened GGUF's mapped pages (expert e = slice e of each fused tensor).
inline offload::ExpertSources gguf_sources(const gguf::GgufFile& file, const ExpertShape& s) {
  offload::ExpertSources src{.where = file.path(), .n_layers = s.n_layers, .top_k = s.top_k};
  for (int64_t l = 0; l < s.n_layers; ++l) {
    if (!s.moe[size_t(l)]) continue;
    const std::string blk = "blk." + std::to_string(l) + ".";
    const gguf::TensorInfo* g = file.find(blk + "ffn_gate_exps.weight");
    const gguf::TensorInfo* u = file.find(blk + "ffn_up_exps.weight");
    const gguf::TensorInfo* d = file.find(blk + "ffn_down_exps.weight");
    if (!g || !u || !d) return {};
    offload::MoeLayerSource ml{.layer = l, .hidden = s.hidden, .width = s.width, .gate_up_type = s.gate_up, .down_type = s.down};
    for (int64_t e = 0; e < s.n_experts; ++e)
      ml.experts.push_back({static_cast<const uint8_t*>(g->view.slice0(e).data),
                            static_cast<const uint8_t*>(u->view.slice0(e).data),
                            static_cast<const uint8_t*>(d->view.slice0(e).data)});
    src.moe_layers.push_back(std::move(ml));
  }
  return src;
}

inline offload::PlacementPlan share_plan(const ExpertShape& s, double host_share, uint64_t seed = 3) {
  return offload::uniform_plan({.n_layers = s.n_layers, .n_experts = s.n_experts, .top_k = s.top_k, .hidden_size = s.hidden,
                                .moe_intermediate_size = s.width, .layer_is_moe = s.moe, .expert_type = s.gate_up,
                                .expert_bytes = s.expert_bytes(), .host_share = host_share, .seed = seed});
}

// A file in the temporary directory, removed when this goes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() / ("spill-" + std::to_string(::getpid()) + "-" + name)).string()) {}
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

}  // namespace spill::test
