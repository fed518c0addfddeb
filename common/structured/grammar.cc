#include "common/structured/grammar.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::structured {
namespace {

void IndexByteMoves(Grammar& g) {
  g.state_base.clear();
  g.has_byte_move.clear();
  for (const RuleDfa& r : g.rules) {
    g.state_base.push_back(static_cast<int32_t>(g.has_byte_move.size()));
    for (Dfa::State s = 0; s < r.dfa.num_states(); ++s) {
      bool any = false;
      for (int b = 0; b < 256 && !any; ++b)
        any = r.dfa.Next(s, static_cast<uint8_t>(b)) != Dfa::kDead;
      g.has_byte_move.push_back(any);
    }
  }
}

// The states of `r` reachable from its start by calls of rules in `through` alone (no bytes).
std::vector<Dfa::State> ReachedWithoutBytes(const RuleDfa& r, const std::vector<bool>& through) {
  std::vector<bool> seen(r.dfa.num_states());
  std::vector<Dfa::State> out = {r.dfa.start()}, stack = {r.dfa.start()};
  seen[r.dfa.start()] = true;
  while (!stack.empty()) {
    const Dfa::State s = stack.back();
    stack.pop_back();
    for (const CallEdge& c : r.calls[s]) {
      if (through[c.rule] && !seen[c.to]) {
        seen[c.to] = true;
        out.push_back(c.to);
        stack.push_back(c.to);
      }
    }
  }
  return out;
}

// Rules that can match the empty string.
std::vector<bool> Nullable(const Grammar& g) {
  std::vector<bool> nullable(g.rules.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      if (nullable[r]) continue;
      for (Dfa::State s : ReachedWithoutBytes(g.rules[r], nullable)) {
        if (g.rules[r].dfa.accepting(s)) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

// Whether `r` reaches acceptance with bytes and calls of `productive` rules only.
bool Productive(const RuleDfa& r, const std::vector<bool>& productive) {
  std::vector<bool> seen(r.dfa.num_states());
  std::vector<Dfa::State> stack = {r.dfa.start()};
  seen[r.dfa.start()] = true;
  auto visit = [&](Dfa::State t) {
    if (t != Dfa::kDead && !seen[t]) seen[t] = true, stack.push_back(t);
  };
  while (!stack.empty()) {
    const Dfa::State s = stack.back();
    stack.pop_back();
    if (r.dfa.accepting(s)) return true;
    for (int b = 0; b < 256; ++b) visit(r.dfa.Next(s, static_cast<uint8_t>(b)));
    for (const CallEdge& c : r.calls[s]) {
      if (productive[c.rule]) visit(c.to);
    }
  }
  return false;
}

absl::Status CheckProductive(const Grammar& g) {
  std::vector<bool> productive(g.rules.size());
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < g.rules.size(); ++r) {
      if (!productive[r] && Productive(g.rules[r], productive)) productive[r] = changed = true;
    }
  }
  for (size_t r = 0; r < g.rules.size(); ++r) {
    if (!productive[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule '", g.names[r], "' matches no finite string"));
    }
  }
  return absl::OkStatus();
}

// Refuses a rule that can call itself before any byte (the matcher's closure would not end).
absl::Status CheckNoLeftRecursion(const Grammar& g) {
  const std::vector<bool> nullable = Nullable(g);
  const size_t n = g.rules.size();
  std::vector<std::vector<int32_t>> first_calls(n);
  for (size_t r = 0; r < n; ++r) {
    for (Dfa::State s : ReachedWithoutBytes(g.rules[r], nullable)) {
      for (const CallEdge& c : g.rules[r].calls[s]) first_calls[r].push_back(c.rule);
    }
  }
  // Depth-first search for a cycle: 0 unvisited, 1 on the path, 2 done.
  std::vector<int> mark(n, 0);
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t root = 0; root < n; ++root) {
    if (mark[root] != 0) continue;
    path.emplace_back(static_cast<int32_t>(root), 0);
    mark[root] = 1;
    while (!path.empty()) {
      auto& [r, k] = path.back();
      if (k == first_calls[r].size()) {
        mark[r] = 2;
        path.pop_back();
        continue;
      }
      const int32_t callee = first_calls[r][k++];
      if (mark[callee] == 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("rule '", g.names[callee], "' is left-recursive"));
      }
      if (mark[callee] == 0) mark[callee] = 1, path.emplace_back(callee, 0);
    }
  }
  return absl::OkStatus();
}

}  // namespace

Grammar SingleRuleGrammar(Dfa dfa) {
  Grammar g;
  std::vector<std::vector<CallEdge>> calls(dfa.num_states());
  g.rules.push_back(RuleDfa{std::move(dfa), std::move(calls)});
  g.names.emplace_back("root");
  IndexByteMoves(g);
  return g;
}

Grammar PrefixedGrammar(Grammar g, const Dfa& prefix) {
  // The prefix's states, and one more past the call of g's root: the only accepting one.
  const Dfa::State done = prefix.num_states();
  std::vector<Dfa::State> next(static_cast<size_t>(done + 1) * 256, Dfa::kDead);
  std::vector<bool> accepting(done + 1, false);
  std::vector<std::vector<CallEdge>> calls(done + 1);
  accepting[done] = true;
  for (Dfa::State s = 0; s < done; ++s) {
    for (int b = 0; b < 256; ++b) next[s * 256 + b] = prefix.Next(s, static_cast<uint8_t>(b));
    if (prefix.accepting(s)) calls[s].push_back({g.root, done});
  }
  g.rules.push_back(
      RuleDfa{Dfa(std::move(next), std::move(accepting), prefix.start()), std::move(calls)});
  g.names.emplace_back("prefix");
  g.root = static_cast<int32_t>(g.rules.size()) - 1;
  IndexByteMoves(g);
  return g;
}

int32_t GrammarBuilder::Declare(std::string name) {
  names_.push_back(std::move(name));
  bodies_.emplace_back();
  defined_.push_back(false);
  return num_rules() - 1;
}

void GrammarBuilder::Define(int32_t rule, Nfa::Fragment body) {
  bodies_[rule] = body;
  defined_[rule] = true;
}

absl::StatusOr<Grammar> GrammarBuilder::Build(int32_t root) && {
  Grammar g;
  g.root = root;
  int64_t total = 0;
  Nfa::Determinizer determinizer(nfa_);
  for (int32_t r = 0; r < num_rules(); ++r) {
    if (!defined_[r]) {
      return absl::InvalidArgumentError(absl::StrCat("rule '", names_[r], "' is not defined"));
    }
    absl::StatusOr<RuleDfa> dfa = determinizer.Run(bodies_[r], limits_.max_rule_states,
                                                   limits_.max_work - determinizer.total_work());
    if (!dfa.ok()) {
      return absl::Status(dfa.status().code(),
                          absl::StrCat("rule '", names_[r], "': ", dfa.status().message()));
    }
    total += dfa->dfa.num_states();
    if (total > limits_.max_total_states) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the grammar is too large: its automata pass ", limits_.max_total_states, " states"));
    }
    g.rules.push_back(*std::move(dfa));
  }
  g.names = std::move(names_);
  RETURN_IF_ERROR(CheckProductive(g));
  RETURN_IF_ERROR(CheckNoLeftRecursion(g));
  IndexByteMoves(g);
  return g;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, int32_t max_depth)
    : grammar_(std::move(grammar)), max_depth_(max_depth) {
  start_ = Close({InternNode(grammar_->root, grammar_->rules[grammar_->root].dfa.start(), -1)});
}

int32_t GrammarMatcher::InternNode(int32_t rule, Dfa::State state, int32_t parent) {
  auto [it, added] =
      node_ids_.try_emplace({rule, state, parent}, static_cast<int32_t>(nodes_.size()));
  if (added) {
    nodes_.push_back({rule, state, parent, parent < 0 ? 1 : nodes_[parent].depth + 1});
  }
  return it->second;
}

GrammarMatcher::State GrammarMatcher::Close(std::vector<int32_t> seeds) {
  absl::flat_hash_set<int32_t> seen;
  std::vector<int32_t> tops;
  bool accepting = false;
  while (!seeds.empty()) {
    const int32_t n = seeds.back();
    seeds.pop_back();
    if (!seen.insert(n).second) continue;
    const Node node = nodes_[n];
    const RuleDfa& rule = grammar_->rules[node.rule];
    if (grammar_->HasByteMove(node.rule, node.state)) tops.push_back(n);
    if (node.depth < max_depth_) {
      for (const CallEdge& c : rule.calls[node.state]) {
        const int32_t ret = InternNode(node.rule, c.to, node.parent);
        seeds.push_back(InternNode(c.rule, grammar_->rules[c.rule].dfa.start(), ret));
      }
    }
    if (rule.dfa.accepting(node.state)) {
      if (node.parent < 0) {
        accepting = true;
      } else {
        seeds.push_back(node.parent);
      }
    }
  }
  if (tops.empty() && !accepting) return kDead;
  std::sort(tops.begin(), tops.end());
  auto [it, added] =
      config_ids_.try_emplace({tops, accepting}, static_cast<State>(configs_.size()));
  if (added) {
    configs_.push_back({std::move(tops), accepting});
    next_.resize(next_.size() + 256, kUnknown);
  }
  return it->second;
}

GrammarMatcher::State GrammarMatcher::Step(State s, uint8_t byte) {
  std::vector<int32_t> seeds;
  for (int32_t n : configs_[s].stacks) {
    const Node node = nodes_[n];
    const Dfa::State t = grammar_->rules[node.rule].dfa.Next(node.state, byte);
    if (t != Dfa::kDead) seeds.push_back(InternNode(node.rule, t, node.parent));
  }
  const State t = seeds.empty() ? kDead : Close(std::move(seeds));
  next_[static_cast<size_t>(s) * 256 + byte] = t;
  return t;
}

GrammarMatcher::State GrammarMatcher::Walk(State s, std::string_view bytes) {
  for (char c : bytes) {
    if (s == kDead) return kDead;
    s = Next(s, static_cast<uint8_t>(c));
  }
  return s;
}

}  // namespace kvserve::structured
