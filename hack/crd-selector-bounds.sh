#!/usr/bin/env bash
# Bounds every metav1.LabelSelector in the generated CRDs: at most 32 matchLabels, 32
# matchExpressions and 64 values each. controller-gen takes no markers on another package's types,
# and without bounds the API server refuses the CEL rules that check each expression (their
# estimated cost grows with an unbounded list, in lists of groups and commands).
set -euo pipefail
for f in "$@"; do
  awk '
    function indent(s) { match(s, /^ */); return substr(s, 1, RLENGTH) }
    function flush(bound) {
      print held[0]
      if (bound) print indent(held[0]) "  maxItems: 64"
      for (i = 1; i < n; i++) print held[i]
      n = 0
    }
    n > 0 {
      held[n++] = $0
      # a label selector requirement'"'"'s values say so in the first two lines of their description
      if ($0 ~ /values is an array of string values/) { flush(1); next }
      if (n == 3) flush(0)
      next
    }
    /^ *values:$/ { held[0] = $0; n = 1; next }
    { print }
    /^ *matchExpressions:$/ { print indent($0) "  maxItems: 32" }
    /^ *matchLabels:$/ { print indent($0) "  maxProperties: 32" }
    END { if (n > 0) flush(0) }
  ' "$f" >"$f.tmp"
  mv "$f.tmp" "$f"
done
