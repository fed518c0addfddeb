#include "common/tokenizer/tokenizer.h"

#include <random>

#include "common/string_util.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/incremental_detokenizer.h"
#include "common/utf8.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve::tokenizer {
namespace {

using ::kvserve::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

const Tokenizer& Llama3() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromDirectory(testing::NpmTokenizerDir("llama3"));
    EXPECT_OK(t);
    return t.ok() ? t->release() : nullptr;
  }();
  return *tok;
}

const Tokenizer& Qwen3() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromDirectory(testing::NpmTokenizerDir("qwen3"));
    EXPECT_OK(t);
    return t.ok() ? t->release() : nullptr;
  }();
  return *tok;
}

// A tiny byte-level BPE file: vocabulary of single bytes plus a few merges.
json TinyTokenizerJson() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    BytesToByteLevel(std::string(1, static_cast<char>(b)), &s);
    vocab[s] = id++;
  }
  vocab["ab"] = id++;
  vocab["abc"] = id++;
  vocab["bc"] = id++;
  vocab["aa"] = id++;
  return json{
      {"added_tokens", json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 301},
                                     {"content", "<x>"},
                                     {"special", false},
                                     {"lstrip", true},
                                     {"rstrip", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"b c", "a b", "ab c", "a a"})}}},
  };
}

TEST(TokenizerTest, Llama3KnownIds) {
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, Llama3().Encode("Hello world"));
  EXPECT_THAT(ids, ElementsAre(9906, 1917));
  ASSERT_OK_AND_ASSIGN(ids, Llama3().Encode("<|begin_of_text|>Hi<|eot_id|>"));
  EXPECT_THAT(ids, ElementsAre(128000, 13347, 128009));
  EXPECT_EQ(Llama3().bos_id(), 128000);
  EXPECT_EQ(Llama3().eos_id(), 128001);
  EXPECT_EQ(Llama3().vocab_size(), 128256);
  EXPECT_TRUE(Llama3().IsSpecial(128009));
  EXPECT_FALSE(Llama3().IsSpecial(9906));
  ASSERT_OK_AND_ASSIGN(std::string text,
                       Llama3().Decode({128000, 9906, 1917}, /*skip_special_tokens=*/true));
  EXPECT_EQ(text, "Hello world");
}

TEST(TokenizerTest, Qwen3NormalizesToNfc) {
  ASSERT_OK_AND_ASSIGN(std::vector<int> decomposed, Qwen3().Encode("cafe\u0301"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> composed, Qwen3().Encode("caf\u00e9"));
  EXPECT_EQ(decomposed, composed);
  EXPECT_EQ(Qwen3().eos_token(), "<|im_end|>");
  EXPECT_FALSE(Qwen3().bos_id().has_value());
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, Llama3().Encode("cafe\u0301"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> llama_composed, Llama3().Encode("caf\u00e9"));
  EXPECT_NE(ids, llama_composed);  // Llama 3 does not normalize
}

TEST(TokenizerTest, InvalidUtf8IsRejected) {
  EXPECT_THAT(Llama3().Encode("ok\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("byte offset 2")));
  EXPECT_THAT(Llama3().Decode({5, 999999}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("999999")));
  EXPECT_THAT(Llama3().Decode({-1}), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("-1")));
}

TEST(TokenizerTest, LongInputsAreHandled) {
  std::string spaces(200000, ' ');
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, Llama3().Encode(spaces + "x"));
  EXPECT_FALSE(ids.empty());
  std::string word(100000, 'q');
  ASSERT_OK_AND_ASSIGN(ids, Qwen3().Encode(word));
  ASSERT_OK_AND_ASSIGN(std::string back, Qwen3().Decode(ids));
  EXPECT_EQ(back, word);
}

TEST(TokenizerTest, TinyFileMergesByRankAndAddsTemplateTokens) {
  ASSERT_OK_AND_ASSIGN(auto tok, Tokenizer::FromJson(TinyTokenizerJson().dump(), "", "tiny"));
  auto id = [&](const char* t) { return *tok->TokenToId(t); };
  // "abc": "b c" has rank 0, so b+c merge first, leaving a + bc (no "a bc" merge).
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("abc", /*add_special_tokens=*/false));
  EXPECT_THAT(ids, ElementsAre(id("a"), id("bc")));
  ASSERT_OK_AND_ASSIGN(ids, tok->Encode("aaa", false));
  EXPECT_THAT(ids, ElementsAre(id("aa"), id("a")));  // leftmost first among equal ranks
  ASSERT_OK_AND_ASSIGN(ids, tok->Encode("ab", true));
  EXPECT_THAT(ids, ElementsAre(300, id("ab")));
  // <x> strips the whitespace around it; the GPT-2 regex splits " ab" with its space.
  ASSERT_OK_AND_ASSIGN(ids, tok->Encode("a  <x>  ab", false));
  EXPECT_THAT(ids, ElementsAre(id("a"), 301, id("ab")));
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  struct Case {
    std::function<void(json&)> edit;
    const char* message;
  };
  std::vector<Case> cases = {
      {[](json& j) { j["model"]["type"] = "WordPiece"; },
       "model type 'WordPiece' is not supported"},
      {[](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer 'Lowercase'"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer 'Metaspace'"},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "only byte-level BPE"},
      {[](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder 'WordPiece'"},
      {[](json& j) { j["model"]["merges"].push_back("zz q"); }, "not in the vocabulary"},
      // Found by tokenizer_json_fuzz: a missing list was read as an empty array (undefined).
      {[](json& j) { j["model"].erase("merges"); }, "'model.merges' is missing"},
      {[](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              json::array(
                  {{{"type", "Split"}, {"pattern", {{"Regex", "(["}}}, {"behavior", "Isolated"}},
                   {{"type", "ByteLevel"}}})}};
       },
       "does not compile"},
      // Ids far past the file's own size would grow the decode table to gigabytes.
      {[](json& j) { j["model"]["vocab"]["zz"] = 1 << 30; }, "vocab entry 'zz' has id 1073741824"},
      {[](json& j) { j["added_tokens"][1]["id"] = 1 << 30; }, "an added token has id 1073741824"},
      {[](json& j) { j["model"]["vocab"]["zz"] = -3; }, "has id -3"},
  };
  for (const Case& c : cases) {
    json j = TinyTokenizerJson();
    c.edit(j);
    EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "tiny/tokenizer.json"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(HasSubstr("tiny/tokenizer.json"), HasSubstr(c.message))));
  }
  EXPECT_THAT(Tokenizer::FromJson("{", "", "t"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid JSON")));
  EXPECT_THAT(Tokenizer::FromJson(TinyTokenizerJson().dump(), R"({"bos_token": "<nope>"})", "t"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'<nope>'")));
}

TEST(TokenizerTest, ByteFallbackWhenAByteHasNoToken) {
  json j = TinyTokenizerJson();
  std::string z;
  BytesToByteLevel("z", &z);
  j["model"]["vocab"].erase(z);
  EXPECT_THAT(Tokenizer::FromJson(j.dump(), "", "t").value()->Encode("z", false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0x7A")));
  j["model"]["byte_fallback"] = true;
  j["model"]["vocab"]["<0x7A>"] = 400;
  ASSERT_OK_AND_ASSIGN(auto tok, Tokenizer::FromJson(j.dump(), "", "t"));
  ASSERT_OK_AND_ASSIGN(std::vector<int> ids, tok->Encode("az", false));
  EXPECT_THAT(ids, ElementsAre(*tok->TokenToId("a"), 400));
}

TEST(BpeModelTest, ScanAndHeapMergeAgree) {
  // A random BPE model over 5 letters: merges of random existing tokens, in random order.
  std::mt19937 rng(7);
  StringMap<int> vocab;
  std::vector<std::string> tokens = {"a", "b", "c", "d", "e"};
  for (const std::string& t : tokens) vocab[t] = static_cast<int>(vocab.size());
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < 400) {
    const std::string l = tokens[rng() % tokens.size()];
    const std::string r = tokens[rng() % tokens.size()];
    if (l.size() + r.size() > 12 || vocab.contains(l + r)) continue;
    vocab[l + r] = static_cast<int>(vocab.size());
    tokens.push_back(l + r);
    merges.emplace_back(l, r);
  }
  ASSERT_OK_AND_ASSIGN(auto bpe, BpeModel::Create(vocab, merges, BpeOptions{}));
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int> symbols(1 + rng() % 200);
    for (int& s : symbols) s = static_cast<int>(rng() % 5);
    std::vector<int> scan = symbols, heap = symbols;
    bpe->MergeWithScan(&scan);
    bpe->MergeWithHeap(&heap);
    ASSERT_EQ(scan, heap) << "trial " << trial;
  }
}

TEST(IncrementalDetokenizerTest, ConcatenationEqualsDecodeAndNeverBreaksUtf8) {
  const Tokenizer& tok = Llama3();
  ASSERT_OK_AND_ASSIGN(
      std::vector<int> text_ids,
      tok.Encode("Emoji 👨‍👩‍👧‍👦 and 世界, café ñ — done.<|eot_id|>"));
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> ids = text_ids;
    if (trial > 0) {  // random ids too: partial byte tokens and specials
      for (int i = 0; i < 30; ++i) ids.push_back(rng() % tok.vocab_size());
    }
    for (bool skip : {false, true}) {
      IncrementalDetokenizer detok(tok, skip);
      std::string streamed;
      for (int id : ids) {
        ASSERT_OK_AND_ASSIGN(std::string delta, detok.Append(id));
        EXPECT_TRUE(IsValidUtf8(delta));
        streamed += delta;
      }
      streamed += detok.Finish();
      ASSERT_OK_AND_ASSIGN(std::string whole, tok.Decode(ids, skip));
      EXPECT_EQ(streamed, whole);
      EXPECT_EQ(detok.text(), whole);
    }
  }
  IncrementalDetokenizer detok(tok, false);
  EXPECT_THAT(detok.Append(1 << 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1048576")));
}

TEST(IncrementalDetokenizerTest, HoldsBackSplitCharacters) {
  const Tokenizer& tok = Llama3();
  // "世" is E4 B8 96: Llama 3 has a token for the bytes E4 B8 and one for 96.
  std::string s;
  BytesToByteLevel("\xe4\xb8", &s);
  std::optional<int> head = tok.TokenToId(s);
  s.clear();
  BytesToByteLevel("\x96", &s);
  std::optional<int> tail = tok.TokenToId(s);
  ASSERT_TRUE(head && tail);
  IncrementalDetokenizer detok(tok, false);
  ASSERT_OK_AND_ASSIGN(std::string first, detok.Append(*tail));  // a lone continuation byte
  EXPECT_EQ(first, "\xEF\xBF\xBD");
  ASSERT_OK_AND_ASSIGN(std::string second, detok.Append(*head));
  EXPECT_EQ(second, "");  // held back
  ASSERT_OK_AND_ASSIGN(std::string third, detok.Append(*tail));
  EXPECT_EQ(third, "世");
  ASSERT_OK_AND_ASSIGN(std::string fourth, detok.Append(*head));
  EXPECT_EQ(fourth, "");
  EXPECT_EQ(detok.Finish(), "\xEF\xBF\xBD");  // never completed
}

}  // namespace
}  // namespace kvserve::tokenizer
