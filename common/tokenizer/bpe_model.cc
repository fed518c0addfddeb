#include "common/tokenizer/bpe_model.h"

#include <climits>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/byte_level.h"

namespace kvserve::tokenizer {
namespace {

// Words longer than this use the O(n log n) heap merge; shorter ones a linear scan, which is
// faster for the few-byte words that dominate real text.
constexpr size_t kScanLimit = 48;

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    StringMap<int> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
    const BpeOptions& options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->options_ = options;
  model->byte_ids_.fill(-1);
  model->fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(std::string(1, static_cast<char>(b)));
    if (it != vocab.end()) model->byte_ids_[b] = it->second;
    auto fb = vocab.find(absl::StrFormat("<0x%02X>", b));
    if (fb != vocab.end()) model->fallback_ids_[b] = fb->second;
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab.find(left);
    auto r = vocab.find(right);
    auto m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
      std::string shown_left, shown_right;
      BytesToByteLevel(left, &shown_left);
      BytesToByteLevel(right, &shown_right);
      return absl::InvalidArgumentError(
          absl::StrCat("merge ", rank, " ('", shown_left, "' '", shown_right,
                       "') uses a token that is not in the vocabulary"));
    }
    // The first occurrence of a pair wins, as in Hugging Face tokenizers.
    model->merges_.try_emplace(PairKey(l->second, r->second),
                               Merge{static_cast<int>(rank), m->second});
  }
  model->vocab_ = std::move(vocab);
  return model;
}

absl::Status BpeModel::AppendInitialSymbols(std::string_view word,
                                            std::vector<int>* symbols) const {
  for (char ch : word) {
    const auto b = static_cast<uint8_t>(ch);
    if (byte_ids_[b] >= 0) {
      symbols->push_back(byte_ids_[b]);
      continue;
    }
    // Byte fallback spells the missing character's UTF-8 bytes; the character here is the
    // byte's byte-level code point, as the file stores it.
    if (options_.byte_fallback) {
      std::string utf8;
      BytesToByteLevel(std::string_view(&ch, 1), &utf8);
      bool all = true;
      for (char u : utf8) all = all && fallback_ids_[static_cast<uint8_t>(u)] >= 0;
      if (all) {
        for (char u : utf8) symbols->push_back(fallback_ids_[static_cast<uint8_t>(u)]);
        continue;
      }
    }
    if (options_.unk_id) {
      symbols->push_back(*options_.unk_id);
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("byte 0x%02X has no token and the tokenizer has no unk_token", b));
  }
  return absl::OkStatus();
}

absl::Status BpeModel::EncodeWord(std::string_view word, std::vector<int>* out) const {
  if (word.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      return absl::OkStatus();
    }
  }
  std::vector<int> symbols;
  symbols.reserve(word.size());
  if (absl::Status s = AppendInitialSymbols(word, &symbols); !s.ok()) return s;
  if (symbols.size() <= kScanLimit) {
    MergeWithScan(&symbols);
  } else {
    MergeWithHeap(&symbols);
  }
  out->insert(out->end(), symbols.begin(), symbols.end());
  return absl::OkStatus();
}

void BpeModel::MergeWithScan(std::vector<int>* symbols) const {
  std::vector<int>& s = *symbols;
  if (s.size() < 2) return;
  // ranks[i]: rank of the pair (s[i], s[i+1]), INT_MAX when it does not merge.
  std::vector<const Merge*> pair(s.size() - 1);
  for (size_t i = 0; i + 1 < s.size(); ++i) pair[i] = FindMerge(s[i], s[i + 1]);
  while (!pair.empty()) {
    int best_rank = INT_MAX;
    size_t best = 0;
    for (size_t i = 0; i < pair.size(); ++i) {
      if (pair[i] != nullptr && pair[i]->rank < best_rank) {
        best_rank = pair[i]->rank;
        best = i;
      }
    }
    if (best_rank == INT_MAX) break;
    s[best] = pair[best]->new_id;
    s.erase(s.begin() + best + 1);
    pair.erase(pair.begin() + best);
    if (best > 0) pair[best - 1] = FindMerge(s[best - 1], s[best]);
    if (best < pair.size()) pair[best] = FindMerge(s[best], s[best + 1]);
  }
}

void BpeModel::MergeWithHeap(std::vector<int>* symbols) const {
  std::vector<int>& s = *symbols;
  const int n = static_cast<int>(s.size());
  if (n < 2) return;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int rank;
    int pos;   // index of the left symbol
    int left;  // ids when pushed, to detect stale entries
    int right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const Merge* m = FindMerge(s[pos], s[next[pos]])) {
      heap.push({m->rank, pos, s[pos], s[next[pos]]});
    }
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int right = next[c.pos];
    if (!alive[c.pos] || right < 0 || s[c.pos] != c.left || s[right] != c.right) continue;
    s[c.pos] = FindMerge(c.left, c.right)->new_id;
    alive[right] = false;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  int w = 0;
  for (int i = 0; i < n; ++i) {
    if (alive[i]) s[w++] = s[i];
  }
  s.resize(w);
}

}  // namespace kvserve::tokenizer
