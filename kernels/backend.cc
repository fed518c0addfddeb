#include "kernels/backend.h"

#include <vector>

namespace kvserve::kernels {

void Backend::GatherTokens(const GatherTokensParams& p) {
  if (p.n == 0) return;
  std::vector<int32_t> rows(p.n), from(p.n);
  Download(rows.data(), p.rows, sizeof(int32_t) * rows.size());
  Download(from.data(), p.from, sizeof(int32_t) * from.size());
  for (int64_t i = 0; i < p.n; ++i) {
    int32_t token = 0;
    Download(&token, p.src + from[i], sizeof(token));
    Upload(p.dst + rows[i], &token, sizeof(token));
  }
}

}  // namespace kvserve::kernels
