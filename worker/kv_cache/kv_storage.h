// The memory of a KV block pool: per layer, K and V data in their formats plus fp16 scales,
// laid out as kernels/kv_quant.h describes. The device pool and the host (swap / host prefix
// cache) pool are two KvStorage objects with the same spec, so a block copies between them as
// whole byte ranges. The memory comes from the rank's backend: device memory for the device
// pool and the backend's host memory (pinned on CUDA) for the host pool; on the CPU backend both
// are ordinary memory.
//
//   KvStorage device(spec, num_blocks, kv_heads, block_size, head_dim, backend);
//   model->Forward(batch, device);
//
// Owned by the engine thread.
#ifndef KVSERVE_WORKER_KV_CACHE_KV_STORAGE_H_
#define KVSERVE_WORKER_KV_CACHE_KV_STORAGE_H_

#include <cstdint>
#include <vector>

#include "common/kv/kv_format.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"

namespace kvserve::worker {

class KvStorage {
 public:
  KvStorage(const KvCacheSpec& spec, int num_blocks, int num_kv_heads, int block_size, int head_dim,
            kernels::Backend* backend, bool host_tier = false);

  [[nodiscard]] kernels::KvCacheView View(int layer);
  [[nodiscard]] std::vector<kernels::KvCacheView> Views();
  [[nodiscard]] int num_blocks() const { return num_blocks_; }
  [[nodiscard]] int num_layers() const { return static_cast<int>(layers_.size()); }
  // Bytes allocated (data and scales, every layer): num_blocks × KvCacheSpec::BytesPerBlock.
  [[nodiscard]] int64_t bytes() const;
  [[nodiscard]] const KvCacheSpec& spec() const { return spec_; }

 private:
  struct Layer {
    kernels::Buffer<uint8_t> k, v;
    kernels::Buffer<uint16_t> k_scales, v_scales;
  };
  KvCacheSpec spec_;
  int num_blocks_, num_kv_heads_, block_size_, head_dim_;
  std::vector<Layer> layers_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_KV_CACHE_KV_STORAGE_H_
