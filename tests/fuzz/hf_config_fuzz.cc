// config.json loading (common/model/hf_config.h) on arbitrary text: a ModelConfig whose sizes are
// positive and bounded, or an error naming what is wrong.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/model/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<kvserve::ModelConfig> c = kvserve::ParseHfConfig(text, "fuzz/config.json");
  if (c.ok() && (c->num_layers <= 0 || c->hidden_size <= 0 || c->num_heads <= 0 ||
                 c->num_kv_heads <= 0 || c->head_dim <= 0)) {
    abort();  // the loader promises positive sizes
  }
  return 0;
}
