#!/usr/bin/env python3
"""The corpus of real startup logs (fixtures/corpus/): one line per log for a person to read, and its INDEX.

    python scripts/corpus.py            # engine, version, status, verdict, findings, exit, per log (make corpus)
    python scripts/corpus.py --index    # rewrite fixtures/corpus/INDEX.md from corpus.json (a test keeps them equal)
    python scripts/corpus.py --add NEW.json   # merge {name: entry} into corpus.json (refuses a name already there)

Every log's provenance and the truth established for it live in fixtures/corpus/corpus.json; the test
tests/test_corpus.py holds each log to that truth. README.md ("Adding a log to the corpus") says how to add one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fixtures" / "corpus"
sys.path.insert(0, str(ROOT))

COLUMNS = ("log", "source", "date", "engine / version", "model", "GPU", "flags", "key numbers (verbatim)", "truth")


def entries() -> dict:
    return json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))["logs"]


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def index_text() -> str:
    doc = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))
    lines = ["# Corpus of real startup logs", "", *doc["about"], "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, e in sorted(doc["logs"].items()):
        lines.append("| " + " | ".join(cell(v) for v in (
            f"`{name}.log`" + (f" (config `{e['config']}`)" if e.get("config") else ""), e["source"], e["date"],
            e["version"], e["model"], e["gpu"], e["flags"], e["key_numbers"], e["truth"])) + " |")
    return "\n".join(lines) + "\n"


def add(path: str) -> int:
    doc = json.loads((CORPUS / "corpus.json").read_text(encoding="utf-8"))
    new = json.loads(Path(path).read_text(encoding="utf-8"))
    taken = sorted(set(new) & set(doc["logs"]))
    if taken:
        print(f"already in the corpus: {', '.join(taken)}", file=sys.stderr)
        return 1
    missing = [n for n in new if not (CORPUS / f"{n}.log").is_file()]
    if missing:
        print(f"no log file for: {', '.join(missing)} (put it in {CORPUS} first)", file=sys.stderr)
        return 1
    doc["logs"].update(new)
    (CORPUS / "corpus.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (CORPUS / "INDEX.md").write_text(index_text(), encoding="utf-8")
    print(f"added {', '.join(new)}; INDEX.md rewritten")
    return 0


def main(argv: list[str]) -> int:
    if "--add" in argv:
        return add(argv[argv.index("--add") + 1])
    if "--index" in argv:
        (CORPUS / "INDEX.md").write_text(index_text(), encoding="utf-8")
        print(f"wrote {CORPUS / 'INDEX.md'}")
        return 0
    from kvaudit.verdict import judge
    from tests.corpus_run import audit_entry

    for name, e in sorted(entries().items()):
        try:
            a = audit_entry(name, e)
        except Exception as exc:  # a line per log, whatever happens: this is for reading
            print(f"{name:16} {e['engine']:7} error: {exc}")
            continue
        j = judge(a)
        codes = ",".join(f.code for f in a.findings) or "-"
        print(f"{name:16} {a.engine:7} {a.engine_version:16} exit {int(j.exit_status)}  {j.label:9} "
              f"{a.formula.verdict.value:9} {codes}")
        print(f"{'':16} {j.headline[:140]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
