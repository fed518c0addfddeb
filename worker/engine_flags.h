// The engine's command-line flags, shared by kvserve-run and kvserve-worker so that both take
// the same settings under the same (vLLM) names: --model, --block-size, --max-num-seqs,
// --max-num-batched-tokens, --max-model-len, --enable-prefix-caching, ...
//
//   ASSIGN_OR_RETURN(EngineConfig config, EngineConfigFromFlags());
#ifndef KVSERVE_WORKER_ENGINE_FLAGS_H_
#define KVSERVE_WORKER_ENGINE_FLAGS_H_

#include "absl/status/statusor.h"
#include "worker/engine.h"

namespace kvserve::worker {

// InvalidArgument for a missing --model or an unsupported --device.
absl::StatusOr<EngineConfig> EngineConfigFromFlags();

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_ENGINE_FLAGS_H_
