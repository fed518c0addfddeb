#include "common/structured/token_mask.h"

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

namespace kvserve::structured {

int32_t TokenMask::Count() const {
  int32_t n = 0;
  for (uint32_t w : words) n += std::popcount(w);
  return n;
}

std::vector<std::string> VocabularyBytes(const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::string> out(tokenizer.vocab_size());
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsValidId(id) && !tokenizer.IsSpecial(id)) out[id] = tokenizer.TokenBytes(id);
  }
  return out;
}

// Built breadth-first from the ids sorted by their bytes: the tokens under a node are one run
// of that order, so a node's children are found by splitting its run on the next byte, and
// every node's children are stored next to each other.
TokenTrie::TokenTrie(const std::vector<std::string>& tokens)
    : vocab_size_(static_cast<int32_t>(tokens.size())) {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    if (!tokens[id].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return tokens[a] != tokens[b] ? tokens[a] < tokens[b] : a < b;
  });
  struct Pending {
    int32_t node;
    size_t depth, begin, end;  // the run of `order` below the node
  };
  nodes_.emplace_back();
  edge_byte_.push_back(0);
  std::vector<Pending> level = {{0, 0, 0, order.size()}}, next;
  while (!level.empty()) {
    next.clear();
    for (const Pending& p : level) {
      size_t i = p.begin;
      Node& node = nodes_[p.node];
      node.first_token = static_cast<int32_t>(token_ids_.size());
      for (; i < p.end && tokens[order[i]].size() == p.depth; ++i) token_ids_.push_back(order[i]);
      node.num_tokens = static_cast<int32_t>(token_ids_.size()) - node.first_token;
      nodes_[p.node].first_child = static_cast<int32_t>(nodes_.size());
      while (i < p.end) {
        const char byte = tokens[order[i]][p.depth];
        size_t j = i;
        while (j < p.end && tokens[order[j]][p.depth] == byte) ++j;
        const auto child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        edge_byte_.push_back(static_cast<uint8_t>(byte));
        ++nodes_[p.node].num_children;
        next.push_back({child, p.depth + 1, i, j});
        i = j;
      }
    }
    std::swap(level, next);
  }
  IndexSubtrees();
}

void TokenTrie::IndexSubtrees() {
  // Children come after their parents, so a backward pass sees every child first.
  for (size_t n = nodes_.size(); n-- > 0;) {
    Node& node = nodes_[n];
    node.plain_depth = 0;
    for (int32_t c = node.first_child; c < node.first_child + node.num_children; ++c) {
      const int32_t below = nodes_[c].plain_depth;
      if (below < 0 || !IsPlain(edge_byte_[c]) || node.plain_depth < 0) {
        node.plain_depth = -1;
      } else {
        node.plain_depth = std::max(node.plain_depth, below + 1);
      }
    }
    max_plain_depth_ = std::max(max_plain_depth_, node.plain_depth);
  }
  // Depth first, so that each subtree's tokens are one run.
  subtree_ids_.reserve(token_ids_.size());
  std::vector<std::pair<int32_t, bool>> stack = {{0, false}};  // node, children done
  while (!stack.empty()) {
    auto [at, done] = stack.back();
    stack.pop_back();
    Node& node = nodes_[at];
    if (done) {
      node.subtree_end = static_cast<int32_t>(subtree_ids_.size());
      continue;
    }
    node.subtree_begin = static_cast<int32_t>(subtree_ids_.size());
    subtree_ids_.insert(subtree_ids_.end(), token_ids_.begin() + node.first_token,
                        token_ids_.begin() + node.first_token + node.num_tokens);
    stack.emplace_back(at, true);
    for (int32_t c = node.first_child + node.num_children; c-- > node.first_child;) {
      stack.emplace_back(c, false);
    }
  }
}

}  // namespace kvserve::structured
