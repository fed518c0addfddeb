// A structured-outputs constraint on the wire (kvserve.v1.Constraint) and as both ends use it
// (structured::ConstraintSpec): the router writes it with ConstraintToWire, the worker reads it
// with ConstraintFromWire. The one pair of conversions, so that a kind or a field added to one
// side is added to both here.
//
//   *request.mutable_sampling()->mutable_constraint() = ConstraintToWire(spec);
//   ASSIGN_OR_RETURN(std::optional<ConstraintSpec> c, ConstraintFromWire(sampling.constraint()));
//
// Pure functions; any thread.
#ifndef KVSERVE_PROTO_CONSTRAINT_WIRE_H_
#define KVSERVE_PROTO_CONSTRAINT_WIRE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "common/structured/constraint.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve {

kvserve::v1::Constraint ConstraintToWire(const structured::ConstraintSpec& spec);

// nullopt for a Constraint with no kind set (no constraint; a reasoning block alone means
// nothing). InvalidArgument for a kind this build does not know (a newer peer's).
absl::StatusOr<std::optional<structured::ConstraintSpec>> ConstraintFromWire(
    const kvserve::v1::Constraint& c);

}  // namespace kvserve

#endif  // KVSERVE_PROTO_CONSTRAINT_WIRE_H_
