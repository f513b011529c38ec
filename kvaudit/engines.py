"""The registry of engines: each brings its words (what tells its log from the others'), a parser (its log
grammar) and a formula module.

Adding an engine means writing ``parse/<engine>.py`` (its words in ``parse/vocabulary.py``) and
``reconcile/<engine>.py`` (or a package) and adding one :class:`Engine` line here; nothing else in kvaudit changes.
Telling which engine wrote a log needs only the words: a grammar is imported when its engine's lines are parsed,
a formula when its engine's startup is audited (``explain`` of an SGLang log loads neither of the other three).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from kvaudit.parse.interface import EngineParser, Startup
from kvaudit.parse.memory_lines import ANCHORS as MEMORY_ANCHORS
from kvaudit.parse.request_time import ANCHORS as SERVING_ANCHORS
from kvaudit.parse.vocabulary import LMDeployWords, SGLangWords, TRTLLMWords, VLLMWords
from kvaudit.platforms import ANCHORS as PLATFORM_ANCHORS
from kvaudit.reconcile.interface import Audit, AuditOptions, WhatIf
from kvaudit.verdict import settle
from kvaudit.record import record

if TYPE_CHECKING:  # the host commands load only for check (explain starts without them)
    from kvaudit.collect.commands import StartupWindow


class Words(Protocol):
    """An engine's words (kvaudit.parse.vocabulary): what tells its log before its grammar is loaded."""

    name: str
    anchors: tuple[bytes, ...]
    markers: tuple[str, ...]
    request_markers: tuple[str, ...]
    ready: tuple[str, ...]
    serving: str


#: each engine's parser, made the first time its lines are parsed (a parser holds no state between logs)
_PARSERS: dict[str, EngineParser] = {}


@record
class Engine:
    """An engine kvaudit audits: its words (to tell its log and select its lines), its grammar, loaded when its
    lines are parsed, and its formula package, loaded only when a startup of this engine is audited (the CLI
    starts without the other engines' grammars and formulas)."""

    name: str
    display: str
    words: type[Words]
    #: ``module:class`` of its grammar's parser (a :class:`EngineParser` whose words are ``words``)
    grammar: str
    #: the package with ``reconcile(startup, opts, startups_total)`` and ``whatif(startup, opts, audit, new)``
    formula: str
    process_names: tuple[str, ...] = ()  # what its systemd units and process titles contain (lower case)
    #: the module with ``audit_endpoint(documents, url, opts)`` (the audit of a live server from its own HTTP
    #: documents, None when they are not its own) and ``PATHS`` (each document as the paths it has been served
    #: at, newest first); None when the engine serves none kvaudit reads
    endpoint_module: str | None = None

    @property
    def ready(self) -> tuple[str, ...]:
        """The lines the engine prints once its startup is over and it serves (each ends the line: a suffix match):
        a running server's journal is read up to this line (kvaudit.collect.commands.StartupWindow)."""
        return self.words.ready

    @property
    def parser(self) -> EngineParser:
        """Its grammar's parser, the grammar imported on first use."""
        p = _PARSERS.get(self.name)
        if p is None:
            module, cls = self.grammar.split(":")
            p = _PARSERS[self.name] = getattr(import_module(module), cls)()
        return p

    def preload(self) -> None:
        """Import its grammar and formula now (``kvaudit explain`` does it while its scanner reads a log)."""
        self.parser  # noqa: B018 - the property imports the grammar
        import_module(self.formula)

    @property
    def reconcile(self) -> Callable[[Startup, AuditOptions, int], Audit]:
        return import_module(self.formula).reconcile

    @property
    def whatif(self) -> Callable[[Startup, AuditOptions, Audit, AuditOptions], WhatIf]:
        return import_module(self.formula).whatif

    @property
    def plan(self) -> Callable[..., Any] | None:
        """``plan(plan_input, history_frame)`` when kvaudit plans this engine's deployments, else None."""
        return getattr(import_module(self.formula), "plan", None)

    @property
    def endpoint(self) -> Callable[[Mapping[str, str], str, AuditOptions], Audit | None] | None:
        return import_module(self.endpoint_module).audit_endpoint if self.endpoint_module else None

    @property
    def endpoint_paths(self) -> tuple[tuple[str, ...], ...]:
        return import_module(self.endpoint_module).PATHS if self.endpoint_module else ()

    def audit(self, startup: Startup, opts: AuditOptions, startups_total: int) -> Audit:
        """The engine's audit of one startup, its findings settled by the shared verdict rules."""
        return settle(unprefixed_note(on_platform(self.reconcile(startup, opts, startups_total), opts), startup,
                                      self.display), opts.model_geometry)


def unprefixed_note(a: Audit, startup: Startup, display: str) -> Audit:
    """Say which lines were not read for lacking the engine's log prefix (kvaudit.parse.interface.anchored)."""
    skipped = startup.unprefixed
    if not skipped:
        return a
    shown = ", ".join(str(n) for n in skipped[:5]) + (f" and {len(skipped) - 5:,} more" if len(skipped) > 5 else "")
    note = (f"{len(skipped):,} line{'s' if len(skipped) != 1 else ''} with {display}'s words but without its log "
            f"prefix {'were' if len(skipped) != 1 else 'was'} not read (line{'s' if len(skipped) != 1 else ''} "
            f"{shown}): the log's other lines carry the prefix, so these are another program's output or text "
            "echoed into the log, not the engine's logger")
    return replace(a, notes=a.notes + (note,))


def on_platform(a: Audit, opts: AuditOptions) -> Audit:
    """The platform an audit ran on, named in the audit, with what T means there (kvaudit.platforms)."""
    p = opts.platform
    if p is None or p.kind == "discrete":
        return a
    return replace(a, platform=p.name, platform_kind=p.kind, notes=a.notes + (f"{p.name}: {p.meaning}",))



ENGINES: tuple[Engine, ...] = (
    Engine("sglang", "SGLang", SGLangWords, "kvaudit.parse.sglang:SGLangParser", "kvaudit.reconcile.sglang",
           ("sglang",), "kvaudit.reconcile.sglang.endpoint"),
    Engine("vllm", "vLLM", VLLMWords, "kvaudit.parse.vllm:VLLMParser", "kvaudit.reconcile.vllm", ("vllm",),
           "kvaudit.reconcile.vllm.endpoint"),
    Engine("trtllm", "TensorRT-LLM", TRTLLMWords, "kvaudit.parse.trtllm:TRTLLMParser", "kvaudit.reconcile.trtllm",
           ("trtllm", "tensorrt_llm", "tensorrt-llm", "tritonserver", "dynamo"), "kvaudit.reconcile.trtllm.endpoint"),
    Engine("lmdeploy", "LMDeploy", LMDeployWords, "kvaudit.parse.lmdeploy:LMDeployParser",
           "kvaudit.reconcile.lmdeploy", ("lmdeploy",), "kvaudit.reconcile.lmdeploy.endpoint"),
)

#: words (lower case) that, in the last lines of a server's invocation, say more than serving: a crash, an OOM
#: at run time, a kill, an engine's failure wording (each grammar's failures carry one: "No available memory",
#: "CUDA out of memory", "Executor creation failed", "No free blocks left", "max seq len", SGLang's sigquit).
#: With one there, the invocation is read to its end, as the audit of a failed server needs.
TAIL_WORDS = ("error", "exception", "traceback", "killed", "fail", "memory", "no free blocks", "max seq len",
              "sigquit", "abort")


def startup_window() -> StartupWindow:
    """Where a running server's startup ends in its journal (kvaudit.collect.commands.StartupWindow): each
    engine's markers and ready lines; the tail words, with every marker and ready line (another startup in one
    invocation, a wrapper restarting the engine: read it all)."""
    from kvaudit.collect.commands import StartupWindow

    markers = tuple((i, m) for i, e in enumerate(ENGINES) for m in e.words.markers)
    ready = tuple((i, r) for i, e in enumerate(ENGINES) for r in e.ready)
    # a marker shorter than 8 characters ("vLLM", "[TM][") is in the lines a server logs while it serves
    words = TAIL_WORDS + tuple(t.lower() for _, t in markers + ready if len(t) >= 8)
    return StartupWindow(markers, ready, tuple(dict.fromkeys(words)))

#: engines we recognise but cannot audit yet: their tell-tale strings, to say so instead of "no startup found"
RECOGNISED_ONLY: dict[str, tuple[str, ...]] = {
    "TGI": ("text_generation_launcher", "text_generation_router"),
}


def all_anchors() -> tuple[bytes, ...]:
    """The union of the engines' anchors (recognised-only engines are told from the input's head instead)."""
    seen: dict[bytes, None] = {}
    for e in ENGINES:
        for a in e.words.anchors:
            seen[a] = None
    for a in PLATFORM_ANCHORS:  # the lines that name a unified-memory platform
        seen[a] = None
    for a in MEMORY_ANCHORS:  # any line stating an amount of memory: read, or listed as not interpreted
        seen[a] = None
    for a in SERVING_ANCHORS:  # the lines a server prints once it serves (kvaudit.parse.request_time)
        seen[a] = None
    return tuple(seen)


def process_names() -> tuple[str, ...]:
    """Every engine's unit/process name fragments, for finding a host's engine unit and its processes."""
    return tuple(n for e in ENGINES for n in e.process_names)


def endpoint_paths() -> tuple[tuple[str, ...], ...]:
    """Every engine's endpoint documents, in engine order, each once."""
    return tuple(dict.fromkeys(doc for e in ENGINES for doc in e.endpoint_paths))


def endpoint_documents() -> str:
    """What the engines read from a live server, for a message: ``SGLang /server_info, vLLM /version /metrics``."""
    return ", ".join(f"{e.display} " + " ".join(names[0] for names in e.endpoint_paths)
                     for e in ENGINES if e.endpoint_paths)


def audit_endpoint(documents: Mapping[str, str], url: str, opts: AuditOptions) -> Audit | None:
    """The first engine whose documents these are audits them; None when none of them recognises them."""
    for e in ENGINES:
        if e.endpoint is not None:
            a = e.endpoint(documents, url, opts)
            if a is not None:
                return settle(a, opts.model_geometry)
    return None


def by_name(name: str) -> Engine:
    for e in ENGINES:
        if e.name == name:
            return e
    raise KeyError(name)
