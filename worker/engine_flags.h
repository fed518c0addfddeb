// The engine's command-line flags, shared by kvserve-run and kvserve-worker so that both take
// the same settings under the same (vLLM) names: --model, --block-size, --max-num-seqs,
// --max-num-batched-tokens, --max-model-len, --enable-prefix-caching, ...
//
//   ASSIGN_OR_RETURN(EngineConfig config, EngineConfigFromFlags());
//   ASSIGN_OR_RETURN(RunnerTestHooks hooks, TestHooksFromFlags());
#ifndef KVSERVE_WORKER_ENGINE_FLAGS_H_
#define KVSERVE_WORKER_ENGINE_FLAGS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine.h"

namespace kvserve::worker {

// InvalidArgument for a missing --model or a value outside a flag's choices (--device,
// --dtype, ...); Engine::Create checks the rest.
absl::StatusOr<EngineConfig> EngineConfigFromFlags();
// vLLM's `vllm serve MODEL`: the one positional argument (after argv[0]) is the model, as
// --model; InvalidArgument for more than one, or one that disagrees with --model.
absl::Status TakePositionalModel(const std::vector<char*>& positional);
// The testing aid --tp-fault-injection RANK:STEP:error|stall (a rank fails or stalls at a
// step); InvalidArgument for another form.
absl::StatusOr<RunnerTestHooks> TestHooksFromFlags();

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_ENGINE_FLAGS_H_
