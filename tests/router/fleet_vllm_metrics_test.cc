// The router's vllm:* families (router/fleet_vllm_metrics.h): families read from the text format
// (common/net/prometheus_text.h), merged over workers by each type's rule, and read from real
// HTTP servers on loopback, one of them gone.
#include "router/fleet_vllm_metrics.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/net/http_server.h"
#include "common/net/prometheus_text.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::router {
namespace {

// As a kvserve worker writes them (prometheus-cpp: a `worker` label, counters named _total).
constexpr char kWorkerA[] = R"(# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",worker="a"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m",worker="a"} 0.25
# TYPE vllm:request_success_total counter
vllm:request_success_total{finished_reason="stop",model_name="m",worker="a"} 3
vllm:request_success_total{finished_reason="length",model_name="m",worker="a"} 1
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{model_name="m",worker="a"} 4
vllm:e2e_request_latency_seconds_sum{model_name="m",worker="a"} 2.5
vllm:e2e_request_latency_seconds_bucket{model_name="m",worker="a",le="1"} 3
vllm:e2e_request_latency_seconds_bucket{model_name="m",worker="a",le="+Inf"} 4
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",model_name="m",worker="a"} 1
# TYPE kvserve_blocks_total gauge
kvserve_blocks_total{worker="a"} 100
)";

// As vLLM's prometheus_client writes them: an `engine` label, `_created` samples, a summary.
constexpr char kWorkerB[] =
    R"(# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.75
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e+09
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 6.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 6.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 9.5
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",model_name="m"} 1.0
# TYPE vllm:some_summary summary
vllm:some_summary{model_name="m",quantile="0.5"} 3
vllm:some_summary_sum{model_name="m"} 10
vllm:some_summary_count{model_name="m"} 2
python_gc_objects_collected_total{generation="0"} 1
)";

std::vector<MetricFamily> Families(const std::string& text) {
  absl::StatusOr<std::vector<MetricFamily>> f = ParsePrometheusFamilies(text);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *f : std::vector<MetricFamily>{};
}

// The merged value of `name` with exactly `labels`; NaN when absent.
double Value(const std::vector<MetricFamily>& families, const std::string& name,
             const std::vector<std::pair<std::string, std::string>>& labels) {
  for (const MetricFamily& f : families) {
    for (const Sample& s : f.samples) {
      if (s.name == name && s.labels == labels) return s.value;
    }
  }
  return NAN;
}

TEST(PrometheusFamiliesTest, SamplesGoToTheirTypeLinesFamily) {
  const std::vector<MetricFamily> f = Families(kWorkerB);
  ASSERT_EQ(f.size(), 7u);
  EXPECT_EQ(f[0].name, "vllm:num_requests_running");
  EXPECT_EQ(f[0].help, "Number of requests in model execution batches.");
  EXPECT_EQ(f[2].type, "counter");
  EXPECT_EQ(f[2].samples.size(), 2u);                         // _total and _created
  EXPECT_EQ(f[3].samples.size(), 4u);                         // buckets, count, sum
  EXPECT_EQ(f[6].name, "python_gc_objects_collected_total");  // no TYPE line: its own, untyped
  EXPECT_EQ(f[6].type, "untyped");
  // Written and read back: the same families.
  const std::vector<MetricFamily> again = Families(WritePrometheusText(f));
  ASSERT_EQ(again.size(), f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(again[i].name, f[i].name);
    EXPECT_EQ(again[i].type, f[i].type);
    EXPECT_EQ(again[i].help, f[i].help);
    ASSERT_EQ(again[i].samples.size(), f[i].samples.size());
    for (size_t j = 0; j < f[i].samples.size(); ++j) {
      EXPECT_EQ(again[i].samples[j].labels, f[i].samples[j].labels);
      EXPECT_EQ(again[i].samples[j].value, f[i].samples[j].value);
    }
  }
  EXPECT_FALSE(ParsePrometheusFamilies("# TYPE x gauge\nx{a=\"1\" 2\n").ok());
}

TEST(PrometheusFamiliesTest, WrittenLabelsAndValuesReadBackExactly) {
  MetricFamily f{.name = "vllm:x", .type = "gauge"};
  f.samples.push_back({"vllm:x", {{"l", "a \"q\" \\ b\nc"}}, 0.1});
  f.samples.push_back({"vllm:x", {{"l", "big"}}, 123456789012345.0});
  f.samples.push_back({"vllm:x", {{"l", "inf"}}, INFINITY});
  const std::string text = WritePrometheusText({f});
  EXPECT_NE(text.find("vllm:x{l=\"big\"} 123456789012345\n"), std::string::npos) << text;
  const std::vector<MetricFamily> back = Families(text);
  ASSERT_EQ(back.size(), 1u);
  ASSERT_EQ(back[0].samples.size(), 3u);
  EXPECT_EQ(back[0].samples[0].labels, f.samples[0].labels);
  EXPECT_EQ(back[0].samples[0].value, 0.1);
  EXPECT_EQ(back[0].samples[2].value, INFINITY);
}

TEST(FleetVllmMetricsTest, EachTypeCombinesByItsRule) {
  const std::vector<MetricFamily> m = MergeVllmFamilies({Families(kWorkerA), Families(kWorkerB)});
  // Only vllm:*; in the order first met.
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].name, "vllm:num_requests_running");
  EXPECT_EQ(m[0].help, "Number of requests running.");  // the first source's
  EXPECT_EQ(m[5].name, "vllm:some_summary");
  const std::vector<std::pair<std::string, std::string>> model = {{"model_name", "m"}};
  EXPECT_EQ(Value(m, "vllm:num_requests_running", model), 7);   // summed over workers, engines
  EXPECT_EQ(Value(m, "vllm:kv_cache_usage_perc", model), 0.5);  // a fraction: the mean
  EXPECT_EQ(
      Value(m, "vllm:request_success_total", {{"finished_reason", "stop"}, {"model_name", "m"}}),
      8);
  EXPECT_EQ(
      Value(m, "vllm:request_success_total", {{"finished_reason", "length"}, {"model_name", "m"}}),
      1);
  EXPECT_EQ(
      Value(m, "vllm:request_success_created", {{"finished_reason", "stop"}, {"model_name", "m"}}),
      1.7e9);
  EXPECT_EQ(Value(m, "vllm:e2e_request_latency_seconds_count", model), 10);
  EXPECT_EQ(Value(m, "vllm:e2e_request_latency_seconds_sum", model), 12);
  // One series whatever order its labels were written in (prometheus_client sorts them, kvserve
  // writes le last): the first source's order.
  EXPECT_EQ(Value(m, "vllm:e2e_request_latency_seconds_bucket", {{"model_name", "m"}, {"le", "1"}}),
            5);
  EXPECT_EQ(
      Value(m, "vllm:e2e_request_latency_seconds_bucket", {{"model_name", "m"}, {"le", "+Inf"}}),
      10);
  EXPECT_EQ(Value(m, "vllm:cache_config_info", {{"block_size", "16"}, {"model_name", "m"}}), 1);
  EXPECT_EQ(m[5].samples.size(), 2u);  // the summary's quantile dropped, _sum and _count kept
  for (const MetricFamily& f : m) {
    for (const Sample& s : f.samples) {
      EXPECT_EQ(s.label("worker"), nullptr) << s.name;
      EXPECT_EQ(s.label("engine"), nullptr) << s.name;
    }
  }
}

TEST(FleetVllmMetricsTest, ReadsEveryWorkerAndCountsTheOnesThatFail) {
  auto serve = [](std::string body) {
    absl::StatusOr<std::unique_ptr<HttpServer>> s =
        HttpServer::Start("127.0.0.1", 0, [body](const std::string&, const std::string& target) {
          return target == "/metrics" ? HttpResponse{.body = body} : HttpResponse{.status = 404};
        });
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  };
  std::unique_ptr<HttpServer> a = serve(kWorkerA), b = serve(kWorkerB), junk = serve("not metrics");
  std::unique_ptr<HttpServer> gone = serve("");
  const int gone_port = gone->port();
  gone.reset();
  const std::string text =
      ReadFleetVllmMetrics({{"a", "127.0.0.1:" + std::to_string(a->port())},
                            {"b", "127.0.0.1:" + std::to_string(b->port())},
                            {"junk", "127.0.0.1:" + std::to_string(junk->port())},
                            {"gone", "127.0.0.1:" + std::to_string(gone_port)}},
                           absl::Seconds(2));
  EXPECT_NE(text.find("vllm:num_requests_running{model_name=\"m\"} 7\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("kvserve_router_vllm_metrics_sources{result=\"read\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvserve_router_vllm_metrics_sources{result=\"failed\"} 2\n"),
            std::string::npos)
      << text;
  // Every family once.
  const std::vector<MetricFamily> f = Families(text);
  for (size_t i = 0; i < f.size(); ++i) {
    for (size_t j = i + 1; j < f.size(); ++j) EXPECT_NE(f[i].name, f[j].name);
  }
  EXPECT_EQ(ReadFleetVllmMetrics({}, absl::Seconds(1)).find("\nvllm:"), std::string::npos);
}

}  // namespace
}  // namespace kvserve::router
