// The Mooncake trace format: parsed as published, malformed lines refused naming the line and
// the field, prompts derived from hash ids so that shared blocks share their tokens.
#include "tools/trace/trace.h"

#include <algorithm>
#include <set>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tools/trace/generate.h"

namespace kvserve::trace {
namespace {

using kvserve::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kTwo[] =
    R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}
{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}
)";

TEST(TraceTest, ParsesThePublishedExample) {
  ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> t, ParseTrace(kTwo, "example"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].timestamp_ms, 27482);
  EXPECT_EQ(t[0].input_length, 6955);
  EXPECT_EQ(t[0].output_length, 52);
  EXPECT_EQ(t[0].hash_ids.size(), 14u);
  EXPECT_EQ(t[1].hash_ids.back(), 2366);
  EXPECT_EQ(UniqueTokens(t), 15 * 512);
  // Round trip.
  ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> again,
                       ParseTrace(FormatTraceLine(t[1]) + "\n", "again"));
  EXPECT_EQ(again[0].hash_ids, t[1].hash_ids);
  EXPECT_EQ(again[0].input_length, t[1].input_length);
}

// Binned timestamps (as the published traces have) spread over their bin: each request stays
// within the gap to the next distinct timestamp, the order holds, the last group takes the gap
// before it, the cap binds, and the same seed gives the same arrivals.
TEST(TraceTest, SpreadArrivalsStayInTheirBinAndInOrder) {
  std::vector<TraceRequest> binned;
  for (int64_t bin : {1000, 4000, 7000}) {
    for (int i = 0; i < 50; ++i) binned.push_back({.timestamp_ms = bin, .output_length = i});
  }
  const std::vector<TraceRequest> spread = SpreadArrivals(binned, 10'000, 7);
  ASSERT_EQ(spread.size(), binned.size());
  std::set<int64_t> distinct;
  for (size_t i = 0; i < spread.size(); ++i) {
    EXPECT_EQ(spread[i].output_length, binned[i].output_length);  // the same request
    EXPECT_GE(spread[i].timestamp_ms, binned[i].timestamp_ms);
    EXPECT_LT(spread[i].timestamp_ms, binned[i].timestamp_ms + 3000) << i;
    if (i > 0) {
      EXPECT_GE(spread[i].timestamp_ms, spread[i - 1].timestamp_ms);
    }
    distinct.insert(spread[i].timestamp_ms);
  }
  EXPECT_GT(distinct.size(), 100u);                  // spread, not moved as a block
  EXPECT_GT(spread[149].timestamp_ms, 7000 + 1500);  // the last bin spread as wide
  EXPECT_EQ(SpreadArrivals(binned, 10'000, 7)[60].timestamp_ms, spread[60].timestamp_ms);
  for (const TraceRequest& r : SpreadArrivals(binned, 20, 7)) {
    EXPECT_LT(r.timestamp_ms % 3000, 1000 + 20) << "the cap";
  }
  EXPECT_EQ(SpreadArrivals({binned[0], binned[1]}, 10'000, 7)[1].timestamp_ms, 1000);
}

TEST(TraceTest, SharedHashIdsGiveSharedTokens) {
  ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> t, ParseTrace(kTwo, "example"));
  const std::vector<int32_t> a = TracePrompt(t[0], {});
  const std::vector<int32_t> b = TracePrompt(t[1], {});
  ASSERT_EQ(a.size(), 6955u);
  ASSERT_EQ(b.size(), 6472u);
  // The first 12 blocks (6144 tokens) are the same; the 13th differs.
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 6144, b.begin()));
  EXPECT_FALSE(std::equal(a.begin() + 6144, a.begin() + 6144 + 512, b.begin() + 6144));
  for (int32_t id : a) {
    EXPECT_GE(id, 100);
    EXPECT_LT(id, 128000);
  }
  // Blocks within a prompt differ from each other.
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 512, a.begin() + 512));
}

TEST(TraceTest, MalformedLinesNameTheLineAndTheField) {
  const std::string good =
      R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]})";
  const struct {
    std::string line;
    std::string says;
  } cases[] = {
      {"not json", "t.jsonl:2: not a JSON object"},
      {R"({"input_length": 10, "output_length": 1, "hash_ids": [1]})",
       "t.jsonl:2: no \"timestamp\""},
      {R"({"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": []})",
       "\"input_length\" must be an integer >= 0, got -3"},
      {R"({"timestamp": 5, "input_length": 10, "output_length": "x", "hash_ids": [1]})",
       "\"output_length\" must be an integer >= 0"},
      {R"({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": 7})",
       "\"hash_ids\" must be an array"},
      {R"({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["a"]})",
       "holds \"a\", not an integer"},
      {R"({"timestamp": 5, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]})",
       "2 hash_ids for input_length 1025 (blocks of 512 tokens need 3)"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(ParseTrace(good + "\n" + c.line + "\n", "t.jsonl"),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.says)))
        << c.line;
  }
  EXPECT_THAT(
      ParseTrace(R"({"timestamp": 9, "input_length": 10, "output_length": 1, "hash_ids": [1]})"
                 "\n\n" +
                     good,
                 "t.jsonl"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("t.jsonl:3: timestamp 0 is before the previous line's 9")));
  EXPECT_THAT(ReadTrace("/nonexistent/trace.jsonl"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/trace.jsonl")));
}

// Every request of a session resends its previous request's full blocks (the partial last block
// is new), and the shapes come out the same for a seed.
TEST(GenerateTraceTest, SessionsGrowTheirContextAndKeepTheirFullBlocks) {
  for (const char* shape : {"multi-turn", "agent"}) {
    ShapeOptions o{.shape = shape, .duration_s = 60, .rate = 0.2, .min_turns = 3, .max_turns = 5};
    ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> t, GenerateTrace(o));
    ASSERT_GT(t.size(), 5u) << shape;
    ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> again, GenerateTrace(o));
    ASSERT_EQ(again.size(), t.size());
    int continued = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ(t[i].hash_ids, again[i].hash_ids);
      EXPECT_EQ(static_cast<int64_t>(t[i].hash_ids.size()), (t[i].input_length + 511) / 512);
      if (i > 0) {
        EXPECT_GE(t[i].timestamp_ms, t[i - 1].timestamp_ms);
      }
      // The earlier request whose full blocks this one starts with, if any.
      for (size_t j = 0; j < i; ++j) {
        const size_t full = static_cast<size_t>(t[j].input_length / 512);
        if (full > 0 && t[i].input_length > t[j].input_length &&
            std::equal(t[j].hash_ids.begin(), t[j].hash_ids.begin() + full,
                       t[i].hash_ids.begin())) {
          ++continued;
          break;
        }
      }
    }
    EXPECT_GT(continued, static_cast<int>(t.size()) / 2) << shape;
  }
}

TEST(GenerateTraceTest, SystemPromptsAreSharedWholeAndQuestionsAreNot) {
  ASSERT_OK_AND_ASSIGN(std::vector<TraceRequest> t, GenerateTrace({.shape = "system-prompts",
                                                                   .duration_s = 20,
                                                                   .rate = 5,
                                                                   .system_prompts = 2,
                                                                   .system_prompt_len = 2048}));
  std::set<std::vector<int64_t>> prefixes;
  std::set<int64_t> tails;
  for (const TraceRequest& r : t) {
    prefixes.insert(std::vector<int64_t>(r.hash_ids.begin(), r.hash_ids.begin() + 4));
    for (size_t i = 4; i < r.hash_ids.size(); ++i) EXPECT_TRUE(tails.insert(r.hash_ids[i]).second);
  }
  EXPECT_EQ(prefixes.size(), 2u);
  EXPECT_THAT(GenerateTrace({.shape = "storm"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'storm'")));
}

}  // namespace
}  // namespace kvserve::trace
