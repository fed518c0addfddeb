// Precompiled headers for scripts/check-thread-safety.sh's syntax pass. Reads its file list
// (directory TAB file TAB flags per line) and groups the files by their flags: a group of at
// least kMinFiles files gets one header of the library headers (the C++ library, POSIX's, absl,
// glog, GoogleTest, nlohmann, protobuf and the generated kvserve.pb.h, ZeroMQ, Boost,
// prometheus-cpp, simdjson) that at least two of its files reach, directly or through the
// project's own headers. Run from the repository root.
//
//   node thread_safety_pch.js LIST PCH_DIR
//
// Writes PCH_DIR/<n>.h for each group, prints to stdout each file's line with a fourth field
// (the PCH it should use, PCH_DIR/<n>.pch, empty for none), and writes PCH_DIR/jobs: one line
// per PCH to build (directory TAB header TAB flags TAB pch). Clang refuses a PCH built with
// other macros, hence one per set of flags.
"use strict";
const fs = require("fs");
const path = require("path");

const kMinFiles = 4;
// Headers safe to include ahead of a file's own code: they depend on no macro a file of the
// project defines (none defines one before its includes).
const kLibrary = new RegExp(
    "^(absl|glog|gtest|gmock|nlohmann|google/protobuf|boost|prometheus|benchmark)/|" +
    "^(zmq\\.hpp|simdjson\\.h)$|^kvserve/v1/[a-z_]+\\.pb\\.h$");
const kSystem = new RegExp(
    "^[a-z_0-9]+$|" +  // the C++ library
    "^(unistd|fcntl|poll|signal|errno|netdb|pthread|dlfcn|sched|ifaddrs|pwd|spawn)\\.h$|" +
    "^(sys|netinet|arpa)/[a-z_0-9]+\\.h$");
const root = process.cwd();

// The library headers `file` reaches: its own includes, and those of the project headers it
// includes (resolved from the repository root), memoized per header.
const reached = new Map();
function libraryIncludes(file) {
  if (reached.has(file)) return reached.get(file);
  const found = new Set();
  reached.set(file, found);  // an include cycle ends here (include guards)
  let text;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch {
    return found;
  }
  for (const m of text.matchAll(/^#include [<"]([^>"]+)[>"]/gm)) {
    const h = m[1];
    if (kLibrary.test(h) || kSystem.test(h)) {
      found.add(h);
    } else if (m[0].includes('"') && fs.existsSync(path.join(root, h))) {
      for (const l of libraryIncludes(path.join(root, h))) found.add(l);
    }
  }
  return found;
}

const [listPath, pchDir] = process.argv.slice(2);
const lines = fs.readFileSync(listPath, "utf8").split("\n").filter(Boolean);
const groups = new Map();  // flags -> [line fields]
for (const line of lines) {
  const [dir, file, flags] = line.split("\t");
  if (!groups.has(flags)) groups.set(flags, []);
  groups.get(flags).push([dir, file, flags]);
}
const jobs = [];
const out = [];
let n = 0;
for (const [flags, members] of groups) {
  let pch = "";
  if (members.length >= kMinFiles) {
    const counts = new Map();
    for (const [, file] of members) {
      for (const h of libraryIncludes(file)) counts.set(h, (counts.get(h) || 0) + 1);
    }
    const shared = [...counts].filter(([, c]) => c >= 2).map(([h]) => h);
    // The C++ and C library first, then the libraries, each sorted.
    shared.sort((a, b) => (kLibrary.test(a) - kLibrary.test(b)) || a.localeCompare(b));
    if (shared.length > 0) {
      const header = path.join(pchDir, `${n}.h`);
      pch = path.join(pchDir, `${n}.pch`);
      fs.writeFileSync(header, shared.map((h) => `#include <${h}>`).join("\n") + "\n");
      jobs.push([members[0][0], header, flags, pch].join("\t"));
      ++n;
    }
  }
  for (const m of members) out.push([...m, pch].join("\t"));
}
fs.writeFileSync(path.join(pchDir, "jobs"), jobs.join("\n") + (jobs.length ? "\n" : ""));
console.log(out.join("\n"));
