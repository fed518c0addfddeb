// Helpers for engine tests: build an engine on a fixture model, run requests to completion
// and collect each sample's tokens and logprobs, compare greedy paths up to near-ties.
#ifndef KVSERVE_TESTS_WORKER_ENGINE_TEST_UTIL_H_
#define KVSERVE_TESTS_WORKER_ENGINE_TEST_UTIL_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine.h"

namespace kvserve::worker::testing {

struct SampleResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishReason finish = FinishReason::kNone;
  int num_cached_prompt_tokens = 0;
  std::vector<float> prompt_logits;
  std::vector<TokenLogprobs> prompt_logprobs;  // on sample 0
};
// request id -> sample index -> result
using Results = std::map<std::string, std::map<int, SampleResult>>;

EngineConfig FixtureConfig(const std::string& model, int num_blocks = 512);
// The engine, or null after failing the calling test with Create's error.
std::unique_ptr<Engine> MakeEngine(const EngineConfig& config, const RunnerTestHooks& hooks = {});

// Steps until the engine is idle (or `max_steps`), checking invariants after every step when
// asked. Fails the test on an error.
Results RunToCompletion(Engine& engine, bool check_invariants = false, int max_steps = 100000);

// Greedy request with top-2 logprobs (for margins).
RequestInput GreedyRequest(const std::string& id, std::vector<int32_t> prompt, int max_tokens);

// Number of leading tokens on which `a` and `b` agree, counting past a disagreement only if it
// happens where `a`'s top-2 margin is below `near_tie` (then comparison stops there, as the
// fixtures' README prescribes). Returns {agreed, stopped_at_near_tie}.
// Every sample of `want` in `got` too: the same tokens, logprobs within `tolerance`.
void ExpectSameSamples(Results& got, const Results& want, double tolerance = 1e-3);
std::pair<int, bool> GreedyAgreement(const SampleResult& a, const std::vector<int32_t>& b,
                                     float near_tie = 1e-3f);

// max |ours - ref| / max |ref|: the fixtures README's logit comparison.
double RelativeError(const std::vector<float>& ours, const std::vector<float>& ref);

// A fixture's transformers reference: prompts, greedy continuations, prompt logits.
struct Reference {
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> logits;
};
// The reference of the fixture in `dir`; InvalidArgument naming the file that is missing or
// malformed.
absl::StatusOr<Reference> ReadReference(const std::string& dir);
// ReadReference of a fixture by name; an error fails the calling test and gives no prompts.
Reference LoadReference(const std::string& model);
// Whether the fixture in `dir` loads: both configs, the weights, the reference. Every binary
// linking these helpers checks each fixture so before its first test and fails naming the file.
absl::Status CheckFixtureModel(const std::string& dir);
// Adds every reference prompt as a request, keyed by the prompt's index (greedy, as long as the
// reference continuation, prompt logits returned); returns the decode steps the longest takes.
int64_t AddReferenceRequests(Engine& engine, const Reference& ref);
// Every reference prompt through an engine made from `config` (greedy, as long as the reference
// continuation, prompt logits returned); results keyed by the prompt's index.
Results RunReference(const EngineConfig& config, const Reference& ref,
                     const RunnerTestHooks& hooks = {});
// Each prompt's logits within 1e-4 (relative) of the reference and its greedy continuation
// equal to the reference's (or diverging only at a near tie).
void ExpectMatchesReference(Results& results, const Reference& ref);

// How closely reduced-precision weights track the reference over every prompt position: the
// share of positions whose top-1 token agrees, and KL(reference ‖ ours) of the softmaxes.
struct DistributionMatch {
  int64_t positions = 0;
  double top1 = 0, mean_kl = 0, max_kl = 0;
};
DistributionMatch CompareDistributions(const Results& results, const Reference& ref);

}  // namespace kvserve::worker::testing

#endif  // KVSERVE_TESTS_WORKER_ENGINE_TEST_UTIL_H_
