// kvserve's version, the Helm chart's appVersion (deploy/helm/kvserve/Chart.yaml; the test
// version_matches_chart checks that the two agree). The router serves it at GET /version.
#pragma once

#include <string_view>

namespace kvserve {

inline constexpr std::string_view kVersion = "0.1.0";

}  // namespace kvserve
