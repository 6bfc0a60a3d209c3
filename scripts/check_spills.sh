#!/usr/bin/env bash
# Compares ptxas's register-spill and local-memory warnings in a build's log
# (a build configured with -DMUSE_DECODE_WARN_SPILLS=ON) with
# scripts/known_spills.txt, each read as "<kernel, demangled>: <what ptxas
# says>". Exits 1, listing them, when the log has warnings the list does not;
# a listed warning the log lacks is fine (an incremental build recompiles only
# what changed, and prints only its warnings).
#
#   scripts/check_spills.sh build/build.log
set -euo pipefail
[ $# = 1 ] && [ -r "$1" ] || { echo "usage: scripts/check_spills.sh BUILD_LOG (a readable file)" >&2; exit 2; }
known="$(dirname "$0")/known_spills.txt"
export LC_ALL=C
seen=$(sed -nE "s/^ptxas warning : (Registers are spilled to local memory in function|Local memory used for function) '([^']+)', (.*)$/\2: \3/p" "$1" |
       c++filt | sort -u)
new=$(comm -23 <(printf '%s\n' "$seen" | sed '/^$/d') <(grep -v '^#' "$known" | sed '/^$/d' | sort -u))
count=$(printf '%s\n' "$seen" | sed '/^$/d' | wc -l)
if [ -n "$new" ]; then
  echo "check_spills.sh: ptxas reports spills or local memory that $known does not list:" >&2
  sed 's/^/  /' <<<"$new" >&2
  echo "check_spills.sh: keep the kernel in registers, or list the line there with what it is" >&2
  exit 1
fi
if [ "$count" = 0 ]; then
  echo "check_spills.sh: no spill or local-memory warning in $1" >&2
else
  echo "check_spills.sh: the $count spill and local-memory warnings in $1 are the ones $known lists" >&2
fi
