#!/usr/bin/env bash
# Clang's thread-safety analysis over every C++ file that the given builds compile: each member
# a lock guards (ABSL_GUARDED_BY) is used only with its lock held, and each function's lock
# contract (ABSL_EXCLUSIVE_LOCKS_REQUIRED, ABSL_LOCKS_EXCLUDED) holds at its calls. Reads the
# builds' compile_commands.json and compiles each file again, syntax only, with clang++ and
# -Wthread-safety -Werror=thread-safety; nvcc's entries and generated sources are skipped (CUDA
# code reaches the check through the emulated build, which compiles it as C++).
#
#   bash scripts/check-thread-safety.sh [--analysed-by build-fuzz] build [build-emulated]
#
# --analysed-by names a clang build that ran the analysis as it compiled (the fuzz build:
# -Wthread-safety -Werror=thread-safety, CMakeLists.txt): a file it compiled with the same -D set,
# whose object ninja reports current, is not compiled again here. If any of its objects is out of
# date, that build is ignored and every file is checked.
set -euo pipefail
cd "$(dirname "$0")/.."
clang=${CLANG:-clang++-16}
command -v "$clang" >/dev/null || { echo "check-thread-safety: no $clang (scripts/install-deps.sh)" >&2; exit 1; }
analysed_by=
if [[ ${1:-} == --analysed-by ]]; then
  analysed_by=$2
  shift 2
fi
list=$(mktemp)
done_list=$(mktemp)
pch_dir=$(mktemp -d)  # the precompiled headers below
trap 'rm -rf "$list" "$done_list" "$pch_dir"' EXIT

# The analysed build's files: file TAB its sorted -D flags, for objects that exist and are current.
if [[ -n $analysed_by && -f $analysed_by/compile_commands.json ]]; then
  objects=$(mktemp)
  node -e '
    const fs = require("fs"), path = require("path");
    const [db, root, out] = process.argv.slice(1);
    const done = [], objs = [];
    for (const e of JSON.parse(fs.readFileSync(db, "utf8"))) {
      const args = e.command.split(/\s+/);
      if (!args.includes("-Werror=thread-safety") || !e.file.startsWith(root + "/")) continue;
      const o = args[args.indexOf("-o") + 1];
      if (!fs.existsSync(path.resolve(e.directory, o))) continue;
      objs.push(o);
      done.push([e.file, args.filter((a) => a.startsWith("-D")).sort().join(" ")].join("\t"));
    }
    fs.writeFileSync(out, objs.join("\n") + "\n");
    console.log(done.join("\n"));' "$analysed_by/compile_commands.json" "$PWD" "$objects" \
    >"$done_list"
  # ninja -n prints a "[k/n] ..." line for each step it would run.
  if [[ -s $done_list ]] && pending=$(xargs ninja -C "$analysed_by" -n <"$objects" 2>&1) &&
    ! grep -q '^\[' <<<"$pending"; then
    echo "check-thread-safety: $(wc -l <"$done_list") files analysed by $analysed_by's compile"
  else
    echo "check-thread-safety: $analysed_by is not current; checking every file"
    : >"$done_list"
  fi
  rm -f "$objects"
fi

for build in "$@"; do
  db="$build/compile_commands.json"
  [[ -f $db ]] || { echo "check-thread-safety: no $db (configure the build first)" >&2; exit 1; }
  # One line per file: directory TAB file TAB the compiler's flags (output and -c dropped).
  node -e '
    const fs = require("fs");
    const [db, root, done] = process.argv.slice(1);
    const analysed = new Set(fs.readFileSync(done, "utf8").split("\n").filter(Boolean));
    for (const e of JSON.parse(fs.readFileSync(db, "utf8"))) {
      const args = e.command.split(/\s+/);
      if (!/(^|\/)(c\+\+|g\+\+|clang\+\+)[-0-9.]*$/.test(args[0])) continue;  // nvcc
      if (!e.file.startsWith(root + "/") || e.file.endsWith(".pb.cc")) continue;  // generated
      const defines = args.filter((a) => a.startsWith("-D")).sort().join(" ");
      if (analysed.has(e.file + "\t" + defines)) continue;  // --analysed-by compiled it alike
      const flags = [];
      for (let i = 1; i < args.length; i++) {
        if (args[i] === "-o") { i++; continue; }
        if (args[i] === "-c" || args[i] === e.file || /^-W/.test(args[i]) || args[i] === "-w") continue;
        flags.push(args[i]);
      }
      console.log([e.directory, e.file, flags.join(" ")].join("\t"));
    }' "$db" "$PWD" "$done_list" >>"$list"
done
sort -u -t$'\t' -k2,2 "$list" -o "$list"
echo "check-thread-safety: $(wc -l <"$list") files with $("$clang" --version | head -1)"
export clang

# Files compiled with the same flags share a precompiled header of the system and third-party
# headers they include (scripts/lib/thread_safety_pch.js): parsing those was most of each
# file's time. A file that fails with its PCH is checked again without; only that counts.
node scripts/lib/thread_safety_pch.js "$list" "$pch_dir" >"$pch_dir/list"
mv "$pch_dir/list" "$list"
# shellcheck disable=SC2016
tr '\n' '\0' <"$pch_dir/jobs" | xargs -0 -r -P "${KVSERVE_JOBS:-2}" -n 1 bash -c '
  IFS=$'\''\t'\'' read -r dir header flags pch <<<"$1"
  cd "$dir" && eval "$clang $flags -x c++-header -Wno-everything \"\$header\" -o \"\$pch\"" ||
    { echo "check-thread-safety: no PCH for the files of $pch (checked without)"; rm -f "$pch"; }' _
echo "check-thread-safety: $(grep -c . "$pch_dir/jobs" || true) precompiled headers"

# shellcheck disable=SC2016
tr '\n' '\0' <"$list" | xargs -0 -P "${KVSERVE_JOBS:-2}" -n 1 bash -c '
  IFS=$'\''\t'\'' read -r dir file flags pch <<<"$1"
  # The flags keep compile_commands.json'"'"'s shell quoting (-DX=\"...\"): eval undoes it.
  check() {
    eval "$clang $flags $1 -fsyntax-only -Wno-everything -Wthread-safety -Werror=thread-safety" \
      "\"\$file\""
  }
  cd "$dir" || exit 1
  [[ -n $pch && -f $pch ]] && check "-include-pch $pch" 2>/dev/null && exit 0
  check "" || { echo "check-thread-safety: $file" >&2; exit 1; }' _ ||
  { echo "check-thread-safety: the files above do not pass" >&2; exit 1; }
echo "check-thread-safety: clean"
