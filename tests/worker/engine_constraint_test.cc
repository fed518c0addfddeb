// Structured outputs through the engine (CPU backend): the transformers fixture's weights with
// Llama 3's tokenizer (whose first 1024 ids, byte-level pieces, cover the fixture's vocabulary),
// sampled at temperature 1 under a choice or a regex constraint: every output is in the
// language, and it ends (stop) when the automaton accepts and nothing may follow, or with EOS
// where it accepts.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"
#include "tests/worker/engine_test_util.h"

namespace kvserve::worker {
namespace {

namespace fs = std::filesystem;
using ::kvserve::testing::StatusIs;
using ::testing::HasSubstr;

// The fixture's files beside the Llama 3 tokenizer's, in a directory of this test's own.
std::string ModelWithTokenizer() {
  static const std::string dir = [] {
    const fs::path out =
        fs::temp_directory_path() / ("kvserve-constraint-" + std::to_string(getpid()));
    fs::create_directories(out);
    const fs::path src = kvserve::testing::FixtureModel("tiny-llama3");
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
      fs::copy_file(src / f, out / f, fs::copy_options::overwrite_existing);
    }
    const fs::path tok = kvserve::testing::NpmTokenizerDir("llama3");
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(tok / f, out / f, fs::copy_options::overwrite_existing);
    }
    return out.string();
  }();
  return dir;
}

std::string Text(const std::vector<int32_t>& ids) {
  static const auto tok = tokenizer::Tokenizer::FromDirectory(ModelWithTokenizer());
  std::string s;
  for (int32_t id : ids) s += (*tok)->TokenBytes(id);
  return s;
}

RequestInput Sampled(const std::string& id, structured::ConstraintSpec spec, int n) {
  RequestInput in = testing::GreedyRequest(id, {1, 450, 300, 12, 77}, 48);
  in.sampling.temperature = 1.0f;
  in.sampling.seed = 5;
  in.sampling.n = n;
  in.sampling.ignore_eos = false;
  in.constraint = std::move(spec);
  return in;
}

class EngineConstraintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig config = testing::FixtureConfig("tiny-llama3");
    config.model_dir = ModelWithTokenizer();
    engine_ = testing::MakeEngine(config);
    ASSERT_NE(engine_, nullptr);
  }
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineConstraintTest, ChoicesComeOutWhole) {
  structured::ConstraintSpec spec;
  spec.kind = structured::ConstraintSpec::Kind::kChoice;
  spec.choices = {"yes", "no", "maybe so", "ça va"};
  ASSERT_OK(engine_->AddRequest(Sampled("c", spec, 16)));
  testing::Results r = testing::RunToCompletion(*engine_, /*check_invariants=*/true);
  ASSERT_EQ(r["c"].size(), 16u);
  std::set<std::string> seen;
  for (auto& [i, sample] : r["c"]) {
    const std::string text = Text(sample.tokens);
    EXPECT_TRUE(std::find(spec.choices.begin(), spec.choices.end(), text) != spec.choices.end())
        << "sample " << i << ": '" << text << "'";
    EXPECT_EQ(sample.finish, FinishReason::kStop) << i;
    seen.insert(text);
  }
  EXPECT_GE(seen.size(), 2u) << "temperature 1 draws more than one choice";
}

TEST_F(EngineConstraintTest, RegexOutputsMatchAndStop) {
  // Bounded everywhere: every output ends within 48 tokens, by EOS where the pattern accepts or
  // because nothing may follow.
  const std::string pattern = R"re(\d{3}-[a-z]{2,4}( [A-Z][a-zé]{0,3})?)re";
  structured::ConstraintSpec spec{.regex = pattern};
  ASSERT_OK(engine_->AddRequest(Sampled("r", spec, 24)));
  testing::Results r = testing::RunToCompletion(*engine_, /*check_invariants=*/true);
  const std::regex re(R"re(\d{3}-[a-z]{2,4}( [A-Z]([a-z]|é){0,3})?)re", std::regex::ECMAScript);
  ASSERT_EQ(r["r"].size(), 24u);
  std::set<size_t> lengths;
  for (auto& [i, sample] : r["r"]) {
    const std::string text = Text(sample.tokens);
    EXPECT_EQ(sample.finish, FinishReason::kStop) << i;
    EXPECT_TRUE(std::regex_match(text, re)) << "sample " << i << ": '" << text << "'";
    lengths.insert(text.size());
  }
  EXPECT_GE(lengths.size(), 3u) << "outputs of several lengths";
}

// Jump-forward: after the drawn digit the pattern forces the rest, which is appended as the
// tokenizer writes it, but for its last token, which the model draws (here the only one
// allowed); checked as drawn tokens are (max_tokens). Not for a request that asks for logprobs,
// and not with jump_forward off: the same text, every token drawn.
TEST_F(EngineConstraintTest, ForcedTextIsJumpedAsTheTokenizerWritesIt) {
  // Ids under the fixture's 1024 (Llama 3's tokenizer: " and", " the", " in", ...).
  const std::string rest = " and the in on at to of is it";
  const structured::ConstraintSpec spec{.regex = "[0-9]" + rest};
  ASSERT_OK_AND_ASSIGN(auto tok, tokenizer::Tokenizer::FromDirectory(ModelWithTokenizer()));
  ASSERT_OK_AND_ASSIGN(std::vector<int> forced, tok->Encode(rest, /*add_special_tokens=*/false));
  ASSERT_GE(forced.size(), 5u);
  auto unlogged = [&](const std::string& id, int n) {  // Sampled asks for logprobs: not jumped
    RequestInput in = Sampled(id, spec, n);
    in.sampling.logprobs.reset();
    return in;
  };
  ASSERT_OK(engine_->AddRequest(unlogged("j", 3)));
  testing::Results r = testing::RunToCompletion(*engine_, /*check_invariants=*/true);
  ASSERT_EQ(r["j"].size(), 3u);
  for (auto& [i, sample] : r["j"]) {
    EXPECT_EQ(sample.finish, FinishReason::kStop) << i;
    ASSERT_EQ(sample.tokens.size(), forced.size() + 1) << i;
    EXPECT_EQ(std::vector<int>(sample.tokens.begin() + 1, sample.tokens.end()), forced) << i;
    EXPECT_EQ(Text(sample.tokens).substr(1), rest) << i;
  }
  const int64_t jumped = engine_->stats().jumped_tokens;
  EXPECT_EQ(jumped, 3 * static_cast<int64_t>(forced.size() - 1));

  RequestInput cut = unlogged("cut", 1);
  cut.max_tokens = 4;
  RequestInput with_logprobs = Sampled("lp", spec, 1);
  with_logprobs.sampling.logprobs = 0;
  ASSERT_OK(engine_->AddRequest(cut));
  ASSERT_OK(engine_->AddRequest(with_logprobs));
  r = testing::RunToCompletion(*engine_, /*check_invariants=*/true);
  EXPECT_EQ(r["cut"][0].finish, FinishReason::kLength);
  EXPECT_EQ(r["cut"][0].tokens.size(), 4u);
  EXPECT_EQ(Text(r["lp"][0].tokens).substr(1), rest);
  EXPECT_EQ(r["lp"][0].logprobs.size(), r["lp"][0].tokens.size());
  EXPECT_EQ(engine_->stats().jumped_tokens, jumped + 3) << "the cut request jumped 3, lp none";

  EngineConfig config = testing::FixtureConfig("tiny-llama3");
  config.model_dir = ModelWithTokenizer();
  config.jump_forward = false;
  auto drawn = testing::MakeEngine(config);
  ASSERT_OK(drawn->AddRequest(unlogged("d", 1)));
  r = testing::RunToCompletion(*drawn, /*check_invariants=*/true);
  EXPECT_EQ(Text(r["d"][0].tokens).substr(1), rest);
  EXPECT_EQ(drawn->stats().jumped_tokens, 0);
}

TEST_F(EngineConstraintTest, CompiledOnceAndRefusedClearly) {
  structured::ConstraintSpec spec{.regex = "(a|b)+c"};
  ASSERT_OK(engine_->AddRequest(Sampled("a", spec, 1)));
  ASSERT_OK(engine_->AddRequest(Sampled("b", spec, 1)));
  testing::RunToCompletion(*engine_);
  EXPECT_EQ(engine_->stats().constraints_compiled, 1) << "the second request reuses the first's";
  EXPECT_THAT(engine_->AddRequest(Sampled("bad", {.regex = "(?=x)"}, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lookaround")));
  EngineConfig plain = testing::FixtureConfig("tiny-llama3");  // no tokenizer.json there
  auto engine = testing::MakeEngine(plain);
  EXPECT_THAT(engine->AddRequest(Sampled("x", spec, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("tokenizer")));
}

}  // namespace
}  // namespace kvserve::worker
