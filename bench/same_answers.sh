#!/bin/bash
# Same answers before and after a change that must not alter any (issue 40: lazy grammars, start-up cuts):
# `kvaudit explain --all-startups -f json` of every log in fixtures/corpus, fixtures/samples and
# fixtures/*classes*, stdout, stderr and exit status of each, written under OUTDIR. Run it on both trees, then
# `diff -r OUT_BEFORE OUT_AFTER`.   usage: bench/same_answers.sh TREE OUTDIR
set -eu
tree=$(cd "$1" && pwd); mkdir -p "$2"; out=$(cd "$2" && pwd)
py=${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
cd "$tree"
find fixtures/corpus fixtures/samples fixtures/*classes* -type f -name '*.log' | sort > "$out/list"
export py out
xargs -P "${JOBS:-2}" -I{} sh -c 'n=$(echo "$1" | tr / _); nice "$py" -m kvaudit explain --all-startups -f json "$1" \
  > "$out/$n.out" 2> "$out/$n.err"; echo $? > "$out/$n.rc"' _ {} < "$out/list"
echo "$(wc -l < "$out/list") logs -> $out"
