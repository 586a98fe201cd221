// Memory accounting of a loaded model: the bytes its tensors take as they are stored, by tensor
// class and per layer. account_weights (memory.h) predicts the same ModelBytes from a config and a
// --quant mix; a file that is already quantized (a GGUF from llama-quantize) fixes the types
// itself, often per layer (Q4_K_M gives some layers' expert down projections Q6_K), so the
// planner prices it from what the file holds rather than from one type per class.
#pragma once
#include <functional>

#include "model/model.h"
#include "placement/memory.h"

namespace spill::placement {

// Calls `visit` once per weight tensor of the model (norms and biases included, empty views and
// the head when it is the embedding left out) with its placement class. Routed experts come with
// their index in the layer; every other tensor with expert -1. Layer -1: embedding, head, final norm.
using WeightVisitor = std::function<void(TensorClass cls, int64_t layer, int64_t expert, const TensorView& t)>;
void visit_weights(const Model& model, const WeightVisitor& visit);

// The model's shape for the planner: its spec and shared experts.
ModelShape shape_of(const Model& model);

// Bytes of every tensor as loaded. Per layer, all routed experts must be of one size (the kernels
// and the plan address an expert by layer and index); a layer whose experts differ is refused.
ModelBytes measure_weights(const Model& model);

// For reports: per class the type that holds the most bytes of that class (classes the model does
// not have keep the defaults).
TensorClassTypes dominant_types(const Model& model);

}  // namespace spill::placement
