"""Known findings, acknowledged: ``--ignore CODE[@HOST]`` and a baseline file (as pip-audit's
``--ignore-vuln``), so a warning the team has accepted does not mail every night. An ignored finding still
appears in every report, marked ``ignored``; it no longer counts toward the status, the exit code or the
Prometheus counts.

A *state* is acknowledged the same way (``STATES``: ``NO_GPU_READINGS``, ``NO_CONFIG``), so that a fleet of
endpoints or pods that by design give no GPU readings can be green.

Baseline file: one rule per line, ``CODE`` or ``CODE@HOST`` (``HOST`` a glob on the host's name or target),
``#`` comments. A code that kvaudit does not emit is an error (a typo would silently ignore nothing). The file is
read only when it is a regular file of at most 1 MiB (a FIFO, a device or a huge file is refused before anything
is read), and it is a baseline only when every line parses as a rule: any other file (``/etc/shadow``, a
credentials file) is refused by its name and line number, never by its text."""

from __future__ import annotations

from kvaudit.collect.interface import NO_CONFIG, SMI_FAILED, SMI_MISSING
from kvaudit.errors import KvauditError
from kvaudit.record import record
import fnmatch
from dataclasses import replace


class IgnoreError(KvauditError):
    pass


#: a baseline is a short list of rules
MAX_BASELINE_BYTES = 1 << 20


#: states a target may be in by design, acknowledged like a finding (``--ignore NO_GPU_READINGS@k8s:*``): a live
#: endpoint or a pod without exec rights gives no GPU readings, a pod's config.json is inside the pod. Each
#: names the beginnings of the collector's sentences for that state (kvaudit.collect.session, kvaudit.check).
#: An acknowledged state no longer makes the host partial; the sentence stays in the host's notes, marked.
STATES: dict[str, tuple[str, ...]] = {
    "NO_GPU_READINGS": ("no GPU readings", SMI_MISSING, SMI_FAILED),
    "NO_CONFIG": (NO_CONFIG,),
}


@record
class IgnoreRule:
    code: str
    host: str | None = None  # glob; None: every host

    def matches(self, code: str, names: tuple[str, ...]) -> bool:
        return code == self.code and (self.host is None or any(fnmatch.fnmatchcase(n, self.host) for n in names))


def parse(rules: list[str], baseline: str | None = None) -> tuple[IgnoreRule, ...]:
    from kvaudit.reconcile.findings import CODES
    from kvaudit.reconcile.interface import Severity

    from kvaudit.safefile import read_regular

    texts = [(r, "--ignore", True) for r in rules]
    if baseline:
        raw = read_regular(baseline, MAX_BASELINE_BYTES, "--baseline", IgnoreError)
        try:
            lines = raw.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            raise IgnoreError(f"--baseline {baseline}: not UTF-8 text, not a baseline") from None
        texts += [(line.split("#", 1)[0].strip(), f"{baseline}:{i}", False) for i, line in enumerate(lines, 1)]
    out = []
    for text, where, echo in texts:
        if not text:
            continue
        code, _, host = text.partition("@")
        code = code.strip().upper()
        if code not in CODES and code not in STATES:
            said = f"{text!r}: no finding has code {code!r}" if echo else "not CODE or CODE@HOST with a code kvaudit "\
                "emits, so not a baseline"
            raise IgnoreError(f"{where}: {said} (codes: docs/findings.md; states: {', '.join(STATES)})")
        if code in CODES and CODES[code] is Severity.ERROR:
            # a failed start is never acknowledged: the one thing a health check and a fleet must always say
            raise IgnoreError(f"{where}: {code} is an error (the startup failed or ran out of memory) and cannot be "
                              "acknowledged: fix the start, or leave the host out of the run (fleet --limit)")
        out.append(IgnoreRule(code, host.strip() or None))
    return tuple(out)


def apply(h, rules: tuple[IgnoreRule, ...], *names: str | None):
    """The host's audit with matching findings marked ignored (``names``: how the host is called: its report
    name, its target, its own host name)."""
    if not rules:
        return h
    called: tuple[str, ...] = tuple(n for n in names if n)

    def mark(findings):
        return tuple(replace(f, ignored=True) if any(r.matches(f.code, called) for r in rules) else f
                     for f in findings)

    audit = replace(h.audit, findings=mark(h.audit.findings)) if h.audit is not None else None
    h = replace(h, audit=audit, findings=mark(h.findings))
    accepted = [code for code in STATES if any(r.matches(code, called) for r in rules)]
    if not accepted or h.collected is None or not h.collected.partial:
        return h
    kept, said = [], []
    for text in h.collected.partial:
        code = next((c for c in accepted if text.startswith(STATES[c])), None)
        (said.append(f"acknowledged ({code}): {text}") if code else kept.append(text))
    if not said:
        return h
    return replace(h, collected=replace(h.collected, partial=tuple(kept)), notes=h.notes + tuple(said))


def apply_audit(a, rules: tuple[IgnoreRule, ...]):
    """``explain``: an audit of a log with matching findings marked ignored (host-less rules only match)."""
    if not rules:
        return a
    return replace(a, findings=tuple(replace(f, ignored=True) if any(r.matches(f.code, ()) and r.host is None
                                                                      for r in rules) else f for f in a.findings))
