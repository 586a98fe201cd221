#include "offload/expert_layout.h"

#include <algorithm>

#include "core/error.h"

namespace spill::offload {

namespace {

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

}  // namespace

const char* home_name(Home h) {
  switch (h) {
    case Home::Vram: return "vram";
    case Home::HostInPlace: return "host (in place)";
    case Home::HostCopy: return "host (pinned copy)";
    case Home::AnotherGpu: return "another GPU";
  }
  return "?";
}

void check_plan(const PlacementPlan& plan, const ExpertSources& src) {
  const std::string fix = "plan again for this model (`spill plan --model ...`) or give the plan made for it";
  if (plan.n_layers != src.n_layers)
    fail("{}: the plan is for {} layers, the model {} has {}; {}", plan.where, plan.n_layers, src.where, src.n_layers, fix);
  std::vector<const MoeLayerSource*> by_layer(size_t(src.n_layers), nullptr);
  for (const MoeLayerSource& l : src.moe_layers) {
    if (l.layer < 0 || l.layer >= src.n_layers || by_layer[size_t(l.layer)])
      fail("{}: MoE layer {} is listed twice or out of range", src.where, l.layer);
    by_layer[size_t(l.layer)] = &l;
  }
  if (!src.moe_layers.empty() && plan.top_k != src.top_k)
    fail("{}: the plan is for top-{} routing, the model {} routes to {} experts per token; {}", plan.where, plan.top_k,
         src.where, src.top_k, fix);
  for (int64_t l = 0; l < plan.n_layers; ++l) {
    const PlannedLayer& pl = plan.layers[size_t(l)];
    const MoeLayerSource* ml = by_layer[size_t(l)];
    if (pl.moe != (ml != nullptr))
      fail("{}: layers[{}] is {} in the plan but {} in the model {}; {}", plan.where, l, pl.moe ? "MoE" : "dense",
           ml ? "MoE" : "dense", src.where, fix);
    if (!ml) continue;
    if (pl.experts != int64_t(ml->experts.size()))
      fail("{}: layers[{}].experts is {}, the model {} has {} routed experts in that layer; {}", plan.where, l,
           pl.experts, src.where, ml->experts.size(), fix);
    if (pl.expert_bytes != ml->expert_bytes())
      fail("{}: layers[{}].expert_bytes is {}, but one expert of the model {} takes {} (gate and up {} x {} {}, down "
           "{} x {} {}); {}",
           plan.where, l, pl.expert_bytes, src.where, ml->expert_bytes(), ml->width, ml->hidden,
           dtype_name(ml->gate_up_type), ml->hidden, ml->width, dtype_name(ml->down_type), fix);
    for (size_t e = 0; e < ml->experts.size(); ++e) {
      const HostExpert& x = ml->experts[e];
      if (!x.gate || !x.up || !x.down) fail("{}: layer {} expert {} has no weights", src.where, l, e);
    }
  }
}

SpanLayout span_layout(const MoeLayerSource& l) {
  SpanLayout s;
  s.gate = 0;
  s.up = align_up(l.gate_bytes(), kSpanAlignment);
  s.down = s.up + align_up(l.gate_bytes(), kSpanAlignment);
  s.bytes = align_up(s.down + l.down_bytes(), kSpanAlignment);
  return s;
}

StoreLayout layout_experts(const PlacementPlan& plan, const ExpertSources& src, const std::vector<MappedRegion>& regions,
                           const LayoutOptions& opt) {
  if (opt.page == 0 || (opt.page & (opt.page - 1)) != 0) fail("layout_experts: page size {} is not a power of two", opt.page);
  StoreLayout out;
  std::vector<AddressRange> covers;
  for (size_t i = 0; i < src.moe_layers.size(); ++i) {
    const MoeLayerSource& ml = src.moe_layers[i];
    const PlannedLayer& pl = plan.layers[size_t(ml.layer)];
    if (!plan.expert_parallel && pl.gpu != opt.gpu) continue;
    LayerLayout ll{.layer = ml.layer, .source = i, .span = span_layout(ml)};
    ll.experts.resize(ml.experts.size());
    std::vector<uint8_t> on_host(ml.experts.size(), 0);
    for (int32_t e : pl.host) on_host[size_t(e)] = 1;
    int64_t planned_host = 0;
    for (size_t e = 0; e < ml.experts.size(); ++e) {
      ExpertPlace& place = ll.experts[e];
      if (plan.expert_parallel && pl.owners[e] != opt.gpu) {
        place = {.home = Home::AnotherGpu, .offset = 0};
        ++ll.elsewhere;
        continue;
      }
      planned_host += on_host[e];
      if (!on_host[e]) {
        place = {.home = Home::Vram, .offset = ll.vram_bytes};
        ll.vram_bytes += ll.span.bytes;
        ++ll.vram_experts;
        continue;
      }
      const HostExpert& x = ml.experts[e];
      const std::pair<const uint8_t*, int64_t> parts[3] = {
          {x.gate, ml.gate_bytes()}, {x.up, ml.gate_bytes()}, {x.down, ml.down_bytes()}};
      // In place only when all three projections lie in read-only file mappings (the bytes are the
      // file's, in the kernels' format) and start where the kernels may read them.
      bool in_file = opt.in_place, aligned = true;
      int64_t part_region[3] = {-1, -1, -1};
      for (int p = 0; p < 3 && in_file; ++p) {
        part_region[p] = find_region(regions, uintptr_t(parts[p].first), uint64_t(parts[p].second));
        in_file = part_region[p] >= 0 && regions[size_t(part_region[p])].is_readonly_file();
        aligned &= (uintptr_t(parts[p].first) % kKernelAlignment) == 0;
      }
      if (in_file && aligned) {
        place = {.home = Home::HostInPlace, .offset = 0};
        ++ll.host_in_place;
        for (int p = 0; p < 3; ++p) {
          AddressRange c = page_cover(uintptr_t(parts[p].first), uint64_t(parts[p].second), opt.page);
          c.region = part_region[p];
          covers.push_back(c);
        }
        out.in_place_bytes += ml.expert_bytes();
        continue;
      }
      if (!opt.in_place) ++out.copy_reasons.disabled;
      else if (!in_file) ++out.copy_reasons.not_file;
      else ++out.copy_reasons.unaligned;
      place = {.home = Home::HostCopy, .offset = out.host_copy_bytes};
      out.host_copy_bytes += ll.span.bytes;
      ++ll.host_copied;
    }
    out.vram_bytes += ll.vram_bytes;
    out.vram_experts += ll.vram_experts;
    out.host_in_place += ll.host_in_place;
    out.host_copied += ll.host_copied;
    out.planned_host_bytes += planned_host * pl.expert_bytes;
    out.layers.push_back(std::move(ll));
  }
  out.registrations = merge_ranges(std::move(covers));
  for (const AddressRange& r : out.registrations) out.registered_bytes += int64_t(r.bytes());
  return out;
}

}  // namespace spill::offload
