// Greedy decoding with llama.cpp's library, token ids in and out, to compare spill's greedy tokens
// with llama.cpp's on the same GGUF file:
//   greedy_ids FILE.gguf N_NEW ID,ID,... [LOGITS.f32]
// prints the prompt ids followed by N_NEW greedy ids and then, per generated position, the top
// logit and the margin to the runner-up; with LOGITS.f32, also writes llama.cpp's full logits of
// each generated position there (N_NEW x n_vocab little-endian float32, no header).
// Build against a llama.cpp checkout (see tools/llamacpp/README.md).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s FILE.gguf N_NEW ID,ID,... [LOGITS.f32]\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> ids;
  for (char* p = argv[3]; *p;) {
    ids.push_back(llama_token(std::strtol(p, &p, 10)));
    if (*p == ',') ++p;
  }
  const int n_new = std::atoi(argv[2]);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = uint32_t(ids.size() + n_new + 8);
  cp.n_batch = cp.n_ctx;
  cp.n_threads = cp.n_threads_batch = 1;
  // GREEDY_IDS_EXACT=1: F32 KV cache and no flash attention, so that an F32 file's logits differ from
  // spill's only by fp32 rounding in another order (the default F16 cache rounds K and V to 11 bits).
  if (const char* exact = std::getenv("GREEDY_IDS_EXACT"); exact && std::string(exact) == "1") {
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  }
  llama_context* ctx = llama_init_from_model(model, cp);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<llama_token> all = ids;
  std::vector<std::pair<float, float>> margins;
  std::vector<float> all_logits;
  llama_batch batch = llama_batch_get_one(all.data(), int32_t(all.size()));
  for (int step = 0; step < n_new; ++step) {
    if (llama_decode(ctx, batch) != 0) return 1;
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int v = 1; v < n_vocab; ++v)
      if (logits[v] > logits[best]) best = v;
    float second = -1e30f;
    for (int v = 0; v < n_vocab; ++v)
      if (v != best && logits[v] > second) second = logits[v];
    margins.push_back({logits[best], logits[best] - second});
    all_logits.insert(all_logits.end(), logits, logits + n_vocab);
    all.push_back(best);
    batch = llama_batch_get_one(&all.back(), 1);
  }
  for (size_t i = 0; i < all.size(); ++i) std::printf("%s%d", i ? "," : "", all[i]);
  std::printf("\n");
  for (auto [top, margin] : margins) std::printf("%.5f %.5f\n", top, margin);
  if (argc == 5) {
    FILE* f = std::fopen(argv[4], "wb");
    if (!f || std::fwrite(all_logits.data(), sizeof(float), all_logits.size(), f) != all_logits.size()) return 1;
    std::fclose(f);
  }
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
