#include "proto/constraint_wire.h"

#include "absl/strings/str_cat.h"

namespace kvserve {

namespace pb = kvserve::v1;
using Kind = structured::ConstraintSpec::Kind;

pb::Constraint ConstraintToWire(const structured::ConstraintSpec& spec) {
  pb::Constraint c;
  switch (spec.kind) {
    case Kind::kRegex:
      c.set_regex(spec.regex);
      break;
    case Kind::kChoice:
      c.mutable_choice()->mutable_choices()->Add(spec.choices.begin(), spec.choices.end());
      break;
    case Kind::kJsonSchema:
      c.set_json_schema(spec.json_schema);
      c.set_any_whitespace(spec.any_whitespace);
      break;
    case Kind::kJsonObject:
      c.set_json_object(true);
      c.set_any_whitespace(spec.any_whitespace);
      break;
    case Kind::kGrammar:
      c.set_grammar(spec.grammar);
      break;
  }
  if (spec.reasoning != structured::ConstraintSpec::Reasoning{}) {
    pb::ReasoningBlock* block = c.mutable_reasoning();
    block->set_start(spec.reasoning.start);
    block->set_end(spec.reasoning.end);
    block->set_inside(spec.reasoning.inside);
  }
  return c;
}

absl::StatusOr<std::optional<structured::ConstraintSpec>> ConstraintFromWire(
    const pb::Constraint& c) {
  structured::ConstraintSpec spec;
  if (c.any_whitespace() && c.kind_case() != pb::Constraint::kJsonSchema &&
      c.kind_case() != pb::Constraint::kJsonObject) {
    return absl::InvalidArgumentError(
        "sampling.constraint.any_whitespace: is for json_schema and json_object only");
  }
  spec.any_whitespace = c.any_whitespace();
  if (c.has_reasoning()) {
    spec.reasoning = {c.reasoning().start(), c.reasoning().end(), c.reasoning().inside()};
  }
  switch (c.kind_case()) {
    case pb::Constraint::KIND_NOT_SET:
      return std::nullopt;
    case pb::Constraint::kRegex:
      spec.kind = Kind::kRegex;
      spec.regex = c.regex();
      return spec;
    case pb::Constraint::kChoice:
      spec.kind = Kind::kChoice;
      spec.choices.assign(c.choice().choices().begin(), c.choice().choices().end());
      return spec;
    case pb::Constraint::kJsonSchema:
      spec.kind = Kind::kJsonSchema;
      spec.json_schema = c.json_schema();
      return spec;
    case pb::Constraint::kJsonObject:
      spec.kind = Kind::kJsonObject;
      return spec;
    case pb::Constraint::kGrammar:
      spec.kind = Kind::kGrammar;
      spec.grammar = c.grammar();
      return spec;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("sampling.constraint: kind ", static_cast<int>(c.kind_case()),
                   " is not one this worker knows (upgrade it to the router's version)"));
}

}  // namespace kvserve
