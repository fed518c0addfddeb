// The parts of the OpenAI request parser (frontend/request/openai_request.h) in files of their own:
// field readers over simdjson (frontend/request/request_fields.cc), the refusal of parameters
// kvserve does not serve (frontend/request/unserved_fields.cc), structured outputs
// (frontend/request/constraint_request.cc) and tools (frontend/request/tool_request.cc). Internal
// to the parser: each returns InvalidArgument "param: what is wrong", as ParseCompletionRequest
// reports it.
//
// Pure functions (CheckCompiles keeps a process-wide set of what compiled, under its lock); any
// thread.
#ifndef KVSERVE_FRONTEND_REQUEST_REQUEST_FIELDS_H_
#define KVSERVE_FRONTEND_REQUEST_REQUEST_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/structured/constraint.h"
#include "frontend/request/parsed_request.h"
#include "simdjson.h"

namespace kvserve::frontend::request_fields {

using simdjson::dom::element;
using simdjson::dom::object;

// Field readers: `key` of `o`, null meaning absent; errors name `key` (or `param`).
absl::Status Bad(std::string_view param, std::string_view what);
std::optional<element> Field(object o, std::string_view key);
absl::StatusOr<double> Number(object o, std::string_view key, double fallback, double lo,
                              double hi);
absl::StatusOr<int64_t> Integer(object o, std::string_view key, int64_t fallback, int64_t lo,
                                int64_t hi);
absl::StatusOr<bool> Bool(object o, std::string_view key, bool fallback);
absl::StatusOr<bool> NestedBool(object o, std::string_view key, std::string_view param,
                                bool fallback);
// A bool as vLLM's pydantic models read one (lax mode): true/false, 0/1, or the strings "true",
// "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n" in any case.
absl::StatusOr<bool> LaxBool(object o, std::string_view key, bool fallback);
absl::StatusOr<std::string> String(object o, std::string_view key);
// "param: is not supported by kvserve; leave it unset" and `neutral`.
absl::Status Unserved(std::string_view param, std::string_view neutral);
// Whether `key` is there and is not an empty array.
bool NonEmptyArray(object o, std::string_view key);
// `param` has over `bytes` bytes of text (--max-prompt-bytes).
absl::Status TooLong(std::string_view param, int64_t bytes, const RequestLimits& limits);

// The OpenAI and vLLM parameters kvserve does not serve, each refused by name unless unset or
// neutral (frontend/request/unserved_fields.cc); `n`: the request's samples.
absl::Status RefuseUnserved(object o, bool chat, int n);

// Structured outputs (guided_*, structured_outputs, response_format) into r->constraint.
absl::Status ParseConstraint(object o, const RequestLimits& limits, ParsedRequest* r);
// InvalidArgument naming `param` when `spec` does not compile (each distinct one is compiled
// once per process).
absl::Status CheckCompiles(const structured::ConstraintSpec& spec, const std::string& param);

// Chat's tools, tool_choice and parallel_tool_calls into r->tool_use (and r->constraint for a
// forced call).
absl::Status ParseTools(object o, const RequestLimits& limits, ParsedRequest* r);

}  // namespace kvserve::frontend::request_fields

#endif  // KVSERVE_FRONTEND_REQUEST_REQUEST_FIELDS_H_
