# Small helpers so every folder declares its targets the same way, with explicit source lists.
#
#   kvserve_cc_library(NAME common SRCS a.cc b.cc DEPS absl::status)
#   kvserve_cc_binary(NAME kvserve-tokenize SRCS main.cc DEPS kvserve::common)
#   kvserve_cc_test(NAME block_hash_test SRCS block_hash_test.cc DEPS kvserve::common LABELS unit)

# Designated initializers that leave members to their defaults are how params structs are
# written here; GCC 12 warns about them under -Wextra.
set(KVSERVE_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare
    -Wno-missing-field-initializers)

function(kvserve_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kvserve_${ARG_NAME} ${ARG_SRCS})
  add_library(kvserve::${ARG_NAME} ALIAS kvserve_${ARG_NAME})
  target_include_directories(kvserve_${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR})
  target_link_libraries(kvserve_${ARG_NAME} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  target_compile_options(kvserve_${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVSERVE_WARNINGS}>)
endfunction()

function(kvserve_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
  target_compile_options(${ARG_NAME} PRIVATE ${KVSERVE_WARNINGS})
endfunction()

# LABELS: unit | integration | gpu | slow (ctest -L selects them).
function(kvserve_cc_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  target_compile_options(${ARG_NAME} PRIVATE ${KVSERVE_WARNINGS})
  # The source tree reaches tests through the environment (tests/testing/paths.h), not a macro:
  # an absolute path compiled into every test would make each clone's objects differ (ccache).
  add_test(NAME ${ARG_NAME} COMMAND ${ARG_NAME})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  set_tests_properties(${ARG_NAME} PROPERTIES LABELS "${ARG_LABELS}"
      ENVIRONMENT "KVSERVE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if("gpu" IN_LIST ARG_LABELS AND NOT KVSERVE_CUDA_EMULATED)
    # GPU tests GTEST_SKIP() without a device; report them as skipped, not passed. (The emulated
    # device is always there: a skip there is a pass, like any other test's.)
    set_tests_properties(${ARG_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endfunction()
