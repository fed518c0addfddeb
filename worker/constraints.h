// Structured-outputs constraints on the engine thread (docs/STRUCTURED_OUTPUTS.md): each
// request's constraint compiled once (shared by the requests that send the same source, a
// bounded cache), the vocabulary trie built from the model's tokenizer.json on first use, and
// per matcher state the allowed-token mask, sized for the model's vocabulary, with EOS allowed
// exactly where the grammar accepts.
//
//   ASSIGN_OR_RETURN(auto c, constraints.Compile(spec));       // AddRequest
//   seq.constraint_state = c->matcher.start();
//   seq.allowed_mask = constraints.Mask(*c, seq.constraint_state);
//   ... after each token: state = constraints.Advance(*c, state, token)
//
// Not thread-safe: one thread at a time (the engine's, or rank 0's while the engine thread
// waits for the step: Engine fills a step's masks from there).
#ifndef KVSERVE_WORKER_CONSTRAINTS_H_
#define KVSERVE_WORKER_CONSTRAINTS_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/structured/constraint.h"
#include "common/structured/token_mask.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::worker {

struct CompiledConstraint {
  explicit CompiledConstraint(structured::Grammar g)
      : matcher(std::make_shared<const structured::Grammar>(std::move(g))) {}
  structured::GrammarMatcher matcher;  // shared by the requests with this constraint
  int32_t mask_words = 0;              // the words of one of its masks (the model's vocabulary)
  // The masks of the states met so far (at most kMaxMasks: emptied when full).
  static constexpr size_t kMaxMasks = 1024;
  absl::flat_hash_map<structured::GrammarMatcher::State,
                      std::shared_ptr<const structured::TokenMask>>
      masks;
  // ForcedTokens' answers by state (emptied with the masks).
  absl::flat_hash_map<structured::GrammarMatcher::State, std::vector<int32_t>> forced;
  // Past this many memoized stacks and states, later requests compile the constraint afresh
  // (the running ones keep this one), so that one matcher's memory stays bounded.
  static constexpr int64_t kMaxMatcherSize = 100'000;  // ~1 KiB of moves per state
};

class Constraints {
 public:
  // `model_dir`: where tokenizer.json is; `model_vocab`: the logits' width; `eos_ids`: the
  // model's, allowed in accepting states. Keeps at most `max_cached` compiled constraints.
  Constraints(std::string model_dir, int32_t model_vocab, std::vector<int32_t> eos_ids,
              size_t max_cached = 256);

  // Reads the tokenizer and builds the vocabulary trie now (a worker does it at start-up, so
  // that the first constrained request does not wait for it). FailedPrecondition when the model
  // has no usable tokenizer (then constrained requests are refused).
  absl::Status LoadVocabulary();

  // The compiled form of `spec`. FailedPrecondition when the model has no usable tokenizer;
  // InvalidArgument / ResourceExhausted from compiling.
  absl::StatusOr<std::shared_ptr<CompiledConstraint>> Compile(
      const structured::ConstraintSpec& spec);

  // The tokens allowed from `state` (a live state of c's matcher).
  std::shared_ptr<const structured::TokenMask> Mask(CompiledConstraint& c,
                                                    structured::GrammarMatcher::State state);
  // The mask of `state` if it was computed before, else null (nothing computed).
  std::shared_ptr<const structured::TokenMask> Cached(CompiledConstraint& c,
                                                      structured::GrammarMatcher::State state);
  // Jump-forward decoding: the tokens that spell the text the grammar forces from `state` (each
  // byte the only one allowed, up to where it accepts or offers a choice, at most 512 bytes),
  // as the model's tokenizer writes that text alone, less its last token (the text after it
  // may merge with it: the model draws that one), each checked against the grammar. Empty when
  // fewer than two tokens are forced.
  std::vector<int32_t> ForcedTokens(CompiledConstraint& c, structured::GrammarMatcher::State state);
  // The state after `token` (kDead for a token that leaves the language, e.g. EOS).
  [[nodiscard]] structured::GrammarMatcher::State Advance(CompiledConstraint& c,
                                                          structured::GrammarMatcher::State state,
                                                          int32_t token) const;

  struct Counters {
    int64_t compiled = 0;      // constraints compiled (cache misses)
    int64_t reused = 0;        // constraints found compiled (cache hits)
    int64_t masks_walked = 0;  // masks computed by a trie walk
    int64_t masks_reused = 0;  // masks found in a constraint's cache
    double mask_seconds = 0;   // time in the walks
  };
  [[nodiscard]] const Counters& counters() const { return counters_; }

 private:
  std::string model_dir_;
  int32_t model_vocab_;
  std::vector<int32_t> eos_ids_;
  size_t max_cached_;
  std::vector<std::string> vocab_;  // token bytes, model_vocab_ entries (empty: never allowed)
  std::unique_ptr<structured::TokenTrie> trie_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;  // ForcedTokens' text into tokens
  // Least recently used last; the map points into the list.
  std::list<std::pair<std::string, std::shared_ptr<CompiledConstraint>>> lru_;
  absl::flat_hash_map<std::string, decltype(lru_)::iterator> cache_;
  Counters counters_;
};

}  // namespace kvserve::worker

#endif  // KVSERVE_WORKER_CONSTRAINTS_H_
