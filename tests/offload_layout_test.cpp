// The expert store's host-side bookkeeping (src/offload/expert_layout.h, host_memory.h): which
// experts can be read in place from a model file, the page covers registered for them, the spans
// of VRAM blocks and of the pinned arena, and the plan check against a loaded model, whose bytes
// per expert must be the placement memory module's.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

#include "core/error.h"
#include "gguf_helpers.h"
#include "model/model.h"
#include "model/quantize_on_load.h"
#include "offload/expert_layout.h"
#include "offload/host_memory.h"
#include "offload/model_experts.h"
#include "offload_test_util.h"
#include "placement/memory.h"
#include "placement/planner.h"
#include "test_models.h"

namespace spill {
namespace {

using offload::AddressRange;
using offload::Home;

// ---- page covers ------------------------------------------------------------------------------

TEST(OffloadPages, CoverIsTheSmallestPageAlignedRange) {
  EXPECT_EQ(offload::page_cover(0, 1, 4096).begin, 0u);
  EXPECT_EQ(offload::page_cover(0, 1, 4096).end, 4096u);
  EXPECT_EQ(offload::page_cover(4096, 4096, 4096).begin, 4096u);
  EXPECT_EQ(offload::page_cover(4096, 4096, 4096).end, 8192u);
  EXPECT_EQ(offload::page_cover(4095, 2, 4096).begin, 0u);
  EXPECT_EQ(offload::page_cover(4095, 2, 4096).end, 8192u);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t page = uint64_t(1) << (rng() % 4 + 10);
    const uintptr_t a = rng() % (1 << 24);
    const uint64_t n = rng() % (1 << 16) + 1;
    const AddressRange c = offload::page_cover(a, n, page);
    EXPECT_EQ(c.begin % page, 0u);
    EXPECT_EQ(c.end % page, 0u);
    EXPECT_LE(c.begin, a);
    EXPECT_GE(c.end, a + n);
    EXPECT_LT(a - c.begin, page);
    EXPECT_LT(c.end - (a + n), page);
  }
}

// Merged covers hold exactly the pages of the ranges, each once, and never join two mappings.
TEST(OffloadPages, MergedCoversHoldEveryPageOnce) {
  std::mt19937_64 rng(9);
  const uint64_t page = 4096;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<AddressRange> covers;
    std::set<std::pair<int64_t, uintptr_t>> want;  // (region, page)
    const int n = int(rng() % 40) + 1;
    for (int i = 0; i < n; ++i) {
      const int64_t region = int64_t(rng() % 2);
      const uintptr_t a = region * (uintptr_t(1) << 30) + rng() % (64 * page);
      AddressRange c = offload::page_cover(a, rng() % (3 * page) + 1, page);
      c.region = region;
      covers.push_back(c);
      for (uintptr_t p = c.begin; p < c.end; p += page) want.insert({region, p});
    }
    const std::vector<AddressRange> merged = offload::merge_ranges(covers);
    std::set<std::pair<int64_t, uintptr_t>> got;
    for (size_t i = 0; i < merged.size(); ++i) {
      for (uintptr_t p = merged[i].begin; p < merged[i].end; p += page)
      {
        EXPECT_TRUE(got.insert({merged[i].region, p}).second) << "page registered twice";
      }
      if (i > 0 && merged[i].region == merged[i - 1].region) {
        EXPECT_GT(merged[i].begin, merged[i - 1].end) << "touching ranges left unmerged";
      }
      if (i > 0) {
        EXPECT_GE(merged[i].begin, merged[i - 1].begin) << "not sorted";
      }
    }
    EXPECT_EQ(got, want);
  }
}

// ---- /proc ----------------------------------------------------------------------------------

TEST(OffloadProc, ParsesMapsAndStatus) {
  const auto regions = offload::parse_process_maps(
      "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1311 /usr/bin/cat\n"
      "7f0000000000-7f0000100000 rw-p 00000000 00:00 0 \n"
      "7f0000100000-7f0000200000 r--s 00001000 00:1f 42 /tmp/a file.gguf\n"
      "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n");
  ASSERT_EQ(regions.size(), 4u);
  EXPECT_EQ(regions[0].begin, 0x55d0c0a00000u);
  EXPECT_TRUE(regions[0].is_readonly_file());
  EXPECT_FALSE(regions[1].is_readonly_file());
  EXPECT_TRUE(regions[2].shared);
  EXPECT_EQ(regions[2].path, "/tmp/a file.gguf");
  EXPECT_FALSE(regions[3].is_readonly_file());
  EXPECT_EQ(offload::find_region(regions, 0x7f0000100000u, 0x100000), 2);
  EXPECT_EQ(offload::find_region(regions, 0x7f00000fffffu, 2), -1);  // spans two regions
  EXPECT_EQ(offload::find_region(regions, 0x10, 1), -1);
  EXPECT_THROW(offload::parse_process_maps("zz-10 r--p 0 0 0\n"), Error);

  const offload::ProcessMemory m =
      offload::parse_process_status("Name:\tx\nVmRSS:\t  12345 kB\nRssAnon:\t 100 kB\nRssFile:\t 7 kB\nVmPin:\t 0 kB\n");
  EXPECT_EQ(m.vm_rss, 12345 * 1024);
  EXPECT_EQ(m.rss_anon, 100 * 1024);
  EXPECT_EQ(m.rss_file, 7 * 1024);
  EXPECT_EQ(m.vm_pin, 0);
  EXPECT_EQ(m.vm_lck, -1);
  const offload::ProcessMemory self = offload::read_process_memory();
  EXPECT_GT(self.vm_rss, 0);
}

TEST(OffloadProc, FindsThisProcesssReadOnlyFileMapping) {
  test::TempFile file("maps.bin");
  {
    std::ofstream out(file.path, std::ios::binary);
    out << std::string(3 * offload::page_size(), 'x');
  }
  const int fd = ::open(file.path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  void* p = ::mmap(nullptr, 3 * offload::page_size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  std::vector<uint8_t> heap(1 << 20);
  const auto regions = offload::read_process_maps();
  const int64_t r = offload::find_region(regions, uintptr_t(p) + 10, 100);
  ASSERT_GE(r, 0);
  EXPECT_TRUE(regions[size_t(r)].is_readonly_file());
  EXPECT_EQ(regions[size_t(r)].path, std::filesystem::canonical(file.path).string());
  const int64_t h = offload::find_region(regions, uintptr_t(heap.data()), heap.size());
  if (h >= 0) {
    EXPECT_FALSE(regions[size_t(h)].is_readonly_file());
  }
  ::munmap(p, 3 * offload::page_size());
}

// ---- layout ---------------------------------------------------------------------------------

// Spans of one kind (VRAM block or pinned arena) never overlap and hold each expert whole.
void expect_disjoint_spans(const offload::StoreLayout& lay, Home home) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const offload::LayerLayout& ll : lay.layers) {
    std::vector<std::pair<int64_t, int64_t>> layer_spans;
    for (const offload::ExpertPlace& p : ll.experts)
      if (p.home == home) (home == Home::Vram ? layer_spans : spans).push_back({p.offset, p.offset + ll.span.bytes});
    std::sort(layer_spans.begin(), layer_spans.end());
    for (size_t i = 1; i < layer_spans.size(); ++i) EXPECT_LE(layer_spans[i - 1].second, layer_spans[i].first);
    if (home == Home::Vram && !layer_spans.empty()) {
      EXPECT_EQ(layer_spans.back().second, ll.vram_bytes);
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  if (home == Home::HostCopy && !spans.empty()) {
    EXPECT_EQ(spans.back().second, lay.host_copy_bytes);
  }
}

TEST(OffloadLayout, AnonymousExpertsAreCopiedIntoExactlySizedSpans) {
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  const offload::PlacementPlan plan = test::share_plan(shape, 0.3);
  const offload::ExpertSources src = ex.sources();
  offload::check_plan(plan, src);
  const offload::StoreLayout lay = offload::layout_experts(plan, src, offload::read_process_maps(), {});
  const int64_t host = plan.host_expert_count();
  ASSERT_EQ(host, 2 * 4);  // 30% of 12, rounded, in each of 2 MoE layers
  EXPECT_EQ(lay.host_copied, host);
  EXPECT_EQ(lay.host_in_place, 0);
  EXPECT_EQ(lay.copy_reasons.not_file, host);
  EXPECT_EQ(lay.vram_experts, 2 * shape.n_experts - host);
  ASSERT_EQ(lay.layers.size(), 2u);
  const offload::SpanLayout span = lay.layers[0].span;
  EXPECT_EQ(span.up - span.gate, (shape.gate_bytes() + 255) / 256 * 256);
  EXPECT_EQ(span.gate % 256 + span.up % 256 + span.down % 256, 0);
  EXPECT_GE(span.bytes, shape.expert_bytes());
  EXPECT_LT(span.bytes, shape.expert_bytes() + 3 * offload::kSpanAlignment);
  EXPECT_EQ(lay.host_copy_bytes, host * span.bytes);
  EXPECT_EQ(lay.vram_bytes, lay.vram_experts * span.bytes);
  EXPECT_EQ(lay.planned_host_bytes, host * shape.expert_bytes());
  // Within a few percent of the plan (here 0.03%: a few hundred bytes of alignment per 0.7 MB expert).
  EXPECT_LT(double(lay.host_bytes()), 1.01 * double(lay.planned_host_bytes));
  expect_disjoint_spans(lay, Home::Vram);
  expect_disjoint_spans(lay, Home::HostCopy);
  for (const offload::LayerLayout& ll : lay.layers) {
    std::set<int32_t> on_host(plan.layers[size_t(ll.layer)].host.begin(), plan.layers[size_t(ll.layer)].host.end());
    for (size_t e = 0; e < ll.experts.size(); ++e)
      EXPECT_EQ(ll.experts[e].home == Home::Vram, !on_host.count(int32_t(e))) << "layer " << ll.layer << " expert " << e;
  }
}

TEST(OffloadLayout, FileExpertsAreReadInPlaceThroughMergedPageCovers) {
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  test::TempFile file("layout.gguf");
  ex.write_gguf(file.path);
  const auto gguf = gguf::GgufFile::open(file.path);
  const offload::ExpertSources src = test::gguf_sources(*gguf, shape);
  const uint64_t page = offload::page_size();
  for (double share : {0.3, 1.0}) {
    const offload::PlacementPlan plan = test::share_plan(shape, share);
    offload::check_plan(plan, src);
    const auto regions = offload::read_process_maps();
    const offload::StoreLayout lay = offload::layout_experts(plan, src, regions, {.page = page});
    EXPECT_EQ(lay.host_in_place, plan.host_expert_count());
    EXPECT_EQ(lay.host_copied, 0);
    EXPECT_EQ(lay.host_copy_bytes, 0);
    EXPECT_EQ(lay.in_place_bytes, plan.host_expert_bytes());
    // Every in-place projection lies inside one registration, inside the file's mapping.
    for (const offload::LayerLayout& ll : lay.layers) {
      const offload::MoeLayerSource& ml = src.moe_layers[ll.source];
      for (size_t e = 0; e < ll.experts.size(); ++e) {
        if (ll.experts[e].home != Home::HostInPlace) continue;
        for (auto [ptr, n] : {std::pair{ml.experts[e].gate, shape.gate_bytes()}, std::pair{ml.experts[e].up, shape.gate_bytes()},
                              std::pair{ml.experts[e].down, shape.down_bytes()}}) {
          int inside = 0;
          for (const AddressRange& r : lay.registrations) inside += uintptr_t(ptr) >= r.begin && uintptr_t(ptr) + n <= r.end;
          EXPECT_EQ(inside, 1);
        }
      }
    }
    for (const AddressRange& r : lay.registrations) {
      EXPECT_EQ(r.begin % page, 0u);
      EXPECT_EQ(r.end % page, 0u);
      ASSERT_GE(r.region, 0);
      EXPECT_TRUE(regions[size_t(r.region)].is_readonly_file());
      EXPECT_EQ(offload::find_region(regions, r.begin, r.bytes()), r.region);
    }
    // The covers pin at most a page on each side of each run of host experts beyond their bytes.
    EXPECT_GE(lay.registered_bytes, lay.in_place_bytes);
    // (plus, inside a run, the alignment gaps between fused tensors: under 32 bytes each, 6 tensors)
    EXPECT_LE(lay.registered_bytes, lay.in_place_bytes + int64_t(2 * page * lay.registrations.size()) + 6 * 32);
    if (share == 1.0) {
      // Whole fused tensors, back to back in the file: one registration per mapping.
      EXPECT_EQ(lay.registrations.size(), 1u);
    }
  }
  // With in-place reads off the same experts are copied.
  const offload::PlacementPlan plan = test::share_plan(shape, 0.3);
  const offload::StoreLayout off = offload::layout_experts(plan, src, offload::read_process_maps(), {.in_place = false});
  EXPECT_EQ(off.host_copied, plan.host_expert_count());
  EXPECT_EQ(off.copy_reasons.disabled, plan.host_expert_count());
  EXPECT_TRUE(off.registrations.empty());
}

TEST(OffloadLayout, ExpertsTheKernelsCannotReadWhereTheyLieAreCopied) {
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  test::TempFile file("unaligned.gguf");
  ex.write_gguf(file.path);
  const auto gguf = gguf::GgufFile::open(file.path);
  offload::ExpertSources src = test::gguf_sources(*gguf, shape);
  // Shift one expert's down matrix by 8 bytes: still file bytes, but not 16-byte aligned.
  const offload::PlacementPlan plan = test::share_plan(shape, 1.0);
  src.moe_layers[0].experts[3].down += 8;
  const offload::StoreLayout lay = offload::layout_experts(plan, src, offload::read_process_maps(), {});
  EXPECT_EQ(lay.copy_reasons.unaligned, 1);
  EXPECT_EQ(lay.layers[0].experts[3].home, Home::HostCopy);
  EXPECT_EQ(lay.host_in_place, plan.host_expert_count() - 1);
}

TEST(OffloadLayout, OnlyTheLayersOfTheAskedGpu) {
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  offload::PlacementPlan plan = test::share_plan(shape, 0.5);
  plan.n_gpus = 2;
  plan.layers[2].gpu = 1;
  const offload::StoreLayout g0 = offload::layout_experts(plan, ex.sources(), {}, {.gpu = 0});
  const offload::StoreLayout g1 = offload::layout_experts(plan, ex.sources(), {}, {.gpu = 1});
  ASSERT_EQ(g0.layers.size(), 1u);
  ASSERT_EQ(g1.layers.size(), 1u);
  EXPECT_EQ(g0.layers[0].layer, 0);
  EXPECT_EQ(g1.layers[0].layer, 2);
  EXPECT_EQ(g0.planned_host_bytes + g1.planned_host_bytes, plan.host_expert_bytes());
}

// An expert-parallel plan (version 2): every GPU lays out every MoE layer, holding the experts it
// owns where the plan says (VRAM or host) and none of the others; the GPUs' layouts together hold
// each expert exactly once.
TEST(OffloadLayout, ExpertParallelPlansLayOutEachGpusOwnExperts) {
  const test::ExpertShape shape;
  const test::ExpertBytes ex(shape);
  offload::PlacementPlan plan = test::share_plan(shape, 0.5);
  plan.n_gpus = 2;
  plan.expert_parallel = true;
  for (offload::PlannedLayer& pl : plan.layers) {
    pl.gpu = -1;
    if (!pl.moe) continue;
    pl.owners.resize(size_t(pl.experts));
    for (int64_t e = 0; e < pl.experts; ++e) pl.owners[size_t(e)] = int32_t((e * 7 + pl.layer) % 3 == 0);
  }
  const offload::ExpertSources src = ex.sources();
  offload::check_plan(plan, src);
  std::vector<offload::StoreLayout> lays;
  for (int g = 0; g < 2; ++g) lays.push_back(offload::layout_experts(plan, src, {}, {.gpu = g}));
  int64_t planned_host = 0;
  for (int g = 0; g < 2; ++g) {
    ASSERT_EQ(lays[size_t(g)].layers.size(), 2u) << "GPU " << g;
    planned_host += lays[size_t(g)].planned_host_bytes;
  }
  EXPECT_EQ(planned_host, plan.host_expert_bytes());
  EXPECT_EQ(lays[0].vram_experts + lays[1].vram_experts + lays[0].host_copied + lays[1].host_copied,
            2 * shape.n_experts);
  for (size_t i = 0; i < 2; ++i) {
    const offload::PlannedLayer& pl = plan.layers[size_t(lays[0].layers[i].layer)];
    std::set<int32_t> on_host(pl.host.begin(), pl.host.end());
    for (size_t e = 0; e < size_t(shape.n_experts); ++e) {
      const int owner = pl.owners[e];
      for (int g = 0; g < 2; ++g) {
        const Home h = lays[size_t(g)].layers[i].experts[e].home;
        if (g != owner) {
          EXPECT_EQ(h, Home::AnotherGpu) << "layer " << pl.layer << " expert " << e << " GPU " << g;
        } else {
          EXPECT_EQ(h, on_host.count(int32_t(e)) ? Home::HostCopy : Home::Vram) << "layer " << pl.layer << " expert " << e;
        }
      }
    }
    EXPECT_EQ(lays[0].layers[i].elsewhere + lays[1].layers[i].elsewhere, shape.n_experts);
  }
  for (int g = 0; g < 2; ++g) {
    expect_disjoint_spans(lays[size_t(g)], Home::Vram);
    expect_disjoint_spans(lays[size_t(g)], Home::HostCopy);
    EXPECT_EQ(lays[size_t(g)].vram_bytes, lays[size_t(g)].vram_experts * lays[size_t(g)].layers[0].span.bytes);
  }
}

// ---- the plan against a loaded model --------------------------------------------------------

// A tiny Qwen3-MoE written as a Q8_0 GGUF (hidden 64, expert width 32: whole Q8_0 blocks).
struct TinyGguf {
  test::TempFile gguf{"tiny-moe.gguf"};
  std::string hf_dir;
  TinyGguf() {
    hf_dir = gguf.path + ".hf";
    testing::write_random_model(hf_dir, {.n_layers = 3, .n_experts = 8, .n_experts_per_token = 2,
                                         .moe_intermediate_size = 32, .dense_layers = {1}, .seed = 5});
    testing::hf_to_gguf(hf_dir, gguf.path, "qwen3moe", {.matrices = DType::Q8_0});
  }
  ~TinyGguf() { std::filesystem::remove_all(hf_dir); }
};

placement::PlanOutcome plan_for(const Model& model, DType experts, double host_share) {
  placement::PlanRequest req;
  req.shape = {.spec = model.spec(), .source = model.where()};
  req.types = placement::parse_tensor_class_types(std::string("q8_0,experts=") + std::string(dtype_name(experts)));
  req.gpu_mem = {int64_t(1) << 30};
  req.max_model_len = 256;
  req.max_seqs = 1;
  req.min_host_fraction = host_share;
  return placement::make_plan(req);
}

TEST(OffloadModel, GgufExpertsAreTheFilesPagesAndMatchThePlacementAccounting) {
  const TinyGguf tiny;
  const auto model = Model::load(tiny.gguf.path);
  const offload::ExpertSources src = offload::expert_sources(*model);
  ASSERT_EQ(src.moe_layers.size(), 2u);  // layer 1 is dense
  EXPECT_EQ(src.moe_layers[0].layer, 0);
  EXPECT_EQ(src.moe_layers[1].layer, 2);
  EXPECT_EQ(src.moe_layers[0].gate_up_type, DType::Q8_0);
  // One expert's bytes as the model's tensors hold them = the placement module's figure.
  const placement::ModelBytes mb =
      placement::account_weights({.spec = model->spec()}, placement::parse_tensor_class_types("q8_0"));
  EXPECT_EQ(src.moe_layers[0].expert_bytes(), mb.routed_expert_bytes);
  EXPECT_EQ(src.moe_layers[0].expert_bytes(), int64_t(model->layers[0].experts[5].gate.nbytes() +
                                                       model->layers[0].experts[5].up.nbytes() +
                                                       model->layers[0].experts[5].down.nbytes()));

  // The planner's plan, through its JSON, checks against the model and is read in place.
  const placement::PlanOutcome out = plan_for(*model, DType::Q8_0, 0.5);
  ASSERT_TRUE(out.fits) << out.refusal;
  const offload::PlacementPlan plan = offload::plan_from_outcome(out);
  offload::check_plan(plan, src);
  const offload::StoreLayout lay = offload::layout_experts(plan, src, offload::read_process_maps(), {});
  EXPECT_EQ(lay.host_in_place, out.plan.host_experts());
  EXPECT_EQ(lay.host_copied, 0);
  EXPECT_EQ(lay.in_place_bytes, out.plan.host_experts() * mb.routed_expert_bytes);
  EXPECT_EQ(lay.planned_host_bytes, lay.in_place_bytes);
}

TEST(OffloadModel, QuantizedOnLoadExpertsAreCopied) {
  const TinyGguf tiny;
  const auto model = Model::load(tiny.hf_dir);  // bf16 safetensors, then quantized in memory
  quantize_as_asked(*model, {.quant = "q8_0", .imatrix = "", .n_threads = 0});
  const offload::ExpertSources src = offload::expert_sources(*model);
  const placement::PlanOutcome out = plan_for(*model, DType::Q8_0, 0.25);
  ASSERT_TRUE(out.fits) << out.refusal;
  const offload::PlacementPlan plan = offload::parse_plan(placement::plan_to_json(out), "plan.json");
  offload::check_plan(plan, src);
  const offload::StoreLayout lay = offload::layout_experts(plan, src, offload::read_process_maps(), {});
  EXPECT_EQ(lay.host_in_place, 0);
  EXPECT_EQ(lay.host_copied, out.plan.host_experts());
  EXPECT_EQ(lay.copy_reasons.not_file, out.plan.host_experts());
}

// serve/generate/run-batch --gpu-mem [--host-experts S] [--host-mem M]: the planner at start-up.
TEST(OffloadModel, StartupPlanFitsTheBudgetOrRefusesWithTheFitReport) {
  const TinyGguf tiny;
  const auto model = Model::load(tiny.gguf.path);
  const offload::ExpertSources src = offload::expert_sources(*model);
  const int64_t eb = src.moe_layers[0].expert_bytes();

  // Room for everything: no expert on host unless a share is asked; the KV pool gets the rest.
  const offload::StartupPlan all = offload::plan_at_startup(*model, {.gpu_mem = "1G"}, 16, 256, 64, 0);
  EXPECT_EQ(all.plan.host_expert_bytes(), 0);
  EXPECT_NE(all.fit_report.find("fits"), std::string::npos) << all.fit_report;
  EXPECT_GT(all.kv_budget_bytes, int64_t(900) << 20);  // 1 GiB less a tiny model's weights and workspace
  EXPECT_LT(all.kv_budget_bytes, int64_t(1) << 30);

  const offload::StartupPlan half = offload::plan_at_startup(*model, {.gpu_mem = "1G", .host_experts = "50%"}, 16, 256, 64, 0);
  EXPECT_EQ(half.plan.host_experts, 8);  // half of 2 MoE layers x 8 experts
  EXPECT_EQ(half.plan.host_expert_bytes(), 8 * eb);
  offload::check_plan(half.plan, src);

  // The in-place host read rate measured at start-up prices the plan in place of the nominal 50 GB/s:
  // the fit report names it, and the same host experts are expected to take longer over a slower link.
  const offload::StartupPlan slow_link = offload::plan_at_startup(
      *model, {.gpu_mem = "1G", .host_experts = "50%", .host_read_gbps = 29.9}, 16, 256, 64, 0);
  EXPECT_EQ(slow_link.plan.host_expert_bytes(), half.plan.host_expert_bytes());
  EXPECT_NE(half.fit_report.find("in-place host read 50.0 GB/s"), std::string::npos) << half.fit_report;
  EXPECT_NE(slow_link.fit_report.find("in-place host read 29.9 GB/s"), std::string::npos) << slow_link.fit_report;
  auto batch_1_row = [](const std::string& report) {
    // The decode table's batch-1 row: "1", host MiB/token, host experts/step, VRAM GiB/step, bound ms,
    // bound tok/s, tok/s total, expected ms, expected tok/s.
    const size_t head = report.find("expected tok/s");
    std::istringstream row(report.substr(report.find('\n', head) + 1));
    std::array<double, 9> v{};
    for (double& x : v) row >> x;
    return v;
  };
  const auto slow = batch_1_row(slow_link.fit_report), nominal = batch_1_row(half.fit_report);
  EXPECT_EQ(slow[0], 1.0);
  EXPECT_LT(slow[5], nominal[5]) << "bound tok/s";
  EXPECT_LT(slow[8], nominal[8]) << "expected tok/s";

  // A budget below the model's non-expert weights: refused before anything loads, with the report.
  try {
    offload::plan_at_startup(*model, {.gpu_mem = "64K"}, 16, 256, 64, 0);
    FAIL() << "a 64 KiB GPU budget was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("does not fit --gpu-mem 64K"), std::string::npos) << what;
    EXPECT_NE(what.find("gpu0"), std::string::npos) << what;
  }
  // Flags that make no sense are errors naming the flag.
  auto error_of = [&](const offload::StartupPlacement& flags) {
    try {
      offload::plan_at_startup(*model, flags, 16, 256, 64, 0);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({.host_experts = "30%"}).find("give --gpu-mem too"), std::string::npos);
  EXPECT_TRUE((offload::StartupPlacement{.host_read_gbps = 30}.requested())) << "a rate alone must not pass unnoticed";
  EXPECT_NE(error_of({.host_read_gbps = 30}).find("give --gpu-mem too"), std::string::npos);
  EXPECT_NE(error_of({.gpu_mem = "lots"}).find("--gpu-mem"), std::string::npos);
  EXPECT_NE(error_of({.gpu_mem = "1e300G"}).find("too large"), std::string::npos);
  EXPECT_NE(error_of({.gpu_mem = "1G", .host_experts = "130%"}).find("--host-experts"), std::string::npos);

  // --expert-cache-mem comes out of --gpu-mem before the plan is made: the KV pool gets that much less.
  const offload::StartupPlan cached =
      offload::plan_at_startup(*model, {.gpu_mem = "1G", .expert_cache_mem = "100M"}, 16, 256, 64, 0);
  EXPECT_EQ(cached.kv_budget_bytes, all.kv_budget_bytes - (int64_t(100) << 20));
  EXPECT_EQ((offload::StartupPlacement{.expert_cache_mem = "100M"}.expert_cache_bytes()), int64_t(100) << 20);
  EXPECT_FALSE((offload::StartupPlacement{.expert_cache_mem = "100M"}.requested())) << "a cache alone plans nothing";
  EXPECT_NE(error_of({.gpu_mem = "1G", .expert_cache_mem = "1G"}).find("all of --gpu-mem"), std::string::npos);
  EXPECT_NE(error_of({.gpu_mem = "1G", .expert_cache_mem = "much"}).find("--expert-cache-mem"), std::string::npos);

  // --kv-format fp8: the plan prices the KV the runner will keep (e4m3 and a scale per KV head), so
  // the fit report says fp8 and the same sequences take fewer bytes.
  const offload::StartupPlan fp8 = offload::plan_at_startup(*model, {.gpu_mem = "1G"}, 16, 256, 64, 0, KvFormat::Fp8E4m3);
  const std::string bf16_kv = "per token (bf16)", fp8_kv = "per token (fp8)";
  EXPECT_NE(all.fit_report.find(bf16_kv), std::string::npos) << all.fit_report;
  EXPECT_NE(fp8.fit_report.find(fp8_kv), std::string::npos) << fp8.fit_report;
  const ModelSpec& spec = model->spec();
  EXPECT_NE(fp8.fit_report.find(placement::format_bytes(kv_bytes_per_token(spec, KvFormat::Fp8E4m3)) + " " + fp8_kv),
            std::string::npos)
      << fp8.fit_report;
  EXPECT_LT(kv_bytes_per_token(spec, KvFormat::Fp8E4m3), kv_bytes_per_token(spec, KvFormat::BF16));
}

// A budget per GPU plans an expert-parallel group at start-up, in the layout the runner runs: every
// GPU a share of each layer's experts, nothing else split; the store lays out each GPU's share, and
// the KV pool gets what the GPU with the least left holds.
TEST(OffloadModel, StartupPlanOverTwoGpusSharesEveryLayersExperts) {
  const TinyGguf tiny;
  const auto model = Model::load(tiny.gguf.path);
  const offload::ExpertSources src = offload::expert_sources(*model);
  const offload::StartupPlan one = offload::plan_at_startup(*model, {.gpu_mem = "1G", .host_experts = "50%"}, 16, 256, 64, 0);
  const offload::StartupPlan two =
      offload::plan_at_startup(*model, {.gpu_mem = "1G,768M", .host_experts = "50%"}, 16, 256, 64, 0);
  EXPECT_FALSE(one.plan.expert_parallel);
  ASSERT_TRUE(two.plan.expert_parallel) << two.fit_report;
  EXPECT_EQ(two.plan.n_gpus, 2);
  EXPECT_FALSE(two.plan.split.any());
  EXPECT_EQ(two.plan.host_experts, 8);
  offload::check_plan(two.plan, src);
  int64_t owned[2] = {0, 0};
  for (const offload::PlannedLayer& pl : two.plan.layers) {
    if (!pl.moe) continue;
    ASSERT_EQ(int64_t(pl.owners.size()), pl.experts);
    for (int32_t o : pl.owners) ++owned[o];
  }
  EXPECT_EQ(owned[0] + owned[1], 16);
  EXPECT_GT(owned[0], 0);
  EXPECT_GT(owned[1], 0);
  for (int g = 0; g < 2; ++g) {
    const offload::StoreLayout lay = offload::layout_experts(two.plan, src, {}, {.gpu = g});
    EXPECT_EQ(lay.vram_experts + lay.host_copied + lay.host_in_place, owned[g]) << "GPU " << g;
  }
  // The second GPU has less room: its pool bounds the group's, below the one-GPU plan's.
  EXPECT_GT(two.kv_budget_bytes, 0);
  EXPECT_LT(two.kv_budget_bytes, one.kv_budget_bytes);
}

TEST(OffloadModel, RefusesAPlanOfAnotherModelNamingTheField) {
  const TinyGguf tiny;
  const auto model = Model::load(tiny.gguf.path);
  const offload::ExpertSources src = offload::expert_sources(*model);
  auto refusal = [&](const offload::PlacementPlan& plan) {
    try {
      offload::check_plan(plan, src);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Planned for bf16 experts: another size per expert. (Q4_K would not do: 64-weight rows are not
  // whole Q4_K blocks, so the planner prices them as Q8_0, as llama.cpp stores them.)
  const offload::PlacementPlan bf16 = offload::parse_plan(placement::plan_to_json(plan_for(*model, DType::BF16, 0.5)), "bf16.json");
  EXPECT_NE(refusal(bf16).find("bf16.json: layers[0].expert_bytes"), std::string::npos) << refusal(bf16);
  offload::PlacementPlan p = offload::parse_plan(placement::plan_to_json(plan_for(*model, DType::Q8_0, 0.5)), "p.json");
  offload::PlacementPlan dense = p;
  dense.layers[2].moe = false;
  EXPECT_NE(refusal(dense).find("layers[2] is dense in the plan but MoE"), std::string::npos) << refusal(dense);
  offload::PlacementPlan fewer = p;
  fewer.n_layers = 2;
  EXPECT_NE(refusal(fewer).find("2 layers"), std::string::npos) << refusal(fewer);
  offload::PlacementPlan topk = p;
  topk.top_k = 4;
  EXPECT_NE(refusal(topk).find("top-4"), std::string::npos) << refusal(topk);
  EXPECT_EQ(refusal(p), "");
}

}  // namespace
}  // namespace spill
