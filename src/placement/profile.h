// Routing profile: how often each (layer, expert) is chosen, separately for prefill and decode
// tokens, and which experts the decode tokens of one step use together. The planner reads it to
// put the least-used experts in host RAM; `spill profile` measures it on a prompts file and
// `spill serve --record-profile` on live traffic.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <span>
#include <string>
#include <vector>

#include "formats/model_spec.h"
#include "model/batch.h"

namespace spill::placement {

struct LayerRouting {
  bool moe = false;
  int64_t prefill_tokens = 0;        // tokens routed in this layer while prefilling
  int64_t decode_tokens = 0;         // ... while decoding
  std::vector<int64_t> prefill;      // [n_experts]: routings (each token counts k times in all)
  std::vector<int64_t> decode;       // [n_experts]
  int64_t decode_steps = 0;          // steps that had decode tokens
  // Steps in which both a and b (a < b) served the step's decode tokens, at a * n_experts + b.
  std::vector<int64_t> coactivation;
};

struct RoutingProfile {
  std::string model;   // for messages: where it was measured
  std::string source;  // what text it was measured on
  int64_t n_layers = 0, n_experts = 0, top_k = 0;
  int64_t steps = 0;
  std::vector<LayerRouting> layers;  // [n_layers]; dense layers have moe = false and no counts

  // An empty profile of the right shape for spec (every count zero).
  static RoutingProfile empty_for(const ModelSpec& spec);
  // The share of tokens of layer l that route to expert e: decode counts when the profile has
  // decode tokens in that layer, else prefill counts; 0 for dense layers.
  double usage(int64_t layer, int64_t expert) const;
  bool has_decode(int64_t layer) const { return layers[size_t(layer)].decode_tokens > 0; }
  // Adds other's counts (same shape; throws spill::Error otherwise).
  void merge(const RoutingProfile& other);
};

// An assumed profile, for planning before any traffic was measured: in every MoE layer the experts
// are ranked by a seeded shuffle and the share of tokens routed to rank r (1-based) is
// min(1, c r^-exponent), c chosen so that each token routes to top_k experts in all (water-filled:
// no expert takes more than every token). exponent 0 is uniform routing. It is the law that a
// synthetic model's --routing-skew zipf:S biases the router toward, but that model's measured
// routing (top-k of noisy logits) is not exactly it: a profile recorded with spill profile is.
RoutingProfile zipf_profile(const ModelSpec& spec, double exponent, uint64_t seed = 1);

// The JSON form (format "spill-routing-profile", version 1; docs/placement.md).
std::string profile_to_json(const RoutingProfile& profile);
RoutingProfile parse_profile_json(const std::string& text, const std::string& where);
RoutingProfile load_profile(const std::string& path);
// Writes path atomically (a temporary file renamed over it), so a reader never sees half a file.
void save_profile(const RoutingProfile& profile, const std::string& path);
// Throws spill::Error unless the profile was measured on a model of spec's layers, experts and top-k.
void check_profile_matches(const RoutingProfile& profile, const ModelSpec& spec, const std::string& where);

// One chunk of a step as the recorder needs it: its tokens, in batch order, and whether it is a
// decode token (one token of a sequence that has produced output) or part of a prefill.
struct StepChunkKind {
  int32_t n_tokens = 0;
  bool decode = false;
};

// Counts routing choices of forward passes. The runner calls on_router (through the
// ForwardObserver interface) during a forward; the caller then calls end_step with the step's
// chunks, which attributes the step's tokens to prefill or decode. Thread-safe: snapshot() may be
// called from another thread while forwards run.
class RoutingRecorder final : public ForwardObserver {
 public:
  explicit RoutingRecorder(const ModelSpec& spec, std::string model = "", std::string source = "");
  void on_router(int layer, int64_t n_tokens, int64_t k, const int32_t* expert_ids, const float* weights) override;
  // chunks cover the step's tokens in batch order. A forward that failed never reaches end_step;
  // its choices are dropped when the next forward starts.
  void end_step(std::span<const StepChunkKind> chunks);
  RoutingProfile snapshot() const;
  int64_t steps() const;

 private:
  struct PendingLayer {
    int64_t n_tokens = 0, k = 0;
    std::vector<int32_t> ids;
    bool seen = false;
  };
  mutable std::mutex mutex_;
  RoutingProfile profile_;
  std::vector<PendingLayer> pending_;  // this step's choices, per layer
  std::vector<uint8_t> touched_;       // scratch: experts the step's decode tokens used
  std::vector<int32_t> used_;          // scratch: their ids
};

// Keeps a recorder's profile on disk for `spill serve --record-profile`: rewrites the file (atomically)
// every interval_s seconds when steps were recorded since the last write, and once more when
// destroyed. Write errors are printed to stderr and retried at the next interval: a full disk must
// not take the server down.
class ProfileFileWriter {
 public:
  ProfileFileWriter(const RoutingRecorder& recorder, std::string path, double interval_s);
  ~ProfileFileWriter();
  ProfileFileWriter(const ProfileFileWriter&) = delete;
  ProfileFileWriter& operator=(const ProfileFileWriter&) = delete;
  void write_now();  // writes if anything was recorded since the last write

 private:
  const RoutingRecorder& recorder_;
  std::string path_;
  double interval_s_;
  std::mutex write_mutex_;  // write_now may be called from any thread
  int64_t written_steps_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace spill::placement
