# Compiles C, C++ and CUDA through ccache when it is installed (scripts/install-deps.sh's test
# set installs it), so that a second build of the same sources on the same machine, in this
# clone or in a fresh clone in another folder (CI clones anew every run), is a cache hit.
#
#   KVSERVE_CCACHE=OFF              builds without it (the result is the same, only slower)
#   KVSERVE_CCACHE_DIR=/some/dir    where the cache lives (default below; never inside a clone)
#
# What makes a clone elsewhere hit: CCACHE_BASEDIR is the source tree, so ccache rewrites the
# absolute paths under it into relative ones before hashing and compiling; CCACHE_NOHASHDIR
# leaves the working directory out of the hash (it only changes the debug info's DW_AT_comp_dir,
# which then names the folder that first compiled the file). Must be included before any target.
option(KVSERVE_CCACHE "Compile through ccache when it is installed" ON)
find_program(KVSERVE_CCACHE_PROGRAM ccache)
if(KVSERVE_CCACHE AND KVSERVE_CCACHE_PROGRAM)
  if(DEFINED ENV{KVSERVE_CCACHE_DIR})
    set(_kvserve_ccache_dir "$ENV{KVSERVE_CCACHE_DIR}")
  elseif(DEFINED ENV{HOME} AND NOT "$ENV{HOME}" STREQUAL "/root")
    set(_kvserve_ccache_dir "$ENV{HOME}/.cache/kvserve-ccache")
  else()
    set(_kvserve_ccache_dir /var/cache/kvserve-ccache)
  endif()
  # 3 builds (main with nvcc, emulated, ASan fuzzers) take about 2 GB of objects.
  set(_kvserve_launcher ${CMAKE_COMMAND} -E env
      CCACHE_DIR=${_kvserve_ccache_dir} CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
      CCACHE_NOHASHDIR=true CCACHE_MAXSIZE=6G CCACHE_COMPRESS=true
      ${KVSERVE_CCACHE_PROGRAM})
  foreach(lang C CXX CUDA)
    set(CMAKE_${lang}_COMPILER_LAUNCHER ${_kvserve_launcher})
  endforeach()
  message(STATUS "kvserve: compiling through ccache (${_kvserve_ccache_dir})")
endif()
