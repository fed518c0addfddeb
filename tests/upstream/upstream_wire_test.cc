// A GenerateRequest as an OpenAI upstream's /v1/completions is asked it, and the upstream's
// event stream (vLLM's shape: token_ids with return_token_ids, "token_id:N" logprobs, a usage
// chunk, [DONE]) read back into the deltas a kvserve worker sends.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/status_matchers.h"
#include "upstream/completion_wire.h"

namespace kvserve::upstream {
namespace {

namespace pb = kvserve::v1;
using json = nlohmann::json;

pb::GenerateRequest Request() {
  pb::GenerateRequest r;
  r.set_request_id("r1");
  for (int t : {1, 2, 3}) r.add_prompt_token_ids(t);
  r.set_max_tokens(4);
  r.mutable_sampling()->set_temperature(0.5f);
  return r;
}

TEST(UpstreamWireTest, TheBodyAsksByTokenIdsWithEveryServedParameter) {
  pb::GenerateRequest r = Request();
  pb::SamplingParams* s = r.mutable_sampling();
  s->set_top_p(0.9f);
  s->set_top_k(5);
  s->set_seed(7);
  s->set_logprobs(2);
  s->set_n(2);
  s->set_repetition_penalty(1.1f);
  s->set_min_tokens(1);
  (*s->mutable_logit_bias())[42] = -3;
  s->add_allowed_token_ids(9);
  r.add_stop_token_ids(13);
  r.set_cache_salt("tenant");
  ASSERT_OK_AND_ASSIGN(std::string body, UpstreamCompletionBody(r, "m"));
  const json b = json::parse(body);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["prompt"], json({1, 2, 3}));
  EXPECT_EQ(b["max_tokens"], 4);
  EXPECT_TRUE(b["stream"]);
  EXPECT_TRUE(b["return_token_ids"]);
  EXPECT_TRUE(b["return_tokens_as_token_ids"]);
  EXPECT_TRUE(b["stream_options"]["include_usage"]);
  EXPECT_EQ(b["top_k"], 5);
  EXPECT_EQ(b["seed"], 7);
  EXPECT_EQ(b["logprobs"], 2);
  EXPECT_EQ(b["n"], 2);
  EXPECT_EQ(b["min_tokens"], 1);
  EXPECT_EQ(b["logit_bias"]["42"], -3);
  EXPECT_EQ(b["allowed_token_ids"], json({9}));
  EXPECT_EQ(b["stop_token_ids"], json({13}));
  EXPECT_EQ(b["cache_salt"], "tenant");
  EXPECT_FALSE(b.contains("presence_penalty"));
}

TEST(UpstreamWireTest, ParametersAnUpstreamCannotBeAskedAreRefusedByName) {
  pb::GenerateRequest r = Request();
  r.mutable_sampling()->add_bad_words()->add_ids(5);
  EXPECT_THAT(UpstreamCompletionBody(r, "m").status().message(), ::testing::HasSubstr("bad_words"));
  r = Request();
  r.mutable_sampling()->mutable_constraint()->set_regex("a+");
  EXPECT_THAT(UpstreamCompletionBody(r, "m").status().message(),
              ::testing::HasSubstr("structured outputs"));
  r = Request();
  r.mutable_sampling()->set_prompt_logprobs(0);
  EXPECT_THAT(UpstreamCompletionBody(r, "m").status().message(),
              ::testing::HasSubstr("prompt_logprobs"));
}

// vLLM's completions stream for n = 2 with logprobs 1, cut at every byte boundary.
constexpr char kStream[] =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[10],"
    "\"logprobs\":{\"tokens\":[\"token_id:10\"],\"token_logprobs\":[-0.5],"
    "\"top_logprobs\":[{\"token_id:10\":-0.5,\"token_id:11\":-0.25}]},\"finish_reason\":null}]}\n\n"
    ": keep-alive\n\n"
    "data: {\"id\":\"c\",\"choices\":[{\"index\":1,\"text\":\"b\",\"token_ids\":[20,21],"
    "\"logprobs\":{\"tokens\":[\"token_id:20\",\"token_id:21\"],\"token_logprobs\":[-1,-2],"
    "\"top_logprobs\":[{\"token_id:20\":-1},{\"token_id:21\":-2}]},"
    "\"finish_reason\":\"length\",\"stop_reason\":null}]}\r\n\r\n"
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"token_ids\":[2],"
    "\"logprobs\":{\"tokens\":[\"token_id:2\"],\"token_logprobs\":[-0.1],"
    "\"top_logprobs\":[{\"token_id:2\":-0.1}]},\"finish_reason\":\"stop\",\"stop_reason\":null}]}"
    "\n\n"
    "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,"
    "\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\n"
    "data: [DONE]\n\n";

TEST(UpstreamWireTest, TheStreamBecomesWorkerDeltasWhereverItIsCut) {
  pb::GenerateRequest r = Request();
  r.mutable_sampling()->set_n(2);
  r.mutable_sampling()->set_logprobs(1);
  const std::string stream = kStream;
  for (size_t cut = 1; cut < stream.size(); cut += 7) {
    UpstreamStreamReader reader(r);
    std::vector<pb::GenerateResponse> out;
    ASSERT_OK(reader.Feed(std::string_view(stream).substr(0, cut), &out));
    ASSERT_OK(reader.Feed(std::string_view(stream).substr(cut), &out));
    ASSERT_TRUE(reader.finished());
    ASSERT_EQ(out.size(), 3u) << cut;
    EXPECT_THAT(out[0].token_ids(), ::testing::ElementsAre(10));
    ASSERT_EQ(out[0].logprobs_size(), 1);
    EXPECT_FLOAT_EQ(out[0].logprobs(0).sampled().logprob(), -0.5f);
    ASSERT_EQ(out[0].logprobs(0).top_size(), 1);
    EXPECT_EQ(out[0].logprobs(0).top(0).token_id(), 11);  // the best first, one asked
    EXPECT_EQ(out[0].logprobs(0).rank(), 2);
    EXPECT_EQ(out[1].sample_index(), 1);
    EXPECT_EQ(out[1].finish_reason(), pb::FINISH_REASON_LENGTH);
    EXPECT_FALSE(out[1].has_usage());
    // The last sample's final delta waited for the usage chunk.
    EXPECT_EQ(out[2].finish_reason(), pb::FINISH_REASON_STOP);
    EXPECT_EQ(out[2].stop_token_id(), 2);  // EOS: vLLM returns it among the ids
    EXPECT_EQ(out[2].usage().prompt_tokens(), 3);
    EXPECT_EQ(out[2].usage().completion_tokens(), 4);
    EXPECT_EQ(out[2].usage().cached_prompt_tokens(), 2);
  }
}

TEST(UpstreamWireTest, ErrorsAndBrokenStreamsAreNamed) {
  pb::GenerateRequest r = Request();
  UpstreamStreamReader a(r);
  std::vector<pb::GenerateResponse> out;
  ASSERT_OK(a.Feed("data: {\"error\":{\"message\":\"too long\",\"code\":400}}\n\n", &out));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].finish_reason(), pb::FINISH_REASON_ERROR);
  EXPECT_EQ(out[0].error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(out[0].error().message(), ::testing::HasSubstr("too long"));

  UpstreamStreamReader b(r);
  EXPECT_THAT(b.Feed("data: {\"choices\":[{\"index\":0,\"text\":\"x\"}]}\n\n", &out).message(),
              ::testing::HasSubstr("return_token_ids"));
  UpstreamStreamReader c(r);
  EXPECT_THAT(c.Feed("data: nope\n\n", &out).message(), ::testing::HasSubstr("not JSON"));
  UpstreamStreamReader d(r);
  ASSERT_OK(d.Feed("data: {\"choices\":[{\"index\":0,\"token_ids\":[1]}]}\n\n", &out));
  EXPECT_EQ(d.Finish(&out).code(), absl::StatusCode::kUnavailable);
  UpstreamStreamReader e(r);
  EXPECT_THAT(e.Feed("data: {\"choices\":[{\"index\":3,\"token_ids\":[1]}]}\n\n", &out).message(),
              ::testing::HasSubstr("index 3"));

  pb::GenerateResponse refused =
      UpstreamRefusal("r1", 429, R"({"object":"error","message":"busy","code":429})");
  EXPECT_EQ(refused.error().code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(refused.error().message(), ::testing::HasSubstr("busy"));
}

}  // namespace
}  // namespace kvserve::upstream
