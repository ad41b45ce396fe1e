// Flow-GRPO's SDE step and its log-probability under the contract (docs/contract.md
// section 15), over ranges: the step's rows [begin, end) (the last dim a row), the
// log-probability's samples [begin, end). The reference runs the whole range in order,
// the CPU backend ranges on its pool: one code path.
#pragma once

#include <cstdint>

#include "api/problems.hpp"

namespace kernel_align::reference {

void flow_sde_step_rows(const detail::FlowSdeStepProblem& p, std::int64_t begin, std::int64_t end);
void flow_sde_step_backward_rows(const detail::FlowSdeStepBackwardProblem& p, std::int64_t begin,
                                 std::int64_t end);
void flow_sde_logp_samples(const detail::FlowSdeLogpProblem& p, std::int64_t begin,
                           std::int64_t end);
void flow_sde_logp_backward_samples(const detail::FlowSdeLogpBackwardProblem& p, std::int64_t begin,
                                    std::int64_t end);

}  // namespace kernel_align::reference
