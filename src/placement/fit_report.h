// The fit report: does the model fit, and how fast can it be? Printed by `spill plan`, and by
// every start-up before anything loads (the start-up path calls format_fit_report on the outcome
// of make_plan with its own flags).
#pragma once
#include <string>

#include "placement/planner.h"

namespace spill::placement {

// Per GPU, memory without offload (weights by class + KV + workspace) against what is available;
// with the plan: VRAM by class, host bytes, host experts in total and per layer (min / max), the
// expected host bytes per token at batch 1 and batch B, and the decode upper bound per stream from
// the bandwidth ceilings. When the plan is refused, the refusal ends the report.
std::string format_fit_report(const PlanOutcome& outcome);

}  // namespace spill::placement
