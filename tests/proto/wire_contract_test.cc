// Guards the evolution rules of kvserve.v1: a field or enum value, once published, keeps its
// number and type forever. New ones may be added (append them to the golden file).
#include <fstream>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/testing/paths.h"
#include "tests/testing/status_matchers.h"

namespace kvserve {
namespace {

using google::protobuf::FileDescriptor;

std::set<std::string> DescribeContract() {
  const FileDescriptor* file = kvserve::v1::GenerateRequest::descriptor()->file();
  std::set<std::string> lines;
  for (int i = 0; i < file->message_type_count(); ++i) {
    const auto* m = file->message_type(i);
    for (int f = 0; f < m->field_count(); ++f) {
      const auto* field = m->field(f);
      std::ostringstream line;
      line << "message " << m->name() << "." << field->name() << " = " << field->number() << " "
           << (field->is_repeated() ? "repeated " : "") << field->type_name();
      if (field->message_type()) line << " " << field->message_type()->name();
      if (field->enum_type()) line << " " << field->enum_type()->name();
      lines.insert(line.str());
    }
  }
  for (int i = 0; i < file->enum_type_count(); ++i) {
    const auto* e = file->enum_type(i);
    for (int v = 0; v < e->value_count(); ++v) {
      std::ostringstream line;
      line << "enum " << e->name() << "." << e->value(v)->name() << " = " << e->value(v)->number();
      lines.insert(line.str());
    }
  }
  return lines;
}

TEST(WireContractTest, PublishedFieldsKeepTheirNumbersAndTypes) {
  const std::string golden = testing::SourceDir() + "/tests/proto/kvserve_v1_contract.txt";
  std::set<std::string> current = DescribeContract();
  if (std::getenv("KVSERVE_UPDATE_GOLDEN") != nullptr) {
    std::ofstream out(golden);
    for (const std::string& l : current) out << l << "\n";
  }
  ASSERT_OK_AND_ASSIGN(std::string text, ReadFileToString(golden));
  std::istringstream in(text);
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++checked;
    EXPECT_TRUE(current.count(line)) << "published contract line changed or removed: " << line;
  }
  EXPECT_GT(checked, 80);
}

}  // namespace
}  // namespace kvserve
