// Placement plans (`spill serve --plan FILE`, src/offload/plan_file.h): a file a user may edit.
// Parsed plans are also checked against a fixed model of spill-tiny's shape (6 layers, 16 experts
// top-2, hidden 256, width 128, bf16) and laid out for each of their GPUs, so a plan that passes
// the checks cannot drive the layout out of bounds.
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "offload/expert_layout.h"
#include "offload/plan_file.h"

namespace {

const spill::offload::ExpertSources& tiny_sources() {
  static const std::vector<uint8_t> bytes(3 * 128 * 256 * 2, 0);
  static const spill::offload::ExpertSources sources = [] {
    spill::offload::ExpertSources s{.where = "fuzz model", .n_layers = 6, .top_k = 2};
    for (int64_t l = 0; l < 6; ++l) {
      spill::offload::MoeLayerSource ml{.layer = l, .hidden = 256, .width = 128, .gate_up_type = spill::DType::BF16,
                                        .down_type = spill::DType::BF16};
      for (int e = 0; e < 16; ++e) ml.experts.push_back({bytes.data(), bytes.data() + 65536, bytes.data() + 131072});
      s.moe_layers.push_back(std::move(ml));
    }
    return s;
  }();
  return sources;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const spill::offload::PlacementPlan plan = spill::offload::parse_plan(spill::fuzz::as_text(data, size), "plan.json");
    spill::offload::check_plan(plan, tiny_sources());
    for (int g = 0; g < plan.n_gpus; ++g) spill::offload::layout_experts(plan, tiny_sources(), {}, {.gpu = g});
  } catch (const spill::Error&) {
  }
  return 0;
}
