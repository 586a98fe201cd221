// The CUDA runner (cuda_runner.h): weights and KV in VRAM, one stream, the decoder forward of
// src/model/decoder.cpp kernel by kernel. Residual adds are fused into the next RMSNorm; q, k and v
// (and a dense MLP's gate and up) are one matrix when their types agree, so one GEMV serves them.
#include "backend/cuda/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/sampling.h"
#include "model/model.h"
#include "offload/cpu_experts.h"
#include "offload/expert_cache.h"
#include "offload/expert_staging.h"
#include "offload/model_experts.h"
#include "sampling/sampling_math.h"

namespace spill {

namespace {

using cuda::check;

constexpr size_t kAlign = 256;
size_t align_up(size_t v, size_t a = kAlign) { return (v + a - 1) / a * a; }

bool is_float_type(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// Device memory that frees itself.
struct DeviceAlloc {
  void* ptr = nullptr;
  DeviceAlloc() = default;
  DeviceAlloc(const DeviceAlloc&) = delete;
  DeviceAlloc& operator=(const DeviceAlloc&) = delete;
  ~DeviceAlloc() {
    if (ptr) cudaFree(ptr);
  }
  void allocate(size_t bytes, const std::string& what) {
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, std::max<size_t>(bytes, 16));
    if (err != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      cuda::throw_error(fmt::format("CUDA runner: cannot allocate {:.1f} MiB for {} ({:.1f} MiB free of {:.1f} MiB): "
                                    "{}; use a smaller KV pool, fewer batch tokens, or a smaller quantization",
                                    bytes / 1048576.0, what, free_b / 1048576.0, total_b / 1048576.0,
                                    cudaGetErrorString(err)));
    }
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr); }
};

// Pinned host memory that frees itself.
struct PinnedAlloc {
  void* ptr = nullptr;
  size_t bytes = 0;
  PinnedAlloc() = default;
  PinnedAlloc(const PinnedAlloc&) = delete;
  PinnedAlloc& operator=(const PinnedAlloc&) = delete;
  ~PinnedAlloc() {
    if (ptr) cudaFreeHost(ptr);
  }
  void reserve(size_t n) {
    if (n <= bytes) return;
    if (ptr) cudaFreeHost(ptr);
    ptr = nullptr;
    bytes = 0;
    check(cudaMallocHost(&ptr, n), "CUDA runner: allocating pinned host memory for the step's metadata");
    bytes = n;
  }
};

// A weight matrix on the device, and how to multiply by it.
struct DeviceMatrix {
  const void* data = nullptr;
  DType type = DType::F32;
  int64_t rows = 0, cols = 0;
  cuda::GemvPlan plan;  // block formats
  void* workspace = nullptr;
  bool empty() const { return data == nullptr; }
};

struct DeviceLayer {
  const float* attn_norm = nullptr;
  const float* mlp_norm = nullptr;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  // Either qkv (q, k, v rows stacked; bias qkv_bias) or q, k, v apart.
  DeviceMatrix qkv, q, k, v, o;
  const float* qkv_bias = nullptr;  // [q_dim + 2 kv_dim], or null
  const float* o_bias = nullptr;
  bool moe = false;
  // A SwiGLU MLP: the dense MLP of a dense layer, the shared experts of a MoE layer (all of them
  // one MLP of width n_shared x moe_intermediate, as the CPU forward runs them); gate_up (gate rows
  // then up rows) or gate and up apart.
  DeviceMatrix gate_up, gate, up, down;
  int64_t mlp_width = 0;  // 0: none
  // Routed experts.
  DeviceMatrix router;
  const float* router_bias = nullptr;
  DType expert_gate_up_type = DType::F32, expert_down_type = DType::F32;
  const cuda::ExpertWeights* expert_table = nullptr;  // device [n_experts]: the runner's, or the store's
  cuda::MoePlan moe_plan;                        // block-format experts
  int64_t moe_index = -1;                        // among the MoE layers
  // An expert-parallel shard's experts: device [n_experts], 1 where this GPU holds the expert (the
  // router writes the others' ids as -1 for the MoE kernels); null: every expert is this GPU's.
  const uint8_t* owned = nullptr;
};

class CudaRunner final : public ModelRunner {
 public:
  CudaRunner(const Model& model, const CudaRunnerConfig& config);
  ~CudaRunner() override {
    for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cache_.reset();  // its copies finish before the store's pages go
    for (cudaEvent_t e : {counts_fork_, counts_join_})
      if (e) cudaEventDestroy(e);
    if (counts_stream_) cudaStreamDestroy(counts_stream_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  CudaRunnerStats stats() const {
    CudaRunnerStats s;
    s.weight_bytes = weight_bytes_;
    s.kv_bytes = kv_bytes_;
    s.workspace_bytes = workspace_bytes_;
    s.launches_last_step = launches_;
    s.op_ms_last_step = op_ms_;
    if (store_) {
      s.vram_expert_bytes = store_->report().vram_bytes;
      s.host_expert_bytes = store_->report().host_bytes();
      s.expert_store_summary = store_->report().summary();
    }
    if (cpu_experts_) {
      const offload::CpuExperts::Counters c = cpu_experts_->counters();
      s.cpu_expert_calls = int64_t(c.calls);
      s.cpu_expert_bytes = int64_t(c.bytes);
      s.cpu_expert_busy_seconds = c.busy_seconds;
    }
    return s;
  }
  void validate(const ForwardBatch& batch) const { check_batch(batch); }
  const ModelSpec& spec() const override { return spec_; }
  const KvCacheConfig& kv_config() const override { return config_.kv; }
  const RunnerLimits& limits() const override { return limits_; }
  std::string describe() const override;
  ExpertTraffic expert_traffic() const override;
  void forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) override;
  // Samples on the device (cuda::SamplingPlan, the samplers as its exact reference): only the
  // sampled ids and logprobs come back to the host.
  void forward_sample(const ForwardBatch& batch, std::span<SequenceSampler* const> samplers, StepResult& out,
                      ForwardObserver* observer) override;

  // Points layer `layer`'s expert table at the given matrices (device-visible addresses: VRAM or
  // mapped pinned host memory), one entry per expert. The one place expert addresses enter the
  // kernels: offloading swaps entries here between steps.
  void build_expert_tables(int64_t layer, std::span<const cuda::ExpertWeights> experts);
  // Builds the expert store from config_.expert_plan and points each MoE layer at its table.
  void place_experts(const Model& model);
  // An expert-parallel shard (config.shard.sums set): GPU shard.rank of shard.world.
  bool sharded() const { return config_.shard.sums != nullptr; }
  void prepare_staging();  // staging_ when it fits, else staging_note_ says why not
  int64_t first_moe_max_tokens() const {
    for (const DeviceLayer& d : layers_)
      if (d.moe) return d.moe_plan.max_tokens;
    return 0;
  }

 private:
  // The routed-expert counters the MoE kernels add to, and (config.expert_cache_bytes) the cache.
  void prepare_expert_counts();
  void start_cpu_experts();  // cpu_experts_ from config.cpu_expert_share
  struct Uploader;
  void upload_weights(const Model& model);
  void allocate_workspace();
  void check_batch(const ForwardBatch& batch) const;
  // One step's shape; its metadata is at meta_'s offsets in meta_dev_.
  struct Step {
    int64_t n = 0, rows = 0;
    int32_t max_positions = 1;
    int32_t grid_parts = 0;  // attention partitions in the grid (0: what max_positions needs)
    bool staged = false;     // host experts staged in VRAM for this step (staging_)
    // The step's tokens as runs of prompt chunks (at least kAttnPromptChunk tokens each) and of the
    // rest (decodes, short chunks), in token order: attention takes each run in its own calls, so the
    // prompt build (blocks of 8 or 16 consecutive tokens of one sequence) never holds a decode token.
    struct AttnRun {
      int64_t first = 0, count = 0;
      bool prompt = false;
    };
    std::vector<AttnRun> attn_runs;
  };
  static constexpr int32_t kAttnPromptChunk = 16;
  // Enqueues the step from the embedding to the logits in logits_dev_ (copied into *logits pass by
  // pass when given: more rows than one pass holds).
  void enqueue_step(const Step& step, ForwardObserver* observer, std::vector<float>* logits = nullptr);
  // Runs a step on the stream, its logit rows left in logits_dev_, copied into *logits when given;
  // returns the number of logit rows. No host synchronisation when logits is null.
  int64_t run_step(const ForwardBatch& batch, ForwardObserver* observer, std::vector<float>* logits);
  // x_rounded, where given: x's rows already rounded to int8 (h_rounded_, written by the RMSNorm that
  // wrote x), for the calls that take the tensor-core path; the others read x.
  void linear(const DeviceMatrix& w, const float* x, int64_t n, float* y, const float* bias,
              const cuda::RoundedRows* x_rounded = nullptr);
  void experts(const DeviceLayer& layer, const cuda::ExpertWeights* table, const float* x, int64_t n, float* out,
               const cuda::RoundedRows* x_rounded = nullptr);
  // The layer's SwiGLU MLP (dense, or the shared experts): out = down(silu(gate x) * up x).
  void swiglu_mlp(const DeviceLayer& layer, const float* x, int64_t n, float* out,
                  const cuda::RoundedRows* x_rounded = nullptr);
  // Whether a call of n tokens of w, of a MoE layer's experts, of a SwiGLU MLP reads rounded rows.
  bool reads_rounded(const DeviceMatrix& w, int64_t n) const;
  bool experts_read_rounded(const DeviceLayer& layer, int64_t n) const;
  bool mlp_reads_rounded(const DeviceLayer& layer, int64_t n) const;
  void observe(ForwardObserver* observer, const char* name, int layer, const float* data, int64_t rows, int64_t cols);
  // With config.profile_ops: an event after each op; the time since the previous mark is the op's.
  void mark(const char* op);
  void collect_profile();
  // After a step has finished (the stream idle): the step's expert counts into traffic_.
  void after_step(int64_t n_tokens, double seconds);
  // Right after a step is enqueued: the expert cache's turn with the last finished step's touches,
  // while the GPU runs this one.
  void update_expert_cache();

  const Model& model_;
  ModelSpec spec_;
  CudaRunnerConfig config_;
  cudaStream_t stream_ = nullptr;
  int64_t max_model_len_ = 0;
  RunnerLimits limits_;

  // Weights.
  DeviceAlloc weights_;
  int64_t weight_bytes_ = 0, kv_bytes_ = 0, workspace_bytes_ = 0;
  int64_t launches_ = 0;  // in the current (or last) step
  std::vector<DeviceLayer> layers_;
  DeviceMatrix embed_, lm_head_;
  bool embed_on_device_ = false;
  const float* final_norm_ = nullptr;
  const float* inv_freq_ = nullptr;
  float attention_factor_ = 1.0f;
  std::map<std::tuple<int, int64_t, int64_t>, void*> gemv_workspaces_;  // by (type, rows, cols)
  DeviceAlloc gemv_workspace_mem_;
  int64_t gemv_total_bytes_ = 0;
  bool moe_blocks_ = false;
  int64_t moe_workspace_bytes_ = 0;

  // KV pool: a plane per layer of K, then per layer of V, each [n_blocks][block_size][n_kv_heads]
  // [head_dim] values; an FP8 plane's values are followed by its scales [slots][n_kv_heads] (f32).
  DeviceAlloc kv_;
  int64_t kv_layer_elems_ = 0, kv_plane_bytes_ = 0;

  // Activations and scratch, sized for config_.max_batch_tokens.
  DeviceAlloc act_mem_;
  float *x_ = nullptr, *h_ = nullptr, *qkv_ = nullptr, *attn_ = nullptr, *proj_ = nullptr, *mlp_out_ = nullptr;
  float *router_logits_ = nullptr, *route_weights_ = nullptr, *gate_up_ = nullptr, *mlp_act_ = nullptr;
  float *final_rows_ = nullptr, *logits_dev_ = nullptr, *attn_workspace_ = nullptr, *scratch_ = nullptr;
  float* shared_out_ = nullptr;  // [N, H]: a MoE layer's shared experts, added with its routed ones
  int32_t* route_ids_ = nullptr;
  int32_t* share_ids_ = nullptr;  // [N, K] an expert-parallel shard's ids: route_ids_, others' experts -1
  DeviceAlloc owned_mem_;         // the shard's DeviceLayer::owned masks, [moe layers][n_experts]
  void* moe_workspace_ = nullptr;
  // h_'s rows rounded to int8 by the RMSNorm that writes h_, when the next GEMMs run on tensor cores
  // (prompts): one rounding for q, k and v, or for the router's experts and the shared experts.
  void* h_rounded_ = nullptr;
  int64_t logit_rows_per_pass_ = 0;
  std::unique_ptr<cuda::SamplingPlan> sampling_;  // for logit_rows_per_pass_ rows
  std::unique_ptr<offload::ExpertStore> store_;   // the routed experts, when placed by a plan
  // Host experts the CPU computes (config.cpu_expert_share); destroyed before store_, whose bytes it reads.
  std::unique_ptr<offload::CpuExperts> cpu_experts_;
  std::vector<uint8_t> cpu_expert_flags_;  // [moe layers * n_experts]: 1 where the CPU computes the expert
  std::string cpu_experts_note_;           // the share and the rates it came from, for describe()
  std::unique_ptr<offload::ExpertCache> cache_;   // VRAM slots for hot host experts (config.expert_cache_bytes)
  std::unique_ptr<offload::ExpertStaging> staging_;  // host experts copied per layer for big steps
  std::string staging_note_;                         // why staging is off, for describe()
  bool last_step_staged_ = false;
  // Routed-expert counters (block-format experts): [moe layers][n_experts] routings, then as many
  // touches, added to by the MoE kernels and never reset on the device; copied to the host on a
  // branch of each step that runs beside the final norm and LM head, so the copy adds no time.
  DeviceAlloc counts_dev_;
  PinnedAlloc counts_host_;
  std::vector<uint32_t> counts_seen_, counts_delta_;  // the last finished step's differences
  bool counts_fresh_ = false;  // counts_delta_ not yet given to the expert cache
  cudaStream_t counts_stream_ = nullptr;
  cudaEvent_t counts_fork_ = nullptr, counts_join_ = nullptr;
  std::vector<int64_t> moe_layer_;      // [moe layers]: the model layer
  std::vector<int64_t> expert_bytes_;   // [moe layers]: one expert's gate + up + down bytes
  std::vector<int32_t> host_experts_;   // moe layer * n_experts + expert of each expert the plan puts in host RAM
  ExpertTraffic traffic_;
  int64_t attn_tokens_per_call_ = 0;

  // Step metadata, host (pinned) and device, at fixed offsets sized by the config's limits.
  struct MetaLayout {
    size_t tokens = 0, positions = 0, table_offsets = 0, slots = 0, rows = 0, tables = 0, embed = 0, bytes = 0;
    int64_t table_capacity = 0;
  } meta_;
  PinnedAlloc meta_host_;
  DeviceAlloc meta_dev_;
  // Captured decode steps by (batch size, attention partitions).
  struct GraphExec {
    cudaGraphExec_t exec = nullptr;
    int64_t launches = 0;
  };
  std::map<std::pair<int64_t, int32_t>, GraphExec> graphs_;
  // Op profile (config.profile_ops): events of this step, in order, and the last step's times.
  std::vector<cudaEvent_t> events_;
  std::vector<const char*> event_ops_;
  std::vector<std::pair<std::string, double>> op_ms_;
};

// Two passes over the weights with the same code: the first counts bytes, the second (after one
// allocation) places and copies them.
struct CudaRunner::Uploader {
  uint8_t* base = nullptr;  // null in the counting pass
  size_t used = 0;
  // Copies go through two pinned staging buffers, so the host copy of one overlaps the transfer
  // of the other (pageable memory would cross PCIe at a fraction of the speed).
  static constexpr size_t kStage = size_t(32) << 20;
  cudaStream_t stream = nullptr;
  PinnedAlloc stage[2];
  cudaEvent_t done[2] = {nullptr, nullptr};
  int turn = 0;
  const Model* model = nullptr;  // prepares what is read and drops what was uploaded (Model::prepare)
  ~Uploader() {
    for (cudaEvent_t e : done)
      if (e) cudaEventDestroy(e);
  }
  void start(uint8_t* device_base, cudaStream_t s, const Model& m) {
    base = device_base;
    stream = s;
    model = &m;
    for (int i = 0; i < 2; ++i) {
      stage[i].reserve(kStage);
      check(cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming), "CUDA runner: creating an event");
    }
  }
  void finish() {
    if (base) check(cudaStreamSynchronize(stream), "CUDA runner: uploading weights");
  }
  uint8_t* take(size_t bytes) {
    uint8_t* p = base ? base + used : nullptr;
    used += align_up(bytes);
    return p;
  }
  // Copies bytes of the model (or of a host buffer) to the device; `drop` gives the model's pages
  // back once they are staged (the weights of a model made on demand are written as they go up).
  void copy(void* dst, const void* src, size_t bytes, bool drop = false) {
    if (!base) return;
    model->prepare(src, bytes);
    for (size_t at = 0; at < bytes; at += kStage) {
      const size_t len = std::min(kStage, bytes - at);
      check(cudaEventSynchronize(done[turn]), "CUDA runner: uploading weights");
      std::memcpy(stage[turn].ptr, static_cast<const uint8_t*>(src) + at, len);
      check(cudaMemcpyAsync(static_cast<uint8_t*>(dst) + at, stage[turn].ptr, len, cudaMemcpyHostToDevice, stream),
            "CUDA runner: uploading weights");
      check(cudaEventRecord(done[turn], stream), "CUDA runner: uploading weights");
      turn ^= 1;
    }
    if (drop) model->drop(src, bytes);
  }
  // A vector (norm weight, bias) as f32, exactly as cpu::load_row reads it.
  const float* vec(const TensorView& t, int64_t expected, const char* what, int64_t layer) {
    if (t.empty()) return nullptr;
    if (t.numel() != expected)
      cuda::throw_error(fmt::format("CUDA runner: layer {} {} has {} values, expected {}", layer, what, t.numel(), expected));
    uint8_t* p = take(size_t(expected) * 4);
    if (base) {
      std::vector<float> v(static_cast<size_t>(expected));
      TensorView row = t;
      row.ndim = 2;
      row.shape = {1, expected, 0, 0};
      model->prepare(t.data, t.nbytes());
      cpu::load_row(row, 0, v.data());
      copy(p, v.data(), v.size() * 4);
    }
    return reinterpret_cast<const float*>(p);
  }
  // Matrices stacked by rows (same type and columns): one device matrix. The model's copies are
  // dropped once uploaded unless `keep_host` (a matrix the host also reads).
  DeviceMatrix matrix(std::initializer_list<const TensorView*> parts, const std::string& what, bool keep_host = false) {
    DeviceMatrix m;
    const TensorView& first = **parts.begin();
    m.type = first.dtype;
    m.cols = first.cols();
    size_t bytes = 0;
    for (const TensorView* t : parts) {
      if (t->dtype != m.type || t->cols() != m.cols)
        cuda::throw_error("CUDA runner: " + what + ": stacked parts differ in type or width");
      m.rows += t->rows();
      bytes += t->nbytes();
    }
    uint8_t* p = take(bytes);
    size_t at = 0;
    for (const TensorView* t : parts) {
      copy(p + at, t->data, t->nbytes(), !keep_host);
      at += t->nbytes();
    }
    m.data = p ? p : reinterpret_cast<const void*>(uintptr_t(1));  // non-null marks "present" when counting
    return m;
  }
};

CudaRunner::CudaRunner(const Model& model, const CudaRunnerConfig& config)
    : model_(model), spec_(model.spec()), config_(config) {
  const KvCacheConfig& kv = config.kv;
  if (kv.block_size <= 0) fail("KV block size must be positive, got {}", kv.block_size);
  if (kv.n_blocks < 0) fail("the KV cache needs at least one block, got {}", kv.n_blocks);
  if (config.max_batch_tokens <= 0 || config.max_seqs <= 0)
    fail("CUDA runner: max_batch_tokens ({}) and max_seqs ({}) must be positive", config.max_batch_tokens,
         config.max_seqs);
  if (config.kv_format == KvFormat::Fp8E4m3 && !cuda::kv_fp8_supported(spec_.n_heads, spec_.n_kv_heads, spec_.head_dim))
    fail("CUDA runner: an FP8 KV cache needs head_dim 64 or 128 and a GQA group of at most 16 query heads (or a multiple "
         "of 16); {} has {} query heads over {} KV heads of {}: use --kv-format bf16",
         spec_.model_type, spec_.n_heads, spec_.n_kv_heads, spec_.head_dim);
  if (spec_.head_dim > cuda::kMaxHeadDim || spec_.head_dim % 2 != 0)
    fail("CUDA runner: head_dim {} is not supported (even, at most {})", spec_.head_dim, cuda::kMaxHeadDim);
  if (spec_.n_kv_heads <= 0 || spec_.n_heads % spec_.n_kv_heads != 0)
    fail("CUDA runner: {} query heads do not group over {} KV heads", spec_.n_heads, spec_.n_kv_heads);
  // The longest sequence: as configured, else what the pool holds (when its size is given), capped
  // by the model's positions.
  max_model_len_ = config.max_model_len > 0 ? config.max_model_len
                   : kv.n_blocks > 0        ? kv.n_blocks * int64_t(kv.block_size)
                                            : spec_.max_position_embeddings;
  if (spec_.max_position_embeddings > 0 && config.max_model_len <= 0)
    max_model_len_ = std::min<int64_t>(max_model_len_, spec_.max_position_embeddings);
  if (max_model_len_ <= 0 || max_model_len_ > INT32_MAX)
    fail("CUDA runner: the longest sequence ({} positions) must be positive and fit 32 bits; set max_model_len",
         max_model_len_);

  // What the decoder family's kernels here do not compute yet (the CPU runner does): refused by name
  // rather than run wrong.
  const auto unsupported = [&](bool has, const char* what) {
    if (has) fail("CUDA runner: {} ({}) is not supported on the GPU yet; use --device cpu", what, spec_.model_type);
  };
  unsupported(spec_.attention != AttentionKind::Gqa, "multi-head latent attention");
  unsupported(spec_.attention_sinks, "attention sinks");
  unsupported(spec_.sliding_window > 0, "sliding-window attention");
  unsupported(spec_.attention_out_bias, "an output-projection bias");
  unsupported(spec_.router.kind != RouterKind::SoftmaxTopK, "this router (sigmoid / top-k-then-softmax)");
  unsupported(spec_.expert_activation != MlpActivation::SwiGLU, "the clamped SwiGLU");
  unsupported(spec_.expert_bias, "expert biases");
  unsupported(spec_.rope_interleaved || spec_.rope_dims() != spec_.head_dim, "interleaved or partial rotary");
  unsupported(spec_.attention_scale != 0.0, "a configured softmax scale");

  int n_devices = 0;
  check(cudaGetDeviceCount(&n_devices), "CUDA runner: counting devices");
  if (config.device < 0 || config.device >= n_devices)
    fail("CUDA runner: device {} does not exist ({} CUDA devices)", config.device, n_devices);
  check(cudaSetDevice(config.device), "CUDA runner: selecting the device");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "CUDA runner: creating a stream");

  if (sharded()) {
    const ExpertShard& sh = config.shard;
    if (sh.world < 1 || sh.rank < 0 || sh.rank >= sh.world)
      fail("CUDA runner: expert-parallel rank {} of {} GPUs (internal error)", sh.rank, sh.world);
    if (!config.expert_plan || !config.expert_plan->expert_parallel)
      fail("CUDA runner: GPU {} of an expert-parallel group needs an expert-parallel plan (version 2; spill plan "
           "--parallel experts)",
           sh.rank);
    const offload::PlacementPlan& plan = *config.expert_plan;
    if (plan.n_gpus != sh.world)
      fail("CUDA runner: {} spreads the experts over {} GPUs; the group has {}", plan.where, plan.n_gpus, sh.world);
    if (plan.split.any())
      fail("CUDA runner: {} splits {}{}{}{}over the GPUs; spill's expert-parallel runner keeps a copy of everything "
           "but the routed experts on each GPU (plan again with --attention replicated)",
           plan.where, plan.split.attention ? "attention " : "", plan.split.shared ? "shared experts " : "",
           plan.split.dense ? "dense MLPs " : "", plan.split.vocab ? "the embedding and head " : "");
  }
  upload_weights(model);
  prepare_expert_counts();
  if (config.cpu_expert_share != 0) start_cpu_experts();
  allocate_workspace();
  // The device sampler's scratch (12 bytes per logit per row), before the KV pool takes the rest.
  // Its integer masses cover vocabularies up to kMaxSampledVocab; a larger one samples on the host.
  if (uint64_t(spec_.vocab_size) <= kMaxSampledVocab) {
    sampling_ = std::make_unique<cuda::SamplingPlan>(int32_t(logit_rows_per_pass_), spec_.vocab_size);
    workspace_bytes_ += 12 * logit_rows_per_pass_ * spec_.vocab_size;
  }

  if (store_ && config.stage_host_experts && moe_blocks_) prepare_staging();

  // The KV pool: as many blocks as asked, or what the budget (or, with none, the free memory less a
  // reserve) holds.
  const int64_t block_bytes = cuda_kv_bytes_per_block(spec_, kv.block_size, config.kv_format);
  if (kv.n_blocks == 0) {
    int64_t budget = config_.kv_budget_bytes;
    if (budget <= 0) {
      size_t free_b = 0, total_b = 0;
      check(cudaMemGetInfo(&free_b, &total_b), "CUDA runner: reading free device memory");
      budget = int64_t(free_b) - std::max<int64_t>(int64_t(1) << 30, int64_t(total_b / 20));
    }
    config_.kv.n_blocks = std::max<int64_t>(0, budget / block_bytes);
    if (config_.kv.n_blocks == 0)
      fail("CUDA runner: no room for a single KV block ({:.1f} MiB) in a budget of {:.1f} MiB; free memory or "
           "lower the batch limits",
           block_bytes / 1048576.0, budget / 1048576.0);
  }
  const int64_t capacity = config_.kv.n_blocks * int64_t(kv.block_size);
  if (capacity > int64_t(INT32_MAX) * 16) fail("CUDA runner: a KV pool of {} slots is too large", capacity);
  kv_layer_elems_ = capacity * spec_.kv_dim();
  // Planes start on 256-byte boundaries (the kernels' 16-byte words of K and V need it; an FP8 plane
  // of an odd slot count would not keep it).
  kv_plane_bytes_ = (capacity * (kv_bytes_per_token_per_layer(spec_, config.kv_format) / 2) + 255) / 256 * 256;
  kv_bytes_ = 2 * spec_.n_layers * kv_plane_bytes_;
  kv_.allocate(size_t(kv_bytes_), "the KV cache");
  config_.kv.format = config.kv_format;
  config_.kv.bytes_per_block = block_bytes;
  limits_ = {.max_seqs = config.max_seqs, .max_batch_tokens = config.max_batch_tokens, .max_model_len = max_model_len_};
  check(cudaStreamSynchronize(stream_), "CUDA runner: preparing the workspace");
}

void CudaRunner::upload_weights(const Model& model) {
  const int64_t H = spec_.hidden_size, Q = spec_.q_dim(), KV = spec_.kv_dim(), L = spec_.n_layers;
  std::vector<std::vector<cuda::ExpertWeights>> all_experts(static_cast<size_t>(L));

  auto pass = [&](Uploader& up) {
    layers_.assign(size_t(L), DeviceLayer{});
    embed_on_device_ = cuda::embed_rows_supported(model.embed.dtype);
    const bool tied = model.lm_head.data == model.embed.data;
    // Embedding rows the GPU cannot decode are looked up on the host at every step.
    if (!embed_on_device_ && up.base) model.prepare(model.embed.data, model.embed.nbytes());
    if (embed_on_device_ || tied) embed_ = up.matrix({&model.embed}, "embedding", /*keep_host=*/!embed_on_device_);
    lm_head_ = tied ? embed_ : up.matrix({&model.lm_head}, "LM head");
    final_norm_ = up.vec(model.final_norm, H, "final norm", -1);
    {
      const cpu::RopeTable rope = cpu::make_rope_table(spec_.rope, spec_.head_dim);
      TensorView t;
      t.data = rope.inv_freq.data();
      t.dtype = DType::F32;
      t.ndim = 1;
      t.shape = {int64_t(rope.inv_freq.size()), 0, 0, 0};
      inv_freq_ = up.vec(t, int64_t(rope.inv_freq.size()), "rope frequencies", -1);
      attention_factor_ = rope.attention_factor;
    }
    for (int64_t l = 0; l < L; ++l) {
      const LayerWeights& w = model.layers[size_t(l)];
      DeviceLayer& d = layers_[size_t(l)];
      const std::string at = fmt::format("layer {}", l);
      d.attn_norm = up.vec(w.attn_norm, H, "attention norm", l);
      d.mlp_norm = up.vec(w.mlp_norm, H, "MLP norm", l);
      if (spec_.qk_norm == QkNorm::PerHead) {
        d.q_norm = up.vec(w.q_norm, spec_.head_dim, "q norm", l);
        d.k_norm = up.vec(w.k_norm, spec_.head_dim, "k norm", l);
      } else if (spec_.qk_norm == QkNorm::WholeProjection) {
        d.q_norm = up.vec(w.q_norm, Q, "q norm", l);
        d.k_norm = up.vec(w.k_norm, KV, "k norm", l);
      }
      const bool stack_qkv = w.q.dtype == w.k.dtype && w.k.dtype == w.v.dtype;
      if (stack_qkv) {
        d.qkv = up.matrix({&w.q, &w.k, &w.v}, at + " q/k/v");
        if (!w.q_bias.empty() || !w.k_bias.empty() || !w.v_bias.empty()) {
          // One f32 bias over the stacked rows (zeros where a part has none).
          uint8_t* p = up.take(size_t(Q + 2 * KV) * 4);
          if (up.base) {
            std::vector<float> b(size_t(Q + 2 * KV), 0.0f);
            auto fill = [&](const TensorView& t, int64_t off, int64_t count) {
              if (t.empty()) return;
              TensorView row = t;
              row.ndim = 2;
              row.shape = {1, count, 0, 0};
              cpu::load_row(row, 0, b.data() + off);
            };
            fill(w.q_bias, 0, Q);
            fill(w.k_bias, Q, KV);
            fill(w.v_bias, Q + KV, KV);
            up.copy(p, b.data(), b.size() * 4);
          }
          d.qkv_bias = reinterpret_cast<const float*>(p);
        }
      } else {
        if (!w.q_bias.empty() || !w.k_bias.empty() || !w.v_bias.empty())
          fail("CUDA runner: layer {}: attention biases need q, k and v of one type ({}, {}, {}); quantize them alike", l,
               dtype_name(w.q.dtype), dtype_name(w.k.dtype), dtype_name(w.v.dtype));
        d.q = up.matrix({&w.q}, at + " q");
        d.k = up.matrix({&w.k}, at + " k");
        d.v = up.matrix({&w.v}, at + " v");
      }
      d.o = up.matrix({&w.o}, at + " o");
      d.o_bias = up.vec(w.o_bias, H, "o bias", l);
      d.moe = spec_.layer_is_moe[size_t(l)];
      auto swiglu = [&](const ExpertWeights& mlp, const std::string& what) {
        if (mlp.gate.dtype == mlp.up.dtype) {
          d.gate_up = up.matrix({&mlp.gate, &mlp.up}, at + " " + what + " gate/up");
        } else {
          d.gate = up.matrix({&mlp.gate}, at + " " + what + " gate");
          d.up = up.matrix({&mlp.up}, at + " " + what + " up");
        }
        d.down = up.matrix({&mlp.down}, at + " " + what + " down");
        d.mlp_width = mlp.gate.rows();
      };
      if (!d.moe) {
        swiglu(w.dense, "MLP");
        continue;
      }
      if (spec_.n_shared_experts > 0) swiglu(w.shared, "shared experts");
      d.router = up.matrix({&w.router}, at + " router");
      d.router_bias = up.vec(w.router_bias, spec_.n_experts, "router bias", l);
      if (int64_t(w.experts.size()) != spec_.n_experts)
        fail("CUDA runner: layer {} has {} experts, the spec says {}", l, w.experts.size(), spec_.n_experts);
      d.expert_gate_up_type = w.experts[0].gate.dtype;
      d.expert_down_type = w.experts[0].down.dtype;
      std::vector<cuda::ExpertWeights>& where = all_experts[size_t(l)];
      where.clear();
      if (config_.expert_plan) continue;  // the expert store places them (below)
      for (const ExpertWeights& e : w.experts) {
        if (e.gate.dtype != d.expert_gate_up_type || e.up.dtype != d.expert_gate_up_type ||
            e.down.dtype != d.expert_down_type)
          fail("CUDA runner: layer {}'s experts mix weight types ({} gate, {} up, {} down; the first expert has {} "
               "and {}); quantize all experts of a layer alike",
               l, dtype_name(e.gate.dtype), dtype_name(e.up.dtype), dtype_name(e.down.dtype),
               dtype_name(d.expert_gate_up_type), dtype_name(d.expert_down_type));
        // One span per expert: gate, up, down, each 16-byte aligned (moe.h's expert_span_layout).
        const size_t g = align_up(e.gate.nbytes(), 16), u = align_up(e.up.nbytes(), 16);
        uint8_t* span = up.take(g + u + e.down.nbytes());
        up.copy(span, e.gate.data, e.gate.nbytes(), /*drop=*/true);
        up.copy(span + g, e.up.data, e.up.nbytes(), /*drop=*/true);
        up.copy(span + g + u, e.down.data, e.down.nbytes(), /*drop=*/true);
        if (up.base) where.push_back({span, span + g, span + g + u});
      }
      d.expert_table = reinterpret_cast<cuda::ExpertWeights*>(up.take(size_t(spec_.n_experts) * sizeof(cuda::ExpertWeights)));
    }
  };

  Uploader counter;
  pass(counter);
  weights_.allocate(counter.used, "the weights");
  weight_bytes_ = int64_t(counter.used);
  Uploader placer;
  placer.start(weights_.as<uint8_t>(), stream_, model);
  pass(placer);
  placer.finish();
  if (config_.expert_plan) {
    place_experts(model);
  } else {
    for (int64_t l = 0; l < L; ++l)
      if (layers_[size_t(l)].moe) build_expert_tables(l, all_experts[size_t(l)]);
  }

  // Plans and workspaces of the block-format matrices, one workspace per distinct shape.
  std::vector<DeviceMatrix*> matrices{&lm_head_};
  if (embed_on_device_) matrices.push_back(&embed_);
  for (DeviceLayer& d : layers_)
    for (DeviceMatrix* m : {&d.qkv, &d.q, &d.k, &d.v, &d.o, &d.gate_up, &d.gate, &d.up, &d.down, &d.router})
      if (!m->empty()) matrices.push_back(m);
  const int64_t gemv_max_tokens = config_.max_batch_tokens;
  std::map<std::tuple<int, int64_t, int64_t>, int64_t> ws_offsets;
  int64_t ws_total = 0;
  for (DeviceMatrix* m : matrices) {
    if (is_float_type(m->type)) {
      if (!cuda::matmul_float_supported(m->type)) fail("CUDA runner: no matmul for {}", dtype_name(m->type));
      continue;
    }
    try {
      m->plan = cuda::plan_gemv(m->type, m->rows, m->cols,
                                std::min<int64_t>(gemv_max_tokens, cuda::gemv_tokens_per_call(m->type)));
    } catch (const Error& e) {
      fail("CUDA runner: a {} x {} {} weight: {}; requantize it (--quant) to a type the GPU decodes", m->rows, m->cols,
           dtype_name(m->type), e.what());
    }
    const auto key = std::make_tuple(int(m->type), m->rows, m->cols);
    if (m->plan.workspace_bytes > 0 && !ws_offsets.count(key)) {
      ws_offsets[key] = ws_total;
      ws_total += int64_t(align_up(size_t(m->plan.workspace_bytes)));
    }
  }
  if (ws_total > 0) gemv_workspace_mem_.allocate(size_t(ws_total), "the GEMV workspaces");
  gemv_total_bytes_ = ws_total;
  for (DeviceMatrix* m : matrices) {
    if (is_float_type(m->type) || m->plan.workspace_bytes == 0) continue;
    const auto key = std::make_tuple(int(m->type), m->rows, m->cols);
    const bool first = !gemv_workspaces_.count(key);
    m->workspace = gemv_workspace_mem_.as<uint8_t>() + ws_offsets[key];
    if (first) {
      gemv_workspaces_[key] = m->workspace;
      cuda::init_gemv_workspace(m->plan, m->workspace, stream_);
    }
  }

  // The routed experts: one kernel family for a model's MoE layers.
  bool any_moe = false;
  for (DeviceLayer& d : layers_) {
    if (!d.moe) continue;
    const bool blocks = !is_float_type(d.expert_gate_up_type);
    if (any_moe && blocks != moe_blocks_)
      fail("CUDA runner: MoE layers mix float and block-format experts; quantize all experts alike");
    if (!blocks && d.expert_gate_up_type != d.expert_down_type)
      fail("CUDA runner: float experts need one type for gate/up and down ({} and {})", dtype_name(d.expert_gate_up_type),
           dtype_name(d.expert_down_type));
    if (blocks && is_float_type(d.expert_down_type))
      fail("CUDA runner: experts with block-format gate/up need a block-format down ({})", dtype_name(d.expert_down_type));
    if (blocks) {
      const cuda::MoeShape shape{.hidden = H, .width = spec_.moe_intermediate_size, .n_experts = int32_t(spec_.n_experts),
                                 .top_k = int32_t(spec_.n_experts_per_token), .gate_up_type = d.expert_gate_up_type,
                                 .down_type = d.expert_down_type};
      // Layers may differ in expert types (a mix gives some layers' down a wider type); the
      // workspace layout depends on the shape and token count only, so one workspace serves all.
      const int64_t max_tokens = std::min<int64_t>(config_.max_batch_tokens, std::max<int64_t>(1, 8192 / shape.top_k));
      try {
        d.moe_plan = cuda::plan_moe(shape, std::min<int64_t>(max_tokens, cuda::moe_tokens_per_call(shape)));
      } catch (const Error& e) {
        fail("CUDA runner: the routed experts: {}; requantize them (--quant experts=...)", e.what());
      }
      moe_workspace_bytes_ = std::max(moe_workspace_bytes_, d.moe_plan.workspace_bytes);
    }
    moe_blocks_ = blocks;
    any_moe = true;
  }
}

void CudaRunner::prepare_staging() {
  const int64_t need = offload::ExpertStaging::bytes_needed(*store_);
  if (need == 0) return;
  int64_t room = config_.kv_budget_bytes;
  if (room <= 0 || config_.kv.n_blocks > 0) {
    size_t free_b = 0, total_b = 0;
    check(cudaMemGetInfo(&free_b, &total_b), "CUDA runner: reading free device memory");
    room = int64_t(free_b) - std::max<int64_t>(int64_t(1) << 30, int64_t(total_b / 20));
  }
  if (need > room / 4) {
    staging_note_ = fmt::format("host experts read in place in every step (staging them for prefill needs {:.2f} GiB, "
                                "more than a quarter of the {:.2f} GiB left for the KV pool)",
                                need / 1073741824.0, std::max<int64_t>(room, 0) / 1073741824.0);
    return;
  }
  staging_ = offload::ExpertStaging::build(*store_);
  if (config_.kv_budget_bytes > 0) config_.kv_budget_bytes -= need;
  workspace_bytes_ += need;
}

void CudaRunner::place_experts(const Model& model) {
  const offload::PlacementPlan& plan = *config_.expert_plan;
  if (plan.expert_parallel && !sharded())
    fail("CUDA runner: {} spreads every layer's experts over {} GPUs (expert parallelism); one runner holds a whole "
         "model on one GPU (make_expert_parallel_runner runs the group; or plan for one GPU: spill plan --gpu-mem SIZE)",
         plan.where, plan.n_gpus);
  for (const offload::PlannedLayer& pl : plan.layers)
    if (!plan.expert_parallel && pl.gpu != 0)
      fail("CUDA runner: {} puts layer {} on GPU {}; one runner holds a whole model on one GPU (plan for one GPU)",
           plan.where, pl.layer, pl.gpu);
  for (int64_t l = 0; l < spec_.n_layers; ++l)
    if (layers_[size_t(l)].moe && is_float_type(layers_[size_t(l)].expert_gate_up_type))
      fail("CUDA runner: an expert plan places block-format experts; layer {}'s are {} (quantize them, e.g. "
           "--quant q4_k_m)",
           l, dtype_name(layers_[size_t(l)].expert_gate_up_type));
  const int rank = sharded() ? config_.shard.rank : 0;
  store_ = offload::build_expert_store(model, plan, {.plan_gpu = rank, .cuda_device = config_.device,
                                                     .in_place = config_.experts_in_place});
  // A shard's masks: which experts of each MoE layer are this GPU's (the router's share).
  std::vector<uint8_t> owned;
  for (int64_t l = 0; l < spec_.n_layers && sharded(); ++l)
    if (layers_[size_t(l)].moe)
      for (int32_t o : plan.layers[size_t(l)].owners) owned.push_back(o == rank);
  if (!owned.empty()) {
    owned_mem_.allocate(owned.size(), "the expert-parallel masks");
    check(cudaMemcpy(owned_mem_.ptr, owned.data(), owned.size(), cudaMemcpyHostToDevice),
          "CUDA runner: uploading the expert-parallel masks");
  }
  int64_t moe_index = 0;
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    DeviceLayer& d = layers_[size_t(l)];
    if (!d.moe) continue;
    d.expert_table = store_->device_table(l);
    if (!d.expert_table) fail("CUDA runner: {} gives MoE layer {} no experts table (internal error)", plan.where, l);
    if (owned_mem_.ptr) d.owned = owned_mem_.as<uint8_t>() + moe_index++ * spec_.n_experts;
  }
  weight_bytes_ += store_->report().vram_bytes + store_->report().table_bytes + int64_t(owned.size());
}

void CudaRunner::build_expert_tables(int64_t layer, std::span<const cuda::ExpertWeights> experts) {
  if (layer < 0 || layer >= spec_.n_layers || !layers_[size_t(layer)].moe)
    fail("CUDA runner: layer {} has no routed experts", layer);
  if (int64_t(experts.size()) != spec_.n_experts)
    fail("CUDA runner: an expert table of {} entries for {} experts", experts.size(), spec_.n_experts);
  for (const cuda::ExpertWeights& e : experts)
    if (((reinterpret_cast<uintptr_t>(e.gate) | reinterpret_cast<uintptr_t>(e.up) | reinterpret_cast<uintptr_t>(e.down)) & 15) != 0)
      fail("CUDA runner: expert matrices must be 16-byte aligned");
  // Ordered on the stream: steps enqueued before see the old table, steps after the new one.
  check(cudaMemcpyAsync(const_cast<cuda::ExpertWeights*>(layers_[size_t(layer)].expert_table), experts.data(), experts.size() * sizeof(cuda::ExpertWeights),
                        cudaMemcpyHostToDevice, stream_),
        "CUDA runner: writing an expert table");
  check(cudaStreamSynchronize(stream_), "CUDA runner: writing an expert table");
}

void CudaRunner::allocate_workspace() {
  const int64_t N = config_.max_batch_tokens, H = spec_.hidden_size, Q = spec_.q_dim(), KV = spec_.kv_dim();
  const int64_t E = std::max<int64_t>(spec_.n_experts, 1), K = std::max<int64_t>(spec_.n_experts_per_token, 1);
  // The widest SwiGLU MLP: a dense layer's, or a MoE layer's shared experts.
  const int64_t I = std::max<int64_t>({spec_.intermediate_size, spec_.shared_intermediate_size(), 1});
  logit_rows_per_pass_ = std::min<int64_t>(N, std::max<int64_t>(config_.max_seqs, 1));
  // Split-attention partials per token: the graph buckets round the partitions up to a power of two.
  int64_t parts_cap = 1;
  while (parts_cap < cuda::attention_grid_parts(int32_t(std::min<int64_t>(max_model_len_, INT32_MAX)))) parts_cap *= 2;
  const int64_t per_token_attn = parts_cap > 1 ? spec_.n_heads * parts_cap * (spec_.head_dim + 2) : 0;
  const int64_t attn_budget_floats = int64_t(64) << 20;  // 256 MiB of split-attention partials at most
  attn_tokens_per_call_ = per_token_attn == 0 ? N : std::clamp<int64_t>(attn_budget_floats / per_token_attn, 1, N);
  int64_t moe_ws = 0;
  if (moe_blocks_) moe_ws = moe_workspace_bytes_;
  else if (spec_.n_experts > 0) moe_ws = cuda::moe_float_workspace_bytes(N, int32_t(K), H, spec_.moe_intermediate_size);

  struct Piece {
    void** out;
    int64_t bytes;
  };
  std::vector<Piece> pieces = {
      {reinterpret_cast<void**>(&x_), N * H * 4},
      {reinterpret_cast<void**>(&h_), N * H * 4},
      {reinterpret_cast<void**>(&qkv_), N * (Q + 2 * KV) * 4},
      {reinterpret_cast<void**>(&attn_), N * Q * 4},
      {reinterpret_cast<void**>(&proj_), N * H * 4},
      {reinterpret_cast<void**>(&mlp_out_), N * H * 4},
      {reinterpret_cast<void**>(&router_logits_), N * E * 4},
      {reinterpret_cast<void**>(&route_weights_), N * K * 4},
      {reinterpret_cast<void**>(&route_ids_), N * K * 4},
      {reinterpret_cast<void**>(&share_ids_), sharded() ? N * K * 4 : 4},
      {reinterpret_cast<void**>(&gate_up_), N * 2 * I * 4},
      {reinterpret_cast<void**>(&mlp_act_), N * I * 4},
      {reinterpret_cast<void**>(&final_rows_), logit_rows_per_pass_ * H * 4},
      {reinterpret_cast<void**>(&logits_dev_), logit_rows_per_pass_ * spec_.vocab_size * 4},
      {reinterpret_cast<void**>(&attn_workspace_), std::max<int64_t>(per_token_attn * attn_tokens_per_call_, 1) * 4},
      {reinterpret_cast<void**>(&scratch_), N * H * 4},
      {reinterpret_cast<void**>(&shared_out_), spec_.n_shared_experts > 0 ? N * H * 4 : 4},
      {&moe_workspace_, std::max<int64_t>(moe_ws, 16)},
      {&h_rounded_, H % 32 == 0 ? cuda::rounded_rows_bytes(N, H) : 16},
  };
  int64_t total = 0;
  for (const Piece& p : pieces) total += int64_t(align_up(size_t(p.bytes)));
  act_mem_.allocate(size_t(total), "the activations");
  workspace_bytes_ = total + int64_t(gemv_workspace_mem_.ptr ? gemv_total_bytes_ : 0);
  int64_t at = 0;
  for (const Piece& p : pieces) {
    *p.out = act_mem_.as<uint8_t>() + at;
    at += int64_t(align_up(size_t(p.bytes)));
  }
  // Metadata: every per-token array for max_batch_tokens, block tables for max_seqs sequences of
  // max_model_len positions, and (host-gathered embeddings) the rows.
  const int64_t blocks_per_seq = (max_model_len_ + config_.kv.block_size - 1) / config_.kv.block_size;
  meta_.table_capacity = int64_t(config_.max_seqs) * blocks_per_seq;
  meta_.tokens = 0;
  meta_.positions = align_up(size_t(N) * 4);
  meta_.table_offsets = meta_.positions + align_up(size_t(N) * 4);
  meta_.slots = meta_.table_offsets + align_up(size_t(N) * 4);
  meta_.rows = meta_.slots + align_up(size_t(N) * 8);
  meta_.tables = meta_.rows + align_up(size_t(N) * 4);
  meta_.embed = meta_.tables + align_up(size_t(meta_.table_capacity) * 4);
  meta_.bytes = meta_.embed + (embed_on_device_ ? 0 : size_t(N * H) * 4);
  meta_host_.reserve(meta_.bytes);
  meta_dev_.allocate(meta_.bytes, "the step's metadata");
  workspace_bytes_ += int64_t(meta_.bytes);

  if (moe_blocks_)
    for (const DeviceLayer& d : layers_)
      if (d.moe) cuda::init_moe_workspace(d.moe_plan, moe_workspace_, stream_);
}

void CudaRunner::check_batch(const ForwardBatch& batch) const {
  const KvCacheConfig& kv = config_.kv;
  int64_t expected_first = 0;
  for (const SeqChunk& c : batch.seqs) {
    if (c.first_token != expected_first || c.n_tokens <= 0 || c.start_pos < 0)
      fail("forward: chunks must cover the batch's tokens in order, each with at least one token");
    expected_first += c.n_tokens;
    if (int64_t(c.start_pos) + c.n_tokens > max_model_len_)
      fail("forward: a chunk reaches position {}, beyond the CUDA runner's limit of {}", c.start_pos + c.n_tokens,
           max_model_len_);
    const int64_t needed_blocks = (int64_t(c.start_pos) + c.n_tokens + kv.block_size - 1) / kv.block_size;
    if (int64_t(c.block_table.size()) < needed_blocks)
      fail("forward: a block table of {} blocks cannot hold {} positions", c.block_table.size(), c.start_pos + c.n_tokens);
    for (int64_t b = 0; b < needed_blocks; ++b)
      if (c.block_table[size_t(b)] < 0 || c.block_table[size_t(b)] >= kv.n_blocks)
        fail("forward: block id {} is outside the KV pool of {} blocks", c.block_table[size_t(b)], kv.n_blocks);
  }
  if (expected_first != batch.n_tokens()) fail("forward: chunks cover {} tokens of {}", expected_first, batch.n_tokens());
  if (batch.n_tokens() > config_.max_batch_tokens)
    fail("forward: {} tokens in one step; the CUDA runner was built for at most {}", batch.n_tokens(),
         config_.max_batch_tokens);
  if (int64_t(batch.seqs.size()) > config_.max_seqs)
    fail("forward: {} chunks in one step; the CUDA runner was built for at most {}", batch.seqs.size(), config_.max_seqs);
  for (int32_t t : batch.tokens)
    if (t < 0 || t >= spec_.vocab_size) fail("forward: token id {} is outside the vocabulary (size {})", t, spec_.vocab_size);
}

bool CudaRunner::reads_rounded(const DeviceMatrix& w, int64_t n) const {
  return !w.empty() && !is_float_type(w.type) && cuda::gemv_reads_rounded(w.plan, std::min(n, w.plan.max_n));
}

bool CudaRunner::experts_read_rounded(const DeviceLayer& d, int64_t n) const {
  return d.moe && moe_blocks_ && cuda::moe_reads_rounded_x(d.moe_plan, std::min(n, d.moe_plan.max_tokens));
}

bool CudaRunner::mlp_reads_rounded(const DeviceLayer& d, int64_t n) const {
  return d.mlp_width > 0 && (reads_rounded(d.gate_up, n) || reads_rounded(d.gate, n) || reads_rounded(d.up, n));
}

void CudaRunner::linear(const DeviceMatrix& w, const float* x, int64_t n, float* y, const float* bias,
                        const cuda::RoundedRows* x_rounded) {
  if (is_float_type(w.type)) {
    cuda::matmul_float(w.data, w.type, w.rows, w.cols, x, n, bias, y, stream_);
    ++launches_;
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += w.plan.max_n) {
    const int64_t nt = std::min<int64_t>(w.plan.max_n, n - t0);
    cuda::GemvArgs a;
    a.weights = w.data;
    a.x = x + t0 * w.cols;
    a.n = nt;
    a.y = y + t0 * w.rows;
    a.workspace = w.workspace;
    if (x_rounded) a.rounded = cuda::rounded_rows_from(*x_rounded, t0);
    cuda::gemv(w.plan, a, stream_);
    launches_ += cuda::gemv_launches(w.plan, nt, x_rounded != nullptr);
  }
  if (bias) {
    cuda::add_bias(y, bias, n, w.rows, stream_);
    ++launches_;
  }
}

void CudaRunner::experts(const DeviceLayer& d, const cuda::ExpertWeights* table, const float* x, int64_t n, float* out,
                         const cuda::RoundedRows* x_rounded) {
  const int64_t H = spec_.hidden_size, K = spec_.n_experts_per_token;
  if (moe_blocks_) {
    for (int64_t t0 = 0; t0 < n; t0 += d.moe_plan.max_tokens) {
      const int64_t nt = std::min<int64_t>(d.moe_plan.max_tokens, n - t0);
      cuda::MoeArgs a;
      a.table = table;
      a.x = x + t0 * H;
      a.n = nt;
      a.ids = (d.owned ? share_ids_ : route_ids_) + t0 * K;
      a.weights = route_weights_ + t0 * K;
      a.out = out + t0 * H;
      a.workspace = moe_workspace_;
      if (x_rounded) a.x_rounded = cuda::rounded_rows_from(*x_rounded, t0);
      // The CPU's experts in decode calls (their table entries stay valid for prefill, which reads
      // them over PCIe, and for staged steps, which read the VRAM copies).
      const bool cpu = cpu_experts_ && table == d.expert_table && nt <= cuda::kMoeCpuMaxTokens;
      if (cpu) a.cpu = cpu_experts_->args(d.moe_index);
      if (counts_dev_.ptr) {
        const int64_t E = spec_.n_experts, M = int64_t(moe_layer_.size());
        uint32_t* counts = counts_dev_.as<uint32_t>() + d.moe_index * E;
        a.routings = counts;
        a.touches = counts + M * E;
      }
      cuda::moe_experts(d.moe_plan, a, stream_);
      launches_ += cuda::moe_launches(d.moe_plan, nt, x_rounded != nullptr, a.cpu.mask != nullptr);
    }
    return;
  }
  cuda::MoeFloatArgs a;
  a.table = d.expert_table;
  a.type = d.expert_gate_up_type;
  a.hidden = H;
  a.width = spec_.moe_intermediate_size;
  a.n_experts = int32_t(spec_.n_experts);
  a.top_k = int32_t(K);
  a.x = x;
  a.n = n;
  a.ids = route_ids_;
  a.weights = route_weights_;
  a.out = out;
  a.workspace = moe_workspace_;
  cuda::moe_experts_float(a, stream_);
  launches_ += 3;
}

void CudaRunner::swiglu_mlp(const DeviceLayer& d, const float* x, int64_t n, float* out,
                            const cuda::RoundedRows* x_rounded) {
  const int64_t I = d.mlp_width;
  if (!d.gate_up.empty()) {
    linear(d.gate_up, x, n, gate_up_, nullptr, x_rounded);
    cuda::silu_mul(gate_up_, nullptr, n, I, mlp_act_, stream_);
  } else {
    linear(d.gate, x, n, gate_up_, nullptr, x_rounded);
    linear(d.up, x, n, gate_up_ + n * I, nullptr, x_rounded);
    cuda::silu_mul(gate_up_, gate_up_ + n * I, n, I, mlp_act_, stream_);
  }
  ++launches_;
  linear(d.down, mlp_act_, n, out, nullptr);
}

void CudaRunner::observe(ForwardObserver* observer, const char* name, int layer, const float* data, int64_t rows,
                         int64_t cols) {
  std::vector<float> host(size_t(rows * cols));
  check(cudaMemcpyAsync(host.data(), data, host.size() * 4, cudaMemcpyDeviceToHost, stream_), "CUDA runner: observing");
  check(cudaStreamSynchronize(stream_), "CUDA runner: observing");
  observer->on_tensor(name, layer, host.data(), rows, cols);
}

void CudaRunner::forward(const ForwardBatch& batch, std::vector<float>& logits, ForwardObserver* observer) {
  const auto t0 = std::chrono::steady_clock::now();
  run_step(batch, observer, &logits);
  update_expert_cache();
  check(cudaStreamSynchronize(stream_), "CUDA runner: the forward step");
  if (config_.profile_ops) collect_profile();
  after_step(batch.n_tokens(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

void CudaRunner::forward_sample(const ForwardBatch& batch, std::span<SequenceSampler* const> samplers, StepResult& out,
                                ForwardObserver* observer) {
  if (batch.all_logits) fail("forward_sample: a batch that wants every token's logits is for forward() (internal error)");
  if (sharded() && config_.shard.rank > 0)
    fail("forward_sample: GPU {} of an expert-parallel group computes no logits; rank 0 samples (internal error)",
         config_.shard.rank);
  if (int64_t(samplers.size()) != batch.n_logit_rows())
    fail("forward_sample: {} samplers for {} logit rows (internal error)", samplers.size(), batch.n_logit_rows());
  if (!sampling_) {
    ModelRunner::forward_sample(batch, samplers, out, observer);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t rows = run_step(batch, observer, nullptr);
  if (rows > logit_rows_per_pass_)
    fail("forward_sample: {} logit rows exceed one pass of the LM head ({}) (internal error)", rows, logit_rows_per_pass_);
  out.rows.resize(size_t(rows));
  auto finished = [&] {
    after_step(batch.n_tokens(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  if (rows == 0) {
    update_expert_cache();
    check(cudaStreamSynchronize(stream_), "CUDA runner: the forward step");
    finished();
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (!samplers[size_t(r)]) fail("forward_sample: logit row {} has no sampler (internal error)", r);
    sampling_->set_row(int32_t(r), *samplers[size_t(r)]);
  }
  sampling_->launch(logits_dev_, int32_t(rows), stream_);
  update_expert_cache();
  const std::span<const cuda::GpuSampledToken> picked = sampling_->finish(stream_);
  if (config_.profile_ops) collect_profile();
  finished();
  for (int64_t r = 0; r < rows; ++r) {
    SampledRow& row = out.rows[size_t(r)];
    SequenceSampler& sampler = *samplers[size_t(r)];
    row.error.clear();
    try {
      row.sampled = cuda::to_sampled_token(picked[size_t(r)], sampler.params());
      sampler.accept(row.sampled.token);
    } catch (const Error& e) {
      // No finite logit in this row: this request only.
      row.sampled = SampledToken{};
      row.error = e.what();
    }
  }
}

int64_t CudaRunner::run_step(const ForwardBatch& batch, ForwardObserver* observer, std::vector<float>* logits_out) {
  check_batch(batch);
  check(cudaSetDevice(config_.device), "CUDA runner: selecting the device");
  const int64_t n = batch.n_tokens(), H = spec_.hidden_size, V = spec_.vocab_size;
  const int32_t bs = config_.kv.block_size;

  // ---- the step's metadata, laid out at fixed offsets (graphs read them there), one transfer ----
  Step st;
  st.n = n;
  int64_t table_len = 0;
  bool decode_only = !batch.all_logits && observer == nullptr;
  uint8_t* mh = static_cast<uint8_t*>(meta_host_.ptr);
  auto* tokens_h = reinterpret_cast<int32_t*>(mh + meta_.tokens);
  auto* pos_h = reinterpret_cast<int32_t*>(mh + meta_.positions);
  auto* table_off_h = reinterpret_cast<int32_t*>(mh + meta_.table_offsets);
  auto* slots_h = reinterpret_cast<int64_t*>(mh + meta_.slots);
  auto* rows_h = reinterpret_cast<int32_t*>(mh + meta_.rows);
  auto* tables_h = reinterpret_cast<int32_t*>(mh + meta_.tables);
  std::copy(batch.tokens.begin(), batch.tokens.end(), tokens_h);
  for (const SeqChunk& c : batch.seqs) {
    const int32_t blocks = (c.start_pos + c.n_tokens + bs - 1) / bs;
    if (table_len + blocks > meta_.table_capacity) [[unlikely]]
      fail("forward: the step's block tables ({} entries) exceed the CUDA runner's capacity ({})", table_len + blocks,
           meta_.table_capacity);
    std::copy_n(c.block_table.begin(), blocks, tables_h + table_len);
    for (int32_t i = 0; i < c.n_tokens; ++i) {
      const int32_t t = c.first_token + i, p = c.start_pos + i;
      pos_h[t] = p;
      table_off_h[t] = int32_t(table_len);
      slots_h[t] = int64_t(c.block_table[size_t(p / bs)]) * bs + p % bs;
    }
    table_len += blocks;
    const bool prompt = c.n_tokens >= kAttnPromptChunk;
    if (st.attn_runs.empty() || st.attn_runs.back().prompt != prompt) st.attn_runs.push_back({c.first_token, 0, prompt});
    st.attn_runs.back().count += c.n_tokens;
    st.max_positions = std::max(st.max_positions, c.start_pos + c.n_tokens);
    decode_only = decode_only && c.n_tokens == 1 && c.want_logits;
    if (batch.all_logits) {
      for (int32_t i = 0; i < c.n_tokens; ++i) rows_h[st.rows++] = c.first_token + i;
    } else if (c.want_logits) {
      rows_h[st.rows++] = c.first_token + c.n_tokens - 1;
    }
  }
  // Without the prompt build the step's attention is one run (one call per attn_tokens_per_call_).
  if (cuda::attention_prompt_warps() == 0) st.attn_runs.assign(1, {0, n, false});
  // Ranks past 0 of an expert-parallel group compute no logits (rank 0 samples).
  if (sharded() && config_.shard.rank > 0) st.rows = 0;
  uint8_t* md = meta_dev_.as<uint8_t>();
  check(cudaMemcpyAsync(md, mh, meta_.tables + size_t(table_len) * 4, cudaMemcpyHostToDevice, stream_),
        "CUDA runner: copying the step's metadata");
  if (!embed_on_device_) {
    float* rows = reinterpret_cast<float*>(mh + meta_.embed);
    for (int64_t t = 0; t < n; ++t) cpu::load_row(model_.embed, batch.tokens[size_t(t)], rows + t * H);
    check(cudaMemcpyAsync(md + meta_.embed, rows, size_t(n * H) * 4, cudaMemcpyHostToDevice, stream_),
          "CUDA runner: copying the embedding rows");
  }
  launches_ = embed_on_device_ ? 1 : 2;

  if (logits_out) logits_out->resize(size_t(st.rows * V));
  event_ops_.clear();
  const bool capturable = !sharded() || config_.shard.sums->capturable();
  if (decode_only && n > 0 && config_.cuda_graphs && capturable && !config_.profile_ops &&
      st.rows <= logit_rows_per_pass_) {
    // Decode steps replay a graph captured once per (batch size, attention partitions): nothing
    // that changes per step is in it (tokens, positions, slots, block tables and the expert
    // tables are read from device memory).
    st.grid_parts = 1;
    while (st.grid_parts < cuda::attention_grid_parts(st.max_positions)) st.grid_parts *= 2;
    const auto key = std::make_pair(n, st.grid_parts);
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "CUDA runner: capturing a step");
      cudaGraph_t graph = nullptr;
      try {
        enqueue_step(st, nullptr);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      check(cudaStreamEndCapture(stream_, &graph), "CUDA runner: capturing a step");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      check(err, "CUDA runner: instantiating a step's graph");
      it = graphs_.emplace(key, GraphExec{exec, launches_}).first;
    }
    check(cudaGraphLaunch(it->second.exec, stream_), "CUDA runner: launching a step's graph");
    launches_ = it->second.launches;
    if (logits_out)
      check(cudaMemcpyAsync(logits_out->data(), logits_dev_, size_t(st.rows * V) * 4, cudaMemcpyDeviceToHost, stream_),
            "CUDA runner: copying logits");
  } else {
    // In place or staged (offload/expert_staging.h): a prefill chunk touches nearly every host expert.
    st.staged = staging_ && moe_blocks_ &&
                offload::worth_staging(n, first_moe_max_tokens(), spec_.n_experts_per_token, spec_.n_experts);
    enqueue_step(st, observer, logits_out);
  }
  last_step_staged_ = st.staged;
  return st.rows;
}

void CudaRunner::mark(const char* op) {
  if (!config_.profile_ops) return;
  const size_t i = event_ops_.size();
  if (i == events_.size()) {
    cudaEvent_t e = nullptr;
    check(cudaEventCreate(&e), "CUDA runner: creating a profiling event");
    events_.push_back(e);
  }
  check(cudaEventRecord(events_[i], stream_), "CUDA runner: recording a profiling event");
  event_ops_.push_back(op);
}

void CudaRunner::collect_profile() {
  op_ms_.clear();
  for (size_t i = 1; i < event_ops_.size(); ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), "CUDA runner: reading a profiling event");
    auto it = std::find_if(op_ms_.begin(), op_ms_.end(), [&](const auto& p) { return p.first == event_ops_[i]; });
    if (it == op_ms_.end()) op_ms_.emplace_back(event_ops_[i], double(ms));
    else it->second += double(ms);
  }
}

void CudaRunner::enqueue_step(const Step& st, ForwardObserver* observer, std::vector<float>* logits) {
  const int64_t n = st.n, H = spec_.hidden_size, D = spec_.head_dim;
  const int64_t Q = spec_.q_dim(), KV = spec_.kv_dim(), V = spec_.vocab_size;
  const int32_t bs = config_.kv.block_size;
  const int32_t max_positions = st.max_positions;
  const uint8_t* md = meta_dev_.as<uint8_t>();
  const auto* tokens_d = reinterpret_cast<const int32_t*>(md + meta_.tokens);
  const auto* pos_d = reinterpret_cast<const int32_t*>(md + meta_.positions);
  const auto* table_off_d = reinterpret_cast<const int32_t*>(md + meta_.table_offsets);
  const auto* slots_d = reinterpret_cast<const int64_t*>(md + meta_.slots);
  const auto* rows_d = reinterpret_cast<const int32_t*>(md + meta_.rows);
  const auto* tables_d = reinterpret_cast<const int32_t*>(md + meta_.tables);
  const int64_t R = st.rows;
  mark(nullptr);
  if (st.staged) staging_->begin(stream_);  // the first two MoE layers' copies start now

  // ---- embedding ----
  if (embed_on_device_) {
    cuda::embed_rows(embed_.data, embed_.type, embed_.rows, H, tokens_d, n, x_, stream_);
    ++launches_;
  } else {
    check(cudaMemcpyAsync(x_, md + meta_.embed, size_t(n * H) * 4, cudaMemcpyDeviceToDevice, stream_),
          "CUDA runner: embedding rows");
    ++launches_;
  }
  mark("embedding");

  const int attention_launches = st.grid_parts > 1 ? 2 : cuda::attention_launches(max_positions);
  bool pending_residual = false;  // mlp_out_ still to be added to x_
  bool pending_shared = false;    // and shared_out_ with it
  // The rounded rows of h_ (both norms of a layer write them when the GEMMs after them round).
  const cuda::RoundedRows h_rounded = cuda::rounded_rows_at(h_rounded_, n, H);
  const bool can_round = H % 32 == 0;
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    const DeviceLayer& d = layers_[size_t(l)];
    const int layer = int(l);
    const bool round_attn =
        can_round && (reads_rounded(d.qkv, n) || reads_rounded(d.q, n) || reads_rounded(d.k, n) || reads_rounded(d.v, n));
    cuda::rmsnorm({.x = x_, .residual = pending_residual ? mlp_out_ : nullptr,
                   .residual2 = pending_residual && pending_shared ? shared_out_ : nullptr, .weight = d.attn_norm,
                   .out = h_, .n = n, .dim = H, .eps = spec_.rms_norm_eps, .rounded = round_attn ? h_rounded_ : nullptr},
                  stream_);
    ++launches_;
    mark("rmsnorm + residual");
    if (observer && pending_residual) observe(observer, "layer_out", layer - 1, x_, n, H);

    // q, k, v
    float *q, *k, *v;
    int64_t ld_q, ld_k, ld_v;
    const cuda::RoundedRows* attn_in = round_attn ? &h_rounded : nullptr;
    if (!d.qkv.empty()) {
      linear(d.qkv, h_, n, qkv_, d.qkv_bias, attn_in);
      q = qkv_, k = qkv_ + Q, v = qkv_ + Q + KV;
      ld_q = ld_k = ld_v = Q + 2 * KV;
    } else {
      q = qkv_, k = qkv_ + n * Q, v = qkv_ + n * (Q + KV);
      ld_q = Q, ld_k = KV, ld_v = KV;
      linear(d.q, h_, n, q, nullptr, attn_in);
      linear(d.k, h_, n, k, nullptr, attn_in);
      linear(d.v, h_, n, v, nullptr, attn_in);
    }
    mark("q/k/v projections");
    uint8_t* k_cache = kv_.as<uint8_t>() + size_t(l * kv_plane_bytes_);
    uint8_t* v_cache = kv_.as<uint8_t>() + size_t((spec_.n_layers + l) * kv_plane_bytes_);
    const bool fp8 = config_.kv_format == KvFormat::Fp8E4m3;
    float* k_scale = fp8 ? reinterpret_cast<float*>(k_cache + kv_layer_elems_) : nullptr;
    float* v_scale = fp8 ? reinterpret_cast<float*>(v_cache + kv_layer_elems_) : nullptr;
    cuda::rope_kv_write({.q = q, .k = k, .v = v, .ld_q = ld_q, .ld_k = ld_k, .ld_v = ld_v, .positions = pos_d,
                         .slots = slots_d, .inv_freq = inv_freq_, .attention_factor = attention_factor_,
                         .clip = float(spec_.clip_qkv), .q_norm = d.q_norm, .k_norm = d.k_norm,
                         .norm_per_head = spec_.qk_norm == QkNorm::PerHead, .norm_eps = spec_.rms_norm_eps,
                         .k_cache = k_cache, .v_cache = v_cache,
                         .kv_type = config_.kv_format, .k_scale = k_scale, .v_scale = v_scale, .n = n,
                         .n_heads = spec_.n_heads,
                         .n_kv_heads = spec_.n_kv_heads, .head_dim = D},
                        stream_);
    ++launches_;
    mark("q/k norm + rope + KV write");
    for (const Step::AttnRun& run : st.attn_runs)
      for (int64_t t0 = run.first; t0 < run.first + run.count; t0 += attn_tokens_per_call_) {
        const int64_t nt = std::min(attn_tokens_per_call_, run.first + run.count - t0);
        cuda::paged_attention({.q = q + t0 * ld_q, .ld_q = ld_q, .k_cache = k_cache, .v_cache = v_cache,
                               .kv_type = config_.kv_format, .k_scale = k_scale, .v_scale = v_scale,
                               .positions = pos_d + t0, .table_offset = table_off_d + t0,
                               .block_tables = tables_d, .block_size = bs, .out = attn_ + t0 * Q, .n = nt,
                               .n_heads = spec_.n_heads, .n_kv_heads = spec_.n_kv_heads, .head_dim = D,
                               .max_positions = max_positions, .min_grid_parts = st.grid_parts,
                               .workspace = attn_workspace_, .prompt_warps = run.prompt ? -1 : 0},
                              stream_);
        launches_ += attention_launches;
      }
    mark("attention");
    linear(d.o, attn_, n, proj_, d.o_bias);
    mark("o projection");
    const bool round_mlp = can_round && (experts_read_rounded(d, n) || mlp_reads_rounded(d, n));
    const cuda::RoundedRows* mlp_in = round_mlp ? &h_rounded : nullptr;
    cuda::rmsnorm({.x = x_, .residual = proj_, .weight = d.mlp_norm, .out = h_, .n = n, .dim = H,
                   .eps = spec_.rms_norm_eps, .rounded = round_mlp ? h_rounded_ : nullptr},
                  stream_);
    ++launches_;
    mark("rmsnorm + residual");
    if (observer) observe(observer, "attn_residual", layer, x_, n, H);

    if (d.moe) {
      const int64_t E = spec_.n_experts, K = spec_.n_experts_per_token;
      linear(d.router, h_, n, router_logits_, d.router_bias);
      mark("router matmul");
      cuda::route_topk(router_logits_, n, E, K, spec_.norm_topk_prob, route_ids_, route_weights_, stream_,
                       {.owned = d.owned, .ids = d.owned ? share_ids_ : nullptr});
      ++launches_;
      mark("router top-k");
      if (observer) {
        std::vector<int32_t> ids(size_t(n * K));
        std::vector<float> ws(size_t(n * K));
        check(cudaMemcpyAsync(ids.data(), route_ids_, ids.size() * 4, cudaMemcpyDeviceToHost, stream_), "observing");
        check(cudaMemcpyAsync(ws.data(), route_weights_, ws.size() * 4, cudaMemcpyDeviceToHost, stream_), "observing");
        check(cudaStreamSynchronize(stream_), "CUDA runner: observing the router");
        observer->on_router(layer, n, K, ids.data(), ws.data());
      }
      if (st.staged) staging_->before_experts(d.moe_index, stream_);
      experts(d, st.staged ? staging_->table(l) : d.expert_table, h_, n, mlp_out_, mlp_in);
      if (st.staged) staging_->after_experts(d.moe_index, stream_);
      mark("routed experts");
      if (sharded()) {
        // This GPU's experts' rows into every GPU's sum (the shared experts, replicated, stay apart).
        config_.shard.sums->sum(config_.shard.rank, mlp_out_, n * H, stream_);
        ++launches_;
        mark("expert all-reduce");
      }
      pending_shared = d.mlp_width > 0;
      if (pending_shared) {
        swiglu_mlp(d, h_, n, shared_out_, mlp_in);
        mark("shared experts");
      }
    } else {
      swiglu_mlp(d, h_, n, mlp_out_, mlp_in);
      pending_shared = false;
      mark("dense MLP");
    }
    pending_residual = true;
    if (observer && l + 1 == spec_.n_layers) {
      // x + (mlp_out + shared_out), the additions in the order the residual norm makes them.
      check(cudaMemcpyAsync(scratch_, mlp_out_, size_t(n * H) * 4, cudaMemcpyDeviceToDevice, stream_), "observing");
      if (pending_shared) cuda::add_inplace(scratch_, shared_out_, n * H, stream_);
      cuda::add_inplace(scratch_, x_, n * H, stream_);
      launches_ += pending_shared ? 2 : 1;
      observe(observer, "layer_out", layer, scratch_, n, H);
    }
  }

  // The expert counters to the host, beside the final norm and LM head (joined at the end).
  if (counts_dev_.ptr) {
    check(cudaEventRecord(counts_fork_, stream_), "CUDA runner: ordering the expert counts");
    check(cudaStreamWaitEvent(counts_stream_, counts_fork_, 0), "CUDA runner: ordering the expert counts");
    check(cudaMemcpyAsync(counts_host_.ptr, counts_dev_.ptr, counts_seen_.size() * 4, cudaMemcpyDeviceToHost, counts_stream_),
          "CUDA runner: copying the expert counts");
    check(cudaEventRecord(counts_join_, counts_stream_), "CUDA runner: ordering the expert counts");
  }

  // ---- final norm and LM head on the rows that want logits, a pass of logit_rows_per_pass_ at a time ----
  for (int64_t r0 = 0; r0 < R; r0 += logit_rows_per_pass_) {
    const int64_t nr = std::min(logit_rows_per_pass_, R - r0);
    cuda::rmsnorm({.x = x_, .residual = pending_residual ? mlp_out_ : nullptr,
                   .residual2 = pending_residual && pending_shared ? shared_out_ : nullptr, .rows = rows_d + r0,
                   .weight = final_norm_,
                   .out = final_rows_, .n = nr, .dim = H, .eps = spec_.rms_norm_eps},
                  stream_);
    ++launches_;
    mark("final norm");
    linear(lm_head_, final_rows_, nr, logits_dev_, nullptr);
    mark("LM head");
    if (logits)
      check(cudaMemcpyAsync(logits->data() + r0 * V, logits_dev_, size_t(nr * V) * 4, cudaMemcpyDeviceToHost, stream_),
            "CUDA runner: copying logits");
  }
  if (counts_dev_.ptr) check(cudaStreamWaitEvent(stream_, counts_join_, 0), "CUDA runner: ordering the expert counts");
}

void CudaRunner::prepare_expert_counts() {
  const int64_t E = spec_.n_experts;
  for (int64_t l = 0; l < spec_.n_layers; ++l) {
    DeviceLayer& d = layers_[size_t(l)];
    if (!d.moe) continue;
    d.moe_index = int64_t(moe_layer_.size());
    moe_layer_.push_back(l);
    const int64_t I = spec_.moe_intermediate_size, H = spec_.hidden_size;
    expert_bytes_.push_back(2 * I * row_bytes(d.expert_gate_up_type, H) + H * row_bytes(d.expert_down_type, I));
    for (int64_t e = 0; e < E; ++e)
      if (store_ && offload::on_host(store_->home(l, e))) host_experts_.push_back(int32_t(d.moe_index * E + e));
  }
  if (config_.expert_cache_bytes > 0 && !store_)
    fail("CUDA runner: an expert cache (--expert-cache-mem) caches experts the plan puts in host RAM; there are none "
         "without a plan (--gpu-mem or --plan)");
  using Counting = CudaRunnerConfig::ExpertCounting;
  if (config_.expert_cache_bytes > 0 && config_.count_experts == Counting::Off)
    fail("CUDA runner: the expert cache decides from the expert counts; count_experts is Off (internal error)");
  const bool count = config_.count_experts == Counting::Always || (config_.count_experts == Counting::WithPlan && store_);
  // Float experts are not counted (and never placed).
  if (moe_layer_.empty() || !moe_blocks_ || !count) return;
  const size_t n = 2 * moe_layer_.size() * size_t(E);
  counts_dev_.allocate(n * 4, "the routed-expert counters");
  check(cudaMemsetAsync(counts_dev_.ptr, 0, n * 4, stream_), "CUDA runner: zeroing the routed-expert counters");
  counts_host_.reserve(n * 4);
  std::memset(counts_host_.ptr, 0, n * 4);
  counts_seen_.assign(n, 0);
  counts_delta_.assign(n, 0);
  check(cudaStreamCreateWithFlags(&counts_stream_, cudaStreamNonBlocking), "CUDA runner: creating a stream");
  check(cudaEventCreateWithFlags(&counts_fork_, cudaEventDisableTiming), "CUDA runner: creating an event");
  check(cudaEventCreateWithFlags(&counts_join_, cudaEventDisableTiming), "CUDA runner: creating an event");
  if (config_.expert_cache_bytes > 0) {
    cache_ = offload::ExpertCache::build(*store_, config_.expert_cache_bytes, {});  // describe() reports its bytes
  }
}

void CudaRunner::start_cpu_experts() {
  if (!store_ || host_experts_.empty())
    fail("CUDA runner: CPU experts (--cpu-experts) compute experts the plan puts in host RAM; there are none "
         "(give --gpu-mem or --plan so that some are)");
  if (sharded()) fail("CUDA runner: CPU experts are not supported with expert parallelism");
  if (!moe_blocks_) fail("CUDA runner: CPU experts need block-format experts (internal error)");
  const offload::CpuExpertsOptions options{.cuda_device = config_.device, .threads = config_.cpu_expert_threads};
  double share = config_.cpu_expert_share;
  if (share > 1) fail("CUDA runner: the CPU experts' share {} is not in (0, 1]", share);
  if (share < 0) {
    // The faster side alone takes every host expert (offload::auto_cpu_share); the layer with the
    // most host experts sets the CPU's rate.
    int64_t best = -1, most = 0;
    const int64_t E = spec_.n_experts;
    for (size_t m = 0; m < moe_layer_.size(); ++m) {
      int64_t count = 0;
      for (int64_t e = 0; e < E; ++e) count += offload::on_host(store_->home(moe_layer_[m], e));
      if (count > most) most = count, best = moe_layer_[m];
    }
    const double cpu = best >= 0 ? offload::measure_cpu_expert_gbps(*store_, best, options) : 0.0;
    const double link = offload::measure_host_reads(config_.device).gbps;
    share = offload::auto_cpu_share(cpu, link);
    cpu_experts_note_ = fmt::format("share {:.2f} from CPU {:.1f} GB/s and link {:.1f} GB/s", share, cpu, link);
    if (share <= 0) {
      cpu_experts_note_ += ", so none";
      return;
    }
  } else {
    cpu_experts_note_ = fmt::format("share {:.2f}", share);
  }
  const int64_t E = spec_.n_experts;
  std::vector<std::vector<uint8_t>> splits;
  cpu_expert_flags_.assign(moe_layer_.size() * size_t(E), 0);
  for (size_t m = 0; m < moe_layer_.size(); ++m) {
    std::vector<uint8_t> on_host(size_t(E), 0);
    for (int64_t e = 0; e < E; ++e) on_host[size_t(e)] = offload::on_host(store_->home(moe_layer_[m], e));
    splits.push_back(offload::cpu_expert_split(on_host, share));
    std::copy(splits.back().begin(), splits.back().end(), cpu_expert_flags_.begin() + int64_t(m) * E);
  }
  cpu_experts_ = offload::CpuExperts::start(*store_, moe_layer_, splits, options);
}

void CudaRunner::after_step(int64_t n_tokens, double seconds) {
  if (cpu_experts_) cpu_experts_->check();
  if (moe_layer_.empty()) return;
  traffic_.tokens += n_tokens;
  traffic_.step_seconds += seconds;
  if (!counts_dev_.ptr) return;
  const auto* now = static_cast<const uint32_t*>(counts_host_.ptr);
  for (size_t i = 0; i < counts_seen_.size(); ++i) {
    counts_delta_[i] = now[i] - counts_seen_[i];  // unsigned: a counter that wrapped still differences right
    counts_seen_[i] = now[i];
  }
  const int64_t E = spec_.n_experts, M = int64_t(moe_layer_.size());
  const uint32_t* routings = counts_delta_.data();
  const uint32_t* touches = counts_delta_.data() + M * E;
  int64_t all = 0;
  for (int64_t i = 0; i < M * E; ++i) all += routings[i];
  traffic_.routings += all;
  // A staged step read its host experts from their VRAM copies, made once for the step; otherwise
  // each touched host expert was read in place (or served by the cache).
  const bool staged = last_step_staged_;
  for (const int32_t i : host_experts_) {  // the plan's host experts only: a few hundred to thousands
    if (!staged && cache_ && cache_->served_last_step(int32_t(i / E), int32_t(i % E))) {
      traffic_.cache_routings += routings[i];
    } else {
      traffic_.host_routings += routings[i];
      // Host bytes are the link's: an expert the CPU computed in this step did not cross it.
      const bool by_cpu = cpu_experts_ && n_tokens <= cuda::kMoeCpuMaxTokens && cpu_expert_flags_[size_t(i)];
      if (by_cpu) {
        traffic_.cpu_routings += routings[i];
        traffic_.cpu_bytes += int64_t(touches[i]) * expert_bytes_[size_t(i / E)];
      } else if (!staged) {
        traffic_.host_bytes += int64_t(touches[i]) * expert_bytes_[size_t(i / E)];
      }
    }
  }
  if (staged) {
    ++traffic_.staged_steps;
    traffic_.staged_bytes += staging_->bytes_per_step();
    traffic_.host_bytes += staging_->bytes_per_step();
  }
  counts_fresh_ = true;
}

void CudaRunner::update_expert_cache() {
  if (!cache_ || !counts_fresh_) return;
  const size_t half = counts_delta_.size() / 2;
  cache_->update({counts_delta_.data() + half, half}, stream_);
  counts_fresh_ = false;
}

ExpertTraffic CudaRunner::expert_traffic() const {
  ExpertTraffic t = traffic_;
  if (store_) {
    t.vram_expert_bytes = store_->report().vram_bytes;
    t.host_expert_bytes = store_->report().host_bytes();
  } else {
    for (int64_t b : expert_bytes_) t.vram_expert_bytes += b * spec_.n_experts;
  }
  if (cache_) {
    const offload::ExpertCacheReport c = cache_->report();
    t.cache_copies = c.copies;
    t.cache_copy_bytes = c.copy_bytes;
    t.cache_evictions = c.evictions;
    t.cache_bytes = c.bytes;
    t.cache_slots = c.slots;
    t.cache_slots_used = c.slots_used;
  }
  return t;
}

}  // namespace

void cuda_runner_check_batch(const ModelRunner& runner, const ForwardBatch& batch) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  if (!r) fail("cuda_runner_check_batch: this runner is not a CUDA runner");
  r->validate(batch);
}

CudaRunnerStats cuda_runner_stats(const ModelRunner& runner) {
  const auto* r = dynamic_cast<const CudaRunner*>(&runner);
  if (!r) fail("cuda_runner_stats: this runner is not a CUDA runner");
  return r->stats();
}

std::string CudaRunner::describe() const {
  cudaDeviceProp prop{};
  const std::string name = cudaGetDeviceProperties(&prop, config_.device) == cudaSuccess ? prop.name : "?";
  std::string cache;
  if (cache_) {
    const offload::ExpertCacheReport c = cache_->report();
    cache = fmt::format(", expert cache {} slots of {:.1f} MiB = {:.2f} GiB", c.slots, c.slot_bytes / 1048576.0,
                        c.bytes / 1073741824.0);
  }
  if (staging_)
    cache += fmt::format(", prefill stages host experts in 2 x {:.2f} GiB (of the workspace)",
                         staging_->bytes() / 2 / 1073741824.0);
  else if (!staging_note_.empty())
    cache += ", " + staging_note_;
  if (sharded())
    cache += fmt::format(", expert-parallel GPU {} of {}", config_.shard.rank, config_.shard.world);
  if (cpu_experts_) cache += ", " + cpu_experts_->describe() + " (" + cpu_experts_note_ + ")";
  else if (!cpu_experts_note_.empty()) cache += ", no CPU experts (" + cpu_experts_note_ + ")";
  return fmt::format("cuda:{} ({}; weights {:.2f} GiB, KV {} blocks of {} in {} = {:.2f} GiB, workspace {:.2f} GiB{})",
                     config_.device, name, weight_bytes_ / 1073741824.0, config_.kv.n_blocks, config_.kv.block_size,
                     kv_format_name(config_.kv.format), kv_bytes_ / 1073741824.0, workspace_bytes_ / 1073741824.0,
                     cache);
}

std::unique_ptr<ModelRunner> make_cuda_runner(const Model& model, const CudaRunnerConfig& config) {
  return std::make_unique<CudaRunner>(model, config);
}

}  // namespace spill
