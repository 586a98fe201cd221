// Where every routed expert's bytes live, decided on the host before anything is allocated: the
// plan says VRAM or host RAM per (layer, expert); this module checks the plan against the model's
// experts and lays the bytes out. Pure host code (tested in CI); `expert_store.h` executes it on a
// GPU.
//
//   VRAM expert        -> one device allocation per layer, the layer's VRAM experts back to back
//   host expert, and the model's bytes are a read-only file mapping in the kernels' format (GGUF)
//                      -> read in place: the page-aligned cover of its gate, up and down is
//                         registered with the driver (mapped, read-only); no second copy in RAM
//   host expert, other bytes (quantized on load, synthetic, a writable or anonymous buffer)
//                      -> copied into one pinned host allocation, sized exactly
//
// Each expert copied (to VRAM or pinned RAM) is one span: gate, up, down, each starting on a
// kSpanAlignment boundary (the kernels need 16 bytes; 256 keeps every projection on whole PCIe
// read requests and DRAM bursts for a few hundred bytes per expert).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "offload/host_memory.h"
#include "offload/plan_file.h"

namespace spill::offload {

inline constexpr int64_t kSpanAlignment = 256;
// What the MoE kernels need of an expert read in place (their pointer-table contract).
inline constexpr uintptr_t kKernelAlignment = 16;

// One routed expert as the model holds it (host addresses of its three matrices).
struct HostExpert {
  const uint8_t* gate = nullptr;  // [width, hidden]
  const uint8_t* up = nullptr;    // [width, hidden]
  const uint8_t* down = nullptr;  // [hidden, width]
};

// One MoE layer's routed experts.
struct MoeLayerSource {
  int64_t layer = 0;
  int64_t hidden = 0, width = 0;
  DType gate_up_type = DType::Q4_K, down_type = DType::Q4_K;
  std::vector<HostExpert> experts{};

  int64_t gate_bytes() const { return width * row_bytes(gate_up_type, hidden); }  // = up bytes
  int64_t down_bytes() const { return hidden * row_bytes(down_type, width); }
  int64_t expert_bytes() const { return 2 * gate_bytes() + down_bytes(); }
};

// A model's routed experts, every MoE layer in ascending order.
struct ExpertSources {
  std::string where;  // the model, for messages
  int64_t n_layers = 0, top_k = 0;
  std::vector<MoeLayerSource> moe_layers{};
  // The model's residency hooks (Model::prepare / drop): a range is prepared before it is copied
  // and dropped after, so a model made on demand never holds more than what is in flight. Empty:
  // the bytes are there and stay.
  std::function<void(const void*, size_t)> prepare{}, drop{};
};

// Checks the plan against the model before anything is allocated: layer count, which layers are
// MoE, experts per layer, top-k, and the plan's bytes per expert against what the model's tensors
// take. Throws spill::Error naming the plan, the layer and both figures.
void check_plan(const PlacementPlan& plan, const ExpertSources& sources);

// Offsets of gate, up and down inside one copied expert's span.
struct SpanLayout {
  int64_t gate = 0, up = 0, down = 0, bytes = 0;
};
SpanLayout span_layout(const MoeLayerSource& layer);

// Another GPU: under an expert-parallel plan, an expert the plan gives to a different GPU; this
// GPU's table has no entry for it (its router share never sends a token there).
enum class Home : uint8_t { Vram, HostInPlace, HostCopy, AnotherGpu };
const char* home_name(Home h);
inline bool on_host(Home h) { return h == Home::HostInPlace || h == Home::HostCopy; }

struct ExpertPlace {
  Home home = Home::Vram;
  int64_t offset = 0;  // Vram: into the layer's VRAM block; HostCopy: into the pinned arena
};

struct LayerLayout {
  int64_t layer = 0;
  size_t source = 0;  // index into ExpertSources::moe_layers
  SpanLayout span;
  std::vector<ExpertPlace> experts{};
  int64_t vram_bytes = 0;  // the layer's VRAM block
  int64_t vram_experts = 0, host_in_place = 0, host_copied = 0;
  int64_t elsewhere = 0;   // expert-parallel plans: the layer's experts other GPUs own
};

struct LayoutOptions {
  int gpu = 0;              // the plan's GPU whose layers are laid out
  bool in_place = true;     // false: copy every host expert into pinned memory
  uint64_t page = 4096;     // registration granularity
};

// Why a host expert could not be read in place (for the report; counted per reason).
struct CopyReasons {
  int64_t disabled = 0;    // LayoutOptions::in_place false
  int64_t not_file = 0;    // its bytes are not in a read-only file mapping
  int64_t unaligned = 0;   // a projection does not start on kKernelAlignment
};

struct StoreLayout {
  std::vector<LayerLayout> layers{};           // MoE layers of the GPU, ascending
  std::vector<AddressRange> registrations{};   // page covers of in-place experts, merged
  int64_t vram_bytes = 0;        // all layers' VRAM blocks
  int64_t host_copy_bytes = 0;   // the pinned arena
  int64_t in_place_bytes = 0;    // expert bytes read in place
  int64_t registered_bytes = 0;  // the page covers pinned for them (>= in_place_bytes)
  int64_t planned_host_bytes = 0;  // the plan's host expert bytes for this GPU's layers
  int64_t vram_experts = 0, host_in_place = 0, host_copied = 0;
  CopyReasons copy_reasons{};
  int64_t host_bytes() const { return host_copy_bytes + registered_bytes; }
};

// Lays out the experts of the plan's layers on `options.gpu` (of an expert-parallel plan: every
// MoE layer, with the experts `options.gpu` owns; the others are Home::AnotherGpu). `regions` is the process's mappings
// (read_process_maps()), which decide what can be read in place. The plan must have passed
// check_plan against `sources`.
StoreLayout layout_experts(const PlacementPlan& plan, const ExpertSources& sources,
                           const std::vector<MappedRegion>& regions, const LayoutOptions& options);

}  // namespace spill::offload
