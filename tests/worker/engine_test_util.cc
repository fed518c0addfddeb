#include "tests/worker/engine_test_util.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/model/safetensors.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::worker::testing {

EngineConfig FixtureConfig(const std::string& model, int num_blocks) {
  EngineConfig c;
  c.model_dir = kvserve::testing::FixtureModel(model);
  c.cache.num_blocks = num_blocks;
  c.max_model_len = 1024;
  return c;
}

std::unique_ptr<Engine> MakeEngine(const EngineConfig& config, const RunnerTestHooks& hooks) {
  absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(config, hooks);
  EXPECT_OK(e);
  return e.ok() ? *std::move(e) : nullptr;
}

Results RunToCompletion(Engine& engine, bool check_invariants, int max_steps) {
  Results results;
  for (int step = 0; engine.HasWork() && step < max_steps; ++step) {
    absl::StatusOr<std::vector<SequenceOutput>> outs = engine.Step();
    EXPECT_OK(outs);
    if (!outs.ok()) break;
    for (SequenceOutput& o : *outs) {
      SampleResult& r = results[o.request_id][o.sample_index];
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.logprobs.insert(r.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      if (o.finish_reason != FinishReason::kNone) r.finish = o.finish_reason;
      r.num_cached_prompt_tokens = o.num_cached_prompt_tokens;
      if (!o.prompt_logprobs.empty()) {
        EXPECT_TRUE(results[o.request_id][0].prompt_logprobs.empty()) << "sent twice";
        results[o.request_id][0].prompt_logprobs = std::move(o.prompt_logprobs);
      }
      if (o.request_finished && !o.prompt_logits.empty()) {
        results[o.request_id][0].prompt_logits = std::move(o.prompt_logits);
      }
    }
    if (check_invariants) {
      absl::Status s = engine.TEST_CheckInvariants();
      EXPECT_OK(s) << "after step " << step;
      if (!s.ok()) break;
    }
  }
  EXPECT_FALSE(engine.HasWork()) << "engine did not finish in " << max_steps << " steps";
  return results;
}

RequestInput GreedyRequest(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  RequestInput in;
  in.request_id = id;
  in.prompt = std::move(prompt);
  in.max_tokens = max_tokens;
  in.sampling.logprobs = 2;
  in.sampling.ignore_eos = true;
  return in;
}

void ExpectSameSamples(Results& got, const Results& want, double tolerance) {
  for (const auto& [id, samples] : want) {
    ASSERT_EQ(got[id].size(), samples.size()) << id;
    for (const auto& [index, sample] : samples) {
      const SampleResult& g = got[id][index];
      EXPECT_EQ(g.tokens, sample.tokens) << id << " sample " << index;
      ASSERT_EQ(g.logprobs.size(), sample.logprobs.size()) << id;
      for (size_t k = 0; k < sample.logprobs.size(); ++k) {
        EXPECT_NEAR(g.logprobs[k].logprob, sample.logprobs[k].logprob, tolerance) << id;
      }
    }
  }
}

std::pair<int, bool> GreedyAgreement(const SampleResult& a, const std::vector<int32_t>& b,
                                     float near_tie) {
  const size_t n = std::min(a.tokens.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (i < a.logprobs.size() && a.logprobs[i].top.size() >= 2) {
      const float margin = a.logprobs[i].top[0].second - a.logprobs[i].top[1].second;
      if (margin < near_tie) return {static_cast<int>(i), true};
    }
    if (a.tokens[i] != b[i]) return {static_cast<int>(i), false};
  }
  return {static_cast<int>(n), false};
}

double RelativeError(const std::vector<float>& ours, const std::vector<float>& ref) {
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, std::fabs(double{ref[i]}));
    max_err = std::max(max_err, std::fabs(double{ours[i]} - ref[i]));
  }
  return max_err / max_ref;
}

DistributionMatch CompareDistributions(const Results& results, const Reference& ref) {
  DistributionMatch m;
  int64_t agree = 0;
  double kl_sum = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const std::vector<float>& ours = results.at(std::to_string(i)).at(0).prompt_logits;
    const std::vector<float>& want = ref.logits[i];
    const size_t n = ref.prompts[i].size(), vocab = want.size() / n;
    EXPECT_EQ(ours.size(), want.size());
    if (ours.size() != want.size()) return m;
    for (size_t p = 0; p < n; ++p) {
      const float* a = want.data() + p * vocab;
      const float* b = ours.data() + p * vocab;
      const auto log_softmax = [vocab](const float* x, std::vector<double>& out) {
        const double max = *std::max_element(x, x + vocab);
        double sum = 0;
        for (size_t v = 0; v < vocab; ++v) sum += std::exp(x[v] - max);
        out.resize(vocab);
        for (size_t v = 0; v < vocab; ++v) out[v] = x[v] - max - std::log(sum);
      };
      std::vector<double> la, lb;
      log_softmax(a, la);
      log_softmax(b, lb);
      double kl = 0;
      for (size_t v = 0; v < vocab; ++v) kl += std::exp(la[v]) * (la[v] - lb[v]);
      kl_sum += kl;
      m.max_kl = std::max(m.max_kl, kl);
      agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
      ++m.positions;
    }
  }
  m.top1 = static_cast<double>(agree) / static_cast<double>(m.positions);
  m.mean_kl = kl_sum / static_cast<double>(m.positions);
  return m;
}

absl::StatusOr<Reference> ReadReference(const std::string& dir) {
  const std::string json_path = dir + "/reference.json";
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(json_path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  const auto is_id_lists = [&](const char* key) {
    if (!j.is_object() || !j.contains(key) || !j[key].is_array()) return false;
    for (const nlohmann::json& list : j[key]) {
      if (!list.is_array()) return false;
      for (const nlohmann::json& id : list) {
        if (!id.is_number_integer()) return false;
      }
    }
    return true;
  };
  if (!is_id_lists("prompts") || !is_id_lists("greedy") ||
      j["prompts"].size() != j["greedy"].size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        json_path, ": needs 'prompts' and 'greedy', lists of token-id lists of the same length"));
  }
  Reference ref;
  ref.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  ref.greedy = j["greedy"].get<std::vector<std::vector<int32_t>>>();
  const std::string logits_path = dir + "/reference_logits.safetensors";
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(logits_path));
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    const std::string name = "logits_" + std::to_string(i);
    auto it = file->tensors().find(name);
    if (it == file->tensors().end() || it->second.shape.size() != 2 ||
        it->second.shape[0] != static_cast<int64_t>(ref.prompts[i].size()) ||
        it->second.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(logits_path, ": needs float32 '", name,
                                                     "' of shape [", ref.prompts[i].size(),
                                                     ", vocab]"));
    }
    ref.logits.push_back(it->second.ToFloat32());
  }
  return ref;
}

Reference LoadReference(const std::string& model) {
  absl::StatusOr<Reference> ref = ReadReference(kvserve::testing::FixtureModel(model));
  EXPECT_OK(ref);
  return ref.ok() ? *std::move(ref) : Reference{};
}

absl::Status CheckFixtureModel(const std::string& dir) {
  RETURN_IF_ERROR(LoadHfConfig(dir + "/config_legacy.json").status());
  RETURN_IF_ERROR(ReadReference(dir).status());
  EngineConfig config;
  config.model_dir = dir;
  config.cache.num_blocks = 64;
  config.max_model_len = 64;
  return Engine::Create(config).status();  // config.json and every weight of model.safetensors
}

namespace {

// Checks every fixture before the first test: a missing or corrupt file fails the run with its
// name, instead of crashing the tests that would have used it.
class FixtureEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    for (const char* model : {"tiny-llama3", "tiny-qwen2", "tiny-qwen3"}) {
      const absl::Status s = CheckFixtureModel(kvserve::testing::FixtureModel(model));
      ASSERT_TRUE(s.ok()) << "fixture " << model << " is unusable: " << s;
    }
  }
};

[[maybe_unused]] ::testing::Environment* const kFixtureEnvironment =
    ::testing::AddGlobalTestEnvironment(new FixtureEnvironment);

}  // namespace

int64_t AddReferenceRequests(Engine& engine, const Reference& ref) {
  int64_t decode_steps = 0;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    RequestInput in =
        GreedyRequest(std::to_string(i), ref.prompts[i], static_cast<int>(ref.greedy[i].size()));
    in.return_prompt_logits = true;
    decode_steps = std::max<int64_t>(decode_steps, in.max_tokens - 1);
    EXPECT_OK(engine.AddRequest(in));
  }
  return decode_steps;
}

Results RunReference(const EngineConfig& config, const Reference& ref,
                     const RunnerTestHooks& hooks) {
  auto engine = MakeEngine(config, hooks);
  EXPECT_NE(engine, nullptr);
  if (engine == nullptr) return {};
  AddReferenceRequests(*engine, ref);
  return RunToCompletion(*engine, /*check_invariants=*/true);
}

void ExpectMatchesReference(Results& results, const Reference& ref) {
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    const SampleResult& r = results[std::to_string(i)][0];
    ASSERT_EQ(r.prompt_logits.size(), ref.logits[i].size());
    EXPECT_LT(RelativeError(r.prompt_logits, ref.logits[i]), 1e-4);
    auto [agreed, near_tie] = GreedyAgreement(r, ref.greedy[i]);
    EXPECT_TRUE(agreed == static_cast<int>(ref.greedy[i].size()) || near_tie)
        << "greedy diverges at " << agreed;
  }
}

}  // namespace kvserve::worker::testing
