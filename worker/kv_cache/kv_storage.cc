#include "worker/kv_cache/kv_storage.h"

namespace kvserve::worker {

KvStorage::KvStorage(const KvCacheSpec& spec, int num_blocks, int num_kv_heads, int block_size,
                     int head_dim, kernels::Backend* backend, bool host_tier)
    : spec_(spec),
      num_blocks_(num_blocks),
      num_kv_heads_(num_kv_heads),
      block_size_(block_size),
      head_dim_(head_dim),
      layers_(spec.k.size()) {
  const int64_t units = int64_t{num_blocks} * num_kv_heads;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const KvFormat& kf = spec.k[l];
    const KvFormat& vf = spec.v[l];
    Layer& L = layers_[l];
    L.k = kernels::Buffer<uint8_t>(backend, units * kf.RowBytes(head_dim) * block_size, host_tier);
    L.v = kernels::Buffer<uint8_t>(backend, units * vf.RowBytes(head_dim) * block_size, host_tier);
    L.k_scales = kernels::Buffer<uint16_t>(backend, units * kf.ScaleEntries(block_size, head_dim),
                                           host_tier);
    L.v_scales = kernels::Buffer<uint16_t>(backend, units * vf.ScaleEntries(block_size, head_dim),
                                           host_tier);
  }
}

kernels::KvCacheView KvStorage::View(int layer) {
  Layer& L = layers_[layer];
  kernels::KvCacheView v;
  v.k = L.k.data();
  v.v = L.v.data();
  v.k_scales = L.k_scales.empty() ? nullptr : L.k_scales.data();
  v.v_scales = L.v_scales.empty() ? nullptr : L.v_scales.data();
  v.k_format = spec_.k[layer];
  v.v_format = spec_.v[layer];
  v.num_blocks = num_blocks_;
  v.num_kv_heads = num_kv_heads_;
  v.block_size = block_size_;
  v.head_dim = head_dim_;
  return v;
}

std::vector<kernels::KvCacheView> KvStorage::Views() {
  std::vector<kernels::KvCacheView> out;
  for (int l = 0; l < num_layers(); ++l) out.push_back(View(l));
  return out;
}

int64_t KvStorage::bytes() const {
  int64_t total = 0;
  for (const Layer& L : layers_) {
    total +=
        static_cast<int64_t>(L.k.size() + L.v.size() + 2 * (L.k_scales.size() + L.v_scales.size()));
  }
  return total;
}

}  // namespace kvserve::worker
