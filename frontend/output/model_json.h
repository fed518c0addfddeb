// Model output read as JSON although it holds numbers past a double's range: a 500-digit integer
// or 1e999 is valid JSON (the constraint engine lets a schema's unbounded integer run on), but
// nlohmann refuses it, and a finished tool call would come back as plain content. Such numbers
// are read as placeholder strings (a per-process random marker, then the number's text) and put
// back, as the model wrote them, into JSON text written from the parsed value.
//
//   nlohmann::ordered_json j = ParseModelJson(text);  // discarded: not JSON
//   std::string args = RestoreNumbers(*PythonJsonText(j["parameters"].dump()));
//
// Pure functions; any thread.
#ifndef KVSERVE_FRONTEND_OUTPUT_MODEL_JSON_H_
#define KVSERVE_FRONTEND_OUTPUT_MODEL_JSON_H_

#include <string>
#include <string_view>

#include "nlohmann/json.hpp"

namespace kvserve::frontend {

// `text` parsed (discarded when it is not JSON), numbers past a double's range kept as
// placeholders.
nlohmann::ordered_json ParseModelJson(std::string_view text);

// `json` (written from a value ParseModelJson read) with each placeholder back as its number.
std::string RestoreNumbers(std::string json);

}  // namespace kvserve::frontend

#endif  // KVSERVE_FRONTEND_OUTPUT_MODEL_JSON_H_
