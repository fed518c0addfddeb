#include "worker/constraints.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"

namespace kvserve::worker {

using structured::GrammarMatcher;

Constraints::Constraints(std::string model_dir, int32_t model_vocab, std::vector<int32_t> eos_ids,
                         size_t max_cached)
    : model_dir_(std::move(model_dir)),
      model_vocab_(model_vocab),
      eos_ids_(std::move(eos_ids)),
      max_cached_(max_cached) {}

absl::Status Constraints::LoadVocabulary() {
  if (trie_ != nullptr) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromDirectory(model_dir_);
  if (!tok.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("structured outputs need the model's tokenizer: ", tok.status().message()));
  }
  vocab_ = structured::VocabularyBytes(**tok);
  vocab_.resize(model_vocab_);   // ids past the tokenizer's are never allowed
  for (int32_t id : eos_ids_) {  // EOS only ends the text, where the automaton accepts
    if (id >= 0 && id < model_vocab_) vocab_[id].clear();
  }
  trie_ = std::make_unique<structured::TokenTrie>(vocab_);
  tokenizer_ = *std::move(tok);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<CompiledConstraint>> Constraints::Compile(
    const structured::ConstraintSpec& spec) {
  RETURN_IF_ERROR(LoadVocabulary());
  const std::string key = spec.Key();
  if (auto it = cache_.find(key); it != cache_.end()) {
    if (it->second->second->matcher.size() <= CompiledConstraint::kMaxMatcherSize) {
      lru_.splice(lru_.end(), lru_, it->second);
      ++counters_.reused;
      return it->second->second;
    }
    lru_.erase(it->second);  // grown too large: compiled afresh below
    cache_.erase(it);
  }
  ASSIGN_OR_RETURN(structured::Grammar grammar, structured::CompileConstraint(spec));
  ++counters_.compiled;
  auto compiled = std::make_shared<CompiledConstraint>(std::move(grammar));
  compiled->mask_words = (model_vocab_ + 31) / 32;
  lru_.emplace_back(key, compiled);
  cache_[key] = std::prev(lru_.end());
  if (lru_.size() > max_cached_) {  // requests still running keep theirs
    cache_.erase(lru_.front().first);
    lru_.pop_front();
  }
  return compiled;
}

std::shared_ptr<const structured::TokenMask> Constraints::Cached(CompiledConstraint& c,
                                                                 GrammarMatcher::State state) {
  const auto it = c.masks.find(state);
  if (it == c.masks.end()) return nullptr;
  ++counters_.masks_reused;
  return it->second;
}

std::shared_ptr<const structured::TokenMask> Constraints::Mask(CompiledConstraint& c,
                                                               GrammarMatcher::State state) {
  if (std::shared_ptr<const structured::TokenMask> known = Cached(c, state)) return known;
  const auto start = std::chrono::steady_clock::now();
  auto mask = std::make_shared<structured::TokenMask>(trie_->Allowed(c.matcher, state));
  counters_.mask_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ++counters_.masks_walked;
  if (c.matcher.accepting(state)) {
    for (int32_t id : eos_ids_) {
      if (id >= 0 && id < model_vocab_) mask->Set(id);
    }
  }
  if (c.masks.size() >= CompiledConstraint::kMaxMasks) {  // sequences keep theirs
    c.masks.clear();
    c.forced.clear();
  }
  c.masks.emplace(state, mask);
  return mask;
}

namespace {

// The bytes the grammar forces from `s`: each the only one with a move, until the grammar
// accepts (EOS is a choice there), offers two bytes, or `max` bytes.
std::string ForcedBytes(GrammarMatcher& m, GrammarMatcher::State s, size_t max) {
  std::string forced;
  while (forced.size() < max && s != GrammarMatcher::kDead && !m.accepting(s)) {
    int only = -1;
    for (int b = 0; b < 256 && only != -2; ++b) {
      if (m.Next(s, static_cast<uint8_t>(b)) != GrammarMatcher::kDead) only = only < 0 ? b : -2;
    }
    if (only < 0) break;
    forced += static_cast<char>(only);
    s = m.Next(s, static_cast<uint8_t>(only));
  }
  // Whole characters only: the tokenizer takes UTF-8.
  size_t end = forced.size();
  while (end > 0 && (static_cast<uint8_t>(forced[end - 1]) & 0xC0) == 0x80) --end;
  if (end > 0 && static_cast<uint8_t>(forced[end - 1]) >= 0xC0) {
    const uint8_t lead = static_cast<uint8_t>(forced[end - 1]);
    const size_t len = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (forced.size() - (end - 1) < len) forced.resize(end - 1);
  }
  return forced;
}

}  // namespace

std::vector<int32_t> Constraints::ForcedTokens(CompiledConstraint& c, GrammarMatcher::State state) {
  constexpr size_t kMaxForcedBytes = 512;
  if (auto it = c.forced.find(state); it != c.forced.end()) return it->second;
  std::vector<int32_t>& tokens = c.forced[state];
  const std::string text = ForcedBytes(c.matcher, state, kMaxForcedBytes);
  if (text.empty() || tokenizer_ == nullptr) return tokens;
  absl::StatusOr<std::vector<int>> ids = tokenizer_->Encode(text, /*add_special_tokens=*/false);
  if (!ids.ok() || ids->size() < 2) return tokens;
  GrammarMatcher::State s = state;
  for (size_t i = 0; i + 1 < ids->size(); ++i) {  // the last one is the model's to draw
    s = Advance(c, s, (*ids)[i]);
    if (s == GrammarMatcher::kDead) break;
    tokens.push_back((*ids)[i]);
  }
  return tokens;
}

GrammarMatcher::State Constraints::Advance(CompiledConstraint& c, GrammarMatcher::State state,
                                           int32_t token) const {
  if (token < 0 || token >= model_vocab_ || vocab_[token].empty()) return GrammarMatcher::kDead;
  return c.matcher.Walk(state, vocab_[token]);
}

}  // namespace kvserve::worker
