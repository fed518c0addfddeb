#!/usr/bin/env bash
# Clang's thread-safety analysis over every C++ file that the given builds compile: each member
# a lock guards (ABSL_GUARDED_BY) is used only with its lock held, and each function's lock
# contract (ABSL_EXCLUSIVE_LOCKS_REQUIRED, ABSL_LOCKS_EXCLUDED) holds at its calls. Reads the
# builds' compile_commands.json and compiles each file again, syntax only, with clang++ and
# -Wthread-safety -Werror=thread-safety; nvcc's entries and generated sources are skipped (CUDA
# code reaches the check through the emulated build, which compiles it as C++).
#
#   bash scripts/check-thread-safety.sh build [build-emulated]
set -euo pipefail
cd "$(dirname "$0")/.."
clang=${CLANG:-clang++-16}
command -v "$clang" >/dev/null || { echo "check-thread-safety: no $clang (scripts/install-deps.sh)" >&2; exit 1; }
list=$(mktemp)
trap 'rm -f "$list"' EXIT
for build in "$@"; do
  db="$build/compile_commands.json"
  [[ -f $db ]] || { echo "check-thread-safety: no $db (configure the build first)" >&2; exit 1; }
  # One line per file: directory TAB file TAB the compiler's flags (output and -c dropped).
  node -e '
    const [db, root] = process.argv.slice(1);
    for (const e of JSON.parse(require("fs").readFileSync(db, "utf8"))) {
      const args = e.command.split(/\s+/);
      if (!/(^|\/)(c\+\+|g\+\+|clang\+\+)[-0-9.]*$/.test(args[0])) continue;  // nvcc
      if (!e.file.startsWith(root + "/") || e.file.endsWith(".pb.cc")) continue;  // generated
      const flags = [];
      for (let i = 1; i < args.length; i++) {
        if (args[i] === "-o") { i++; continue; }
        if (args[i] === "-c" || args[i] === e.file || /^-W/.test(args[i]) || args[i] === "-w") continue;
        flags.push(args[i]);
      }
      console.log([e.directory, e.file, flags.join(" ")].join("\t"));
    }' "$db" "$PWD" >>"$list"
done
sort -u -t$'\t' -k2,2 "$list" -o "$list"
echo "check-thread-safety: $(wc -l <"$list") files with $("$clang" --version | head -1)"
export clang
# shellcheck disable=SC2016
tr '\n' '\0' <"$list" | xargs -0 -P "${KVSERVE_JOBS:-2}" -n 1 bash -c '
  IFS=$'\''\t'\'' read -r dir file flags <<<"$1"
  # The flags keep compile_commands.json'"'"'s shell quoting (-DX=\"...\"): eval undoes it.
  cd "$dir" && eval "$clang $flags -fsyntax-only -Wno-everything -Wthread-safety" \
    "-Werror=thread-safety \"\$file\"" || { echo "check-thread-safety: $file" >&2; exit 1; }' _ ||
  { echo "check-thread-safety: the files above do not pass" >&2; exit 1; }
echo "check-thread-safety: clean"
