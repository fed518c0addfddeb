// Token masks from the vocabulary trie equal a brute-force check of every token against the
// automaton, on the Llama 3 and Qwen3 vocabularies, at random reachable states of constraints
// written like the ones structured outputs send.
#include "common/structured/token_mask.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/structured/grammar.h"
#include "common/structured/json_schema.h"
#include "common/structured/regex.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::structured {
namespace {

TokenMask BruteForce(const std::vector<std::string>& vocab, const Dfa& dfa, Dfa::State s) {
  TokenMask mask(static_cast<int32_t>(vocab.size()));
  for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
    if (!vocab[id].empty() && dfa.Walk(s, vocab[id]) != Dfa::kDead) mask.Set(id);
  }
  return mask;
}

TEST(TokenMaskTest, SmallVocabulary) {
  const std::vector<std::string> vocab = {"a", "ab", "", "b", "abc", "c", "\xC3", "\xA9", "é"};
  const TokenTrie trie(vocab);
  const Dfa dfa = *CompileRegex("(ab)+é?");
  TokenMask mask = trie.Allowed(dfa, dfa.start());
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < trie.vocab_size(); ++id) {
    if (mask.Has(id)) ids.push_back(id);
  }
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  const Dfa::State after = dfa.Walk(dfa.start(), "ab");
  mask = trie.Allowed(dfa, after);
  EXPECT_TRUE(mask.Has(0) && mask.Has(1) && mask.Has(6) && mask.Has(8));
  EXPECT_FALSE(mask.Has(7) || mask.Has(4) || mask.Has(2));
  EXPECT_EQ(trie.Allowed(dfa, Dfa::kDead).Count(), 0);
}

class TokenMaskVocabTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenMaskVocabTest, TrieMasksEqualBruteForce) {
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromDirectory(testing::NpmTokenizerDir(GetParam()));
  ASSERT_OK(tok);
  const std::vector<std::string> vocab = VocabularyBytes(**tok);
  const TokenTrie trie(vocab);
  for (int id = 0; id < (*tok)->vocab_size(); ++id) {
    if ((*tok)->IsSpecial(id)) {
      ASSERT_TRUE(vocab[id].empty()) << id;
    }
  }
  const std::vector<std::string> patterns = {
      R"(\{"name": "[a-zA-Z ]{1,20}", "age": (0|[1-9][0-9]{0,2})\})",
      "(yes|no|maybe)",
      R"("([^"\\]|\\["\\/bfnrt])*")",
      R"(-?\d+(\.\d+)?([eE][+-]?\d+)?)",
      "[à-ÿ ]+ and [一-龥]{1,4}",
      "[^x]*",
      // Plain text of bounded lengths: whole subtrees taken only where every one survives.
      R"("[^"\\]{0,7}")",
      R"([ -~]{2,40}!)",
      R"(\{"k": "[^"\\]{3,12}", "v": "[a-z ]{0,5}"\})",
  };
  std::mt19937 rng(3);
  int states = 0;
  for (const std::string& p : patterns) {
    absl::StatusOr<Dfa> dfa = CompileRegex(p);
    ASSERT_OK(dfa) << p;
    // A random walk of allowed tokens; at each state the trie's mask and the brute force.
    Dfa::State s = dfa->start();
    for (int step = 0; step < 12 && s != Dfa::kDead; ++step) {
      const TokenMask got = trie.Allowed(*dfa, s);
      const TokenMask want = BruteForce(vocab, *dfa, s);
      ASSERT_EQ(got.Count(), want.Count()) << p << " step " << step;
      EXPECT_TRUE(got == want) << p << " step " << step;
      ++states;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < trie.vocab_size(); ++id) {
        if (got.Has(id)) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      s = dfa->Walk(s, vocab[allowed[rng() % allowed.size()]]);
    }
  }
  EXPECT_GE(states, 20);
}

// The same for grammar states: JSON schemas (nested objects, arrays, recursion, escapes).
TEST_P(TokenMaskVocabTest, GrammarMasksEqualBruteForce) {
  absl::StatusOr<std::unique_ptr<tokenizer::Tokenizer>> tok =
      tokenizer::Tokenizer::FromDirectory(testing::NpmTokenizerDir(GetParam()));
  ASSERT_OK(tok);
  const std::vector<std::string> vocab = VocabularyBytes(**tok);
  const TokenTrie trie(vocab);
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
          "tags": {"type": "array", "items": {"enum": ["a", "b\"c"]}, "maxItems": 3},
          "n": {"type": "integer", "minimum": -20, "maximum": 300}}, "required": ["name"]})",
      R"({"$defs": {"t": {"type": "object", "properties": {"v": {"type": "number"},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}}, "$ref": "#/$defs/t"})",
      R"({"type": "object"})",
      R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 30},
          "free": {"type": "string"}}, "required": ["s", "free"]})",
  };
  std::mt19937 rng(5);
  int states = 0;
  for (const std::string& schema : schemas) {
    absl::StatusOr<Grammar> g = CompileJsonSchema(schema);
    ASSERT_OK(g) << schema;
    GrammarMatcher m(std::make_shared<const Grammar>(*std::move(g)));
    GrammarMatcher::State s = m.start();
    for (int step = 0; step < 20 && s != GrammarMatcher::kDead; ++step) {
      const TokenMask got = trie.Allowed(m, s);
      TokenMask want(static_cast<int32_t>(vocab.size()));
      for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
        if (!vocab[id].empty() && m.Walk(s, vocab[id]) != GrammarMatcher::kDead) want.Set(id);
      }
      ASSERT_EQ(got.Count(), want.Count()) << schema << " step " << step;
      EXPECT_TRUE(got == want) << schema << " step " << step;
      ++states;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < trie.vocab_size(); ++id) {
        if (got.Has(id)) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      s = m.Walk(s, vocab[allowed[rng() % allowed.size()]]);
    }
  }
  EXPECT_GE(states, 30);
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, TokenMaskVocabTest, ::testing::Values("llama3", "qwen3"));

}  // namespace
}  // namespace kvserve::structured
