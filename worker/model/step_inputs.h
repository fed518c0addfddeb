// One forward step's inputs in backend memory and the shapes its ops are issued with: what
// Model::RunModel reads, from the eager batch upload or from a decode graph's fixed buffer.
#ifndef KVSERVE_WORKER_MODEL_STEP_INPUTS_H_
#define KVSERVE_WORKER_MODEL_STEP_INPUTS_H_

#include <cstdint>

namespace kvserve::worker {

struct StepInputs {
  const int32_t* token_ids = nullptr;     // [tokens]
  const int32_t* positions = nullptr;     // [tokens]
  const int64_t* slot_mapping = nullptr;  // [tokens]
  const int32_t* query_start = nullptr;   // [num_seqs]
  const int32_t* query_len = nullptr;     // [num_seqs]
  const int32_t* context_len = nullptr;   // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  const int32_t* logit_rows = nullptr;    // [num_logit_rows]
  int64_t tokens = 0, num_seqs = 0, max_blocks_per_seq = 0, num_logit_rows = 0;
  // Upper bounds of query_len[] and context_len[] (PagedAttentionParams).
  int64_t max_query_len = 0, max_context_len = 0;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_MODEL_STEP_INPUTS_H_
