"""Command line: argument handling and exit codes only; the work happens in kvaudit.explain."""

from __future__ import annotations

import os
import sys
from copy import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, BinaryIO, Optional

import typer

from kvaudit import __version__
from kvaudit.errors import KvauditError
from kvaudit.status import ExitStatus
from kvaudit.textsafe import printable


@dataclass
class Environment:
    """What the CLI touches outside itself; tests pass their own (httpie's pattern)."""

    stdin: BinaryIO = field(default_factory=lambda: sys.stdin.buffer)
    stdout: IO[str] = field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = field(default_factory=lambda: sys.stderr)
    stdout_isatty: bool = field(default_factory=lambda: sys.stdout.isatty())
    stderr_isatty: bool = field(default_factory=lambda: sys.stderr.isatty())
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))


_env = Environment.__new__(Environment)  # replaced by run()

# Typer re-exports BadParameter but not its bases; older Typer releases take them from click, newer ones
# vendor click. Reaching them through the MRO works with both.
#: typer's own click (typer 0.26-0.28 vendors it): its usage error and the error every click error derives from
_UsageError: Any = typer.BadParameter.__mro__[1]
_CliError: Any = _UsageError.__mro__[1]

_typer_metavar = typer.core.TyperArgument.make_metavar


def _usage_metavar(self, ctx, *args, usage: bool = False, **kw):  # noqa: ANN001
    """An argument in the usage line as POSIX and --help everywhere write it (``FILE``, ``[B]``), not typer 0.28's
    ``{file}`` (issue 38, item 6)."""
    if not usage:
        return _typer_metavar(self, ctx, *args, usage=usage, **kw)
    var = (self.metavar or self.name or "").upper() + ("..." if self.nargs != 1 else "")
    return var if self.required else f"[{var}]"


typer.core.TyperArgument.make_metavar = _usage_metavar  # type: ignore[method-assign]

app = typer.Typer(
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Explain where an LLM inference server's GPU memory went, to the digit.",
)


#: --help panels
WHERE, ASSUME, TIME, OUT = "Where to read", "What to assume", "Time and parallelism", "Output"


def _opt(panel: str, *args, **kw):
    """An option shown under ``panel`` in --help (rich's panels: where to read, what to assume, output...); a
    flag (a bool) shows no ``<bool>`` metavar."""
    if args and isinstance(args[0], bool):
        kw.setdefault("metavar", "")
    return typer.Option(*args, rich_help_panel=panel, **kw)


class Fail(KvauditError):
    """A clean, one-line failure of the command line itself, with its exit status."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.BAD_INPUT):
        super().__init__(message, int(status))


def _version(value: bool) -> None:
    if value:
        _env.stdout.write(f"kvaudit {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """kvaudit reruns the engine's own KV-cache formula on its logs and accounts for every GiB per GPU."""


FORMAT_HELP = "Output format: text, json or markdown."


# Options several commands share, declared once: the same flag says the same thing in every command.
FORMAT = _opt(OUT, "text", "--format", "-f", metavar="[text|json|markdown]", help=FORMAT_HELP)
COLOR = _opt(OUT, "auto", "--color", metavar="[auto|always|never]",
             help="Colour: auto, always or never (auto: on a terminal, unless NO_COLOR).")
OUTPUT = _opt(OUT, None, "--output", "-o", help="Write the report here, not to stdout.")
THRESHOLD = _opt(ASSUME, [], "--threshold", help="Override a finding threshold: NAME=VALUE.")
IGNORE = _opt(OUT, [], "--ignore", help="Acknowledge a finding: CODE or CODE@HOST (shown, marked, not counted).")
BASELINE = _opt(OUT, None, "--baseline", help="A file of acknowledged findings, one CODE[@HOST] per line.")
CONFIG = _opt(WHERE, None, "--config",
              help="kvaudit.toml with defaults (default: ./kvaudit.toml when present, announced).")
NO_CONFIG = _opt(WHERE, False, "--no-config", help="Read no kvaudit.toml.")
SSH_CONFIG = _opt(WHERE, None, "--ssh-config", "-F", help="ssh_config file (default ~/.ssh/config).")
ACCEPT_NEW_HOST_KEY = _opt(WHERE, False, "--accept-new-host-key",
                           help="Trust and record an unknown host key (never a changed one).")
JOURNAL_DIRECTORY = _opt(WHERE, None, "--journal-directory",
                         help="Read the journal from this directory on the host (journalctl --directory).")
TIMEOUT = _opt(TIME, None, "--timeout", min=1.0, help="Deadline for the whole host, seconds (120).")
CONNECT_TIMEOUT = _opt(TIME, None, "--connect-timeout", min=0.1,
                       help="TCP/SSH connect timeout, seconds (ssh_config's ConnectTimeout, else 10).")
KUBECONFIG = _opt(WHERE, None, "--kubeconfig",
                  help="For k8s: targets (default KUBECONFIG, ~/.kube/config, in-cluster).")
SOURCE = _opt(WHERE, None, "--source", help="docker:NAME or file:PATH instead of the journal.")
CONTEXT = _opt(WHERE, None, "--context", help="For k8s: targets: the kubeconfig context (as kubectl's --context).")
NAMESPACE = _opt(WHERE, None, "--namespace", "-n",
                 help="For k8s:/POD (or k8s: -l): the namespace (as kubectl's -n; default: the context's).")
STARTUP = _opt(ASSUME, None, "--startup", help="Which startup: 1 = first, -1 = latest (default).")


def _color(mode: str) -> bool:
    if mode not in ("auto", "always", "never"):
        raise Fail(f"--color {mode!r}: choose one of auto, always, never")
    if mode == "always":
        return True
    if mode == "never" or "NO_COLOR" in _env.environ:
        return False
    return _env.stdout_isatty


def _thresholds(pairs: list[str]):
    from kvaudit.reconcile.interface import Thresholds

    values: dict[str, float] = {}
    for p in pairs:
        key, sep, val = p.partition("=")
        if not sep:
            raise Fail(f"--threshold {p!r}: expected NAME=VALUE (names: {', '.join(Thresholds.names())})")
        try:
            values[key.strip()] = float(val)
        except ValueError:
            raise Fail(f"--threshold {p!r}: {val!r} is not a number") from None
    try:
        return Thresholds().with_overrides(values)
    except ValueError as exc:
        raise Fail(str(exc)) from None


def _open_log(file: str):
    from kvaudit.explain import read_log
    from kvaudit.parse.lines import InputError

    try:
        if file == "-":
            if _isatty(_env.stdin):  # a person at a terminal would otherwise wait for a prompt that never comes
                _env.stderr.write("kvaudit: reading the log from standard input (end it with Ctrl-D; "
                                  "kvaudit explain FILE reads a file)\n")
            return read_log(_env.stdin)
        p = Path(file)
        if p.is_dir():
            raise Fail(f"{file}: is a directory, not a log file")
        with p.open("rb") as fh:
            if fh.read(2) == b"\x1f\x8b" and p.is_file():  # a rotated log (logrotate's .gz): read through gzip
                from kvaudit.rotated import read_gzipped

                return read_gzipped(file, fh)
            fh.seek(0)
            return read_log(fh)
    except OSError as exc:
        raise Fail(f"cannot read {file}: {exc.strerror or exc}") from None
    except InputError as exc:
        raise Fail(f"{'stdin' if file == '-' else file}: {exc}") from None


def _isatty(stream) -> bool:  # noqa: ANN001
    try:
        return os.isatty(stream.fileno())
    except (OSError, ValueError, AttributeError):  # an in-memory stream (tests), a closed one
        return False


def _geometry(path: Optional[Path]):
    if path is None:
        return None
    from kvaudit.model_config import load_config

    if path.is_dir():  # the model's directory, as plan takes it: its config.json
        if not (path / "config.json").is_file():
            raise Fail(f"--model-config {path}: a directory without config.json; give the model's directory or its "
                       "config.json")
        path = path / "config.json"
    return load_config(path)


def _write(text: str, output: Optional[Path]) -> None:
    if output is None:
        _env.stdout.write(text)
        return
    from kvaudit.report.files import write_atomic

    try:
        write_atomic(output, text)  # whole or not at all: a reader never sees it half written
    except OSError as exc:
        raise Fail(f"cannot write {output}: {exc.strerror or exc}") from None


@app.command()
def explain(
    file: str = typer.Argument(..., help="The server's log file, or - to read standard input."),
    model_config: Optional[Path] = _opt(ASSUME, None, "--model-config", "-m", help="The model's config.json."),
    mem_fraction_static: Optional[float] = _opt(ASSUME, None, "--mem-fraction-static", min=0.01, max=1.0,
        help="The --mem-fraction-static the server ran with, when the log has no server_args."),
    tp_size: Optional[int] = _opt(ASSUME, None, "--tp-size", min=1, help="TP size, when the log does not say."),
    gpu_memory_gib: Optional[float] = _opt(ASSUME, None, "--gpu-memory-gib", min=0.1,
            help="The card's CUDA-visible total (GiB), to itemise what went before T."),
    fmt: str = FORMAT,
    startup: Optional[int] = STARTUP,
    all_startups: bool = _opt(ASSUME, False, "--all-startups", help="Audit every startup in the input."),
    threshold: list[str] = THRESHOLD,
    ignore: list[str] = _opt(OUT, [], "--ignore",
                             help="Acknowledge a finding: CODE (shown, marked, not counted)."),
    baseline: Optional[Path] = BASELINE,
    color: str = COLOR,
    output: Optional[Path] = OUTPUT,
) -> int:
    """Read a startup log and account for every GiB per GPU."""
    from kvaudit.explain import audit
    from kvaudit.reconcile.interface import AuditOptions
    from kvaudit.report.formats import choose
    from kvaudit.verdict import judge_audits

    chosen = choose(fmt)
    if startup is not None and all_startups:
        raise Fail("--startup and --all-startups exclude each other")
    opts = AuditOptions(
        source="stdin" if file == "-" else file,
        model_geometry=_geometry(model_config),
        mem_fraction_static=mem_fraction_static,
        tp_size=tp_size,
        gpu_capacity_gib=gpu_memory_gib,
        thresholds=_thresholds(threshold),
    )
    log = _open_log(file)
    rules = _ignore_rules(ignore, baseline)
    audits = audit(log, opts, startup, all_startups)
    if rules:
        from kvaudit import ignores

        audits = [ignores.apply_audit(a, rules) for a in audits]
    _write(chosen.audits(audits, color=_color(color) and output is None, width=_width(output)), output)
    return int(judge_audits(audits))


def _fraction(hi: float):
    """A what-if fraction's check, 0.01..hi, said in the help rather than as a range column (the flags then print
    whole at 80 columns)."""

    def check(value: Optional[float]) -> Optional[float]:
        if value is not None and not 0.01 <= value <= hi:
            raise typer.BadParameter(f"{value:g} is not in 0.01..{hi:g}")
        return value
    return check


def _positive(value: Optional[int]) -> Optional[int]:
    """A what-if count's check (>= 1), said without a range column."""
    if value is not None and value < 1:
        raise typer.BadParameter(f"{value} is not a positive count")
    return value


#: each engine's fraction, as its own CLI spells it (what-if speaks the engine's words)
FRACTION_FLAG = {"sglang": "--mem-fraction-static", "vllm": "--gpu-memory-utilization",
                 "trtllm": "--free-gpu-memory-fraction", "lmdeploy": "--cache-max-entry-count"}


@app.command()
def whatif(
    file: str = typer.Argument(..., help="The server's log file, or - to read standard input."),
    # the flags print whole at 80 columns: a short metavar, the range said in the help (_fraction checks it)
    mem_fraction_static: Optional[float] = _opt(ASSUME, None, "--mem-fraction-static", metavar="F",
            callback=_fraction(1.0), help="SGLang: the fraction to try (0.01-1)."),
    gpu_memory_utilization: Optional[float] = _opt(ASSUME, None, "--gpu-memory-utilization", metavar="F",
            callback=_fraction(1.0), help="vLLM: the utilization to try (0.01-1)."),
    free_gpu_memory_fraction: Optional[float] = _opt(ASSUME, None, "--free-gpu-memory-fraction", metavar="F",
            callback=_fraction(0.99), help="TensorRT-LLM: the kv_cache_config fraction to try (0.01-0.99)."),
    cache_max_entry_count: Optional[float] = _opt(ASSUME, None, "--cache-max-entry-count", metavar="F",
            callback=_fraction(0.99),
            help="LMDeploy: the cache_max_entry_count (a fraction of the free memory) to try (0.01-0.99)."),
    quant_policy: Optional[int] = _opt(ASSUME, None, "--quant-policy", metavar="N",
            help="LMDeploy: 0, 8 (int8 KV) or 4 (int4 KV)."),
    session_len: Optional[int] = _opt(ASSUME, None, "--session-len", metavar="N", callback=_positive,
            help="LMDeploy: the session length."),
    kv_cache_dtype: Optional[str] = _opt(ASSUME, None, "--kv-cache-dtype", help="e.g. fp8_e4m3, bf16, fp4_e2m1."),
    tp_size: Optional[int] = _opt(ASSUME, None, "--tp-size", metavar="N", callback=_positive,
            help="A different TP size (approximate)."),
    context_length: Optional[int] = _opt(ASSUME, None, "--context-length", metavar="N", callback=_positive,
            help="A different context length (TensorRT-LLM: max_seq_len)."),
    max_tokens: Optional[int] = _opt(ASSUME, None, "--max-tokens", metavar="N", callback=_positive,
            help="TensorRT-LLM: a max_tokens cap on the pool (kv_cache_config)."),
    model_config: Optional[Path] = _opt(ASSUME, None, "--model-config", "-m", help="The model's config.json."),
    log_fraction: Optional[float] = _opt(ASSUME, None, "--log-fraction", metavar="F", callback=_fraction(1.0),
            help="The fraction the logged startup ran with (the engine's own setting), when the log does not "
                 "say."),
    # the old SGLang-named spelling, kept working for scripts; --help shows the engine-neutral one
    log_mem_fraction_static: Optional[float] = typer.Option(None, "--log-mem-fraction-static", min=0.01, max=1.0,
                                                            hidden=True, help="The old name of --log-fraction."),
    fmt: str = _opt(OUT, "text", "--format", "-f", metavar="[text|json]", help="text or json."),
    startup: Optional[int] = STARTUP,
    threshold: list[str] = THRESHOLD,
    color: str = COLOR,
    output: Optional[Path] = OUTPUT,
) -> int:
    """Rerun the formula on the same log with other settings: tokens, reserve, and OOM risk."""
    from dataclasses import replace

    from kvaudit.explain import what_if
    from kvaudit.model_config import DTYPE_BYTES
    from kvaudit.reconcile.interface import AuditOptions

    from kvaudit.report.formats import choose

    chosen = choose(fmt, "whatif")
    if log_fraction is not None and log_mem_fraction_static is not None and log_fraction != log_mem_fraction_static:
        raise Fail("--log-fraction and --log-mem-fraction-static are one option: give it once")
    log_mem_fraction_static = log_fraction if log_fraction is not None else log_mem_fraction_static
    fractions = {flag: v for flag, v in (("--mem-fraction-static", mem_fraction_static),
                                         ("--gpu-memory-utilization", gpu_memory_utilization),
                                         ("--free-gpu-memory-fraction", free_gpu_memory_fraction),
                                         ("--cache-max-entry-count", cache_max_entry_count)) if v is not None}
    if len(fractions) > 1:
        raise Fail(f"{' and '.join(fractions)}: give the one fraction of the log's engine")
    fraction = next(iter(fractions.values()), None)
    if quant_policy is not None and quant_policy not in (0, 4, 8):
        raise Fail(f"--quant-policy {quant_policy}: LMDeploy's KV quantisation is 0 (none), 8 (int8) or 4 (int4)")
    lmdeploy_only = [flag for flag, v in (("--quant-policy", quant_policy), ("--session-len", session_len))
                     if v is not None]
    if all(v is None for v in (fraction, kv_cache_dtype, tp_size, context_length, max_tokens, quant_policy,
                               session_len)):
        raise Fail("whatif needs at least one of --mem-fraction-static (SGLang), --gpu-memory-utilization (vLLM), "
                   "--free-gpu-memory-fraction (TensorRT-LLM), --cache-max-entry-count (LMDeploy), --kv-cache-dtype, "
                   "--quant-policy, --tp-size, --context-length, --session-len, --max-tokens")
    if kv_cache_dtype is not None and kv_cache_dtype.replace("torch.", "").lower() not in DTYPE_BYTES:
        raise Fail(f"--kv-cache-dtype {kv_cache_dtype!r}: known types are "
                   + ", ".join(sorted(k for k in DTYPE_BYTES if "_" in k or k in ("bf16", "fp8", "auto"))))
    geom = _geometry(model_config)
    if (kv_cache_dtype or tp_size) and geom is None:
        raise Fail("--kv-cache-dtype and --tp-size need --model-config (bytes per token come from the model's "
                   "geometry)")
    base = AuditOptions(source="stdin" if file == "-" else file, model_geometry=geom,
                        mem_fraction_static=log_mem_fraction_static, thresholds=_thresholds(threshold))
    new = replace(base, mem_fraction_static=fraction or log_mem_fraction_static,
                  kv_cache_dtype=kv_cache_dtype or ({8: "int8", 4: "int4", 0: "auto"}.get(quant_policy)
                                                    if quant_policy is not None else None),
                  tp_size=tp_size, context_length=context_length or session_len, max_tokens=max_tokens)
    log = _open_log(file)
    if lmdeploy_only and log.engine.name != "lmdeploy":
        raise Fail(f"{' and '.join(lmdeploy_only)}: LMDeploy's settings; this is a {log.engine.display} log")
    if max_tokens is not None and log.engine.name != "trtllm":
        raise Fail(f"--max-tokens is TensorRT-LLM's kv_cache_config.max_tokens; this is a {log.engine.display} log")
    own = FRACTION_FLAG.get(log.engine.name)
    for flag in fractions:
        if own is not None and flag != own:
            # the engine's own words: a fraction of another engine means something else (of what, and when)
            raise Fail(f"{flag} is not {log.engine.display}'s setting; this is a {log.engine.display} log: use {own}")
    audit, w = what_if(log, base, new, startup)
    term = FRACTION_FLAG.get(log.engine.name, "--mem-fraction-static").lstrip("-").replace("-", "_")
    w = replace(w, changes={(term if k == "mem_fraction_static" else k): v for k, v in w.changes.items()})
    _write(chosen.whatif(audit, w, color=_color(color) and output is None, width=_width(output)), output)
    from kvaudit.verdict import judge_whatif

    return int(judge_whatif(w))


def _check_options(model_config, mem_fraction_static, unit, source, journal_directory, ssh_config,
                   accept_new_host_key, timeout, connect_timeout, startup, threshold):
    from kvaudit.check import CheckOptions
    from kvaudit.reconcile.interface import AuditOptions

    if source is not None and not (source.startswith("docker:") or source.startswith("file:")):
        raise Fail(f"--source {source!r}: use docker:NAME or file:PATH (the systemd journal is the default)")
    if source is not None and len(source.split(":", 1)[1]) == 0:
        raise Fail(f"--source {source!r}: the name or path is missing")
    return CheckOptions(
        audit=AuditOptions(model_geometry=_geometry(model_config), mem_fraction_static=mem_fraction_static,
                           thresholds=_thresholds(threshold)),
        unit=unit, source=source, journal_directory=journal_directory,
        ssh_config=str(ssh_config) if ssh_config else None, accept_new_host_key=accept_new_host_key,
        deadline_s=timeout, connect_timeout=connect_timeout, startup=startup,
    )


TARGET_HELP = ("user@host[:port], an ssh_config alias, 'local' (this machine), a capture directory, a pod "
               "(k8s:NAMESPACE/POD\\[/CONTAINER], or k8s:NAMESPACE -l SELECTOR), or a live server's "
               "http://HOST:PORT (its own endpoints, when the startup log is gone).")


def _check_target(target: str, endpoint_only: bool = False, selector: str | None = None,
                  namespace: str | None = None) -> None:
    """A target that cannot be one, said before anything is contacted."""
    from kvaudit.targets import is_endpoint, is_pod_target

    if is_pod_target(target) and not endpoint_only:
        bare = target[len("k8s:"):]
        if selector is None and bare and "/" not in bare:  # k8s:sglang-0: a namespace, with no pod and no -l
            raise Fail(f"{target} names the namespace {bare!r}, which needs -l SELECTOR; the pod {bare} is "
                       f"k8s:/{bare} (in the context's namespace, or -n NAMESPACE) or k8s:NAMESPACE/{bare}")
        from kvaudit.collect.kube import parse_target

        try:
            parse_target(target, selector, namespace)
        except ValueError as exc:
            raise Fail(str(exc)) from None
        return
    if selector is not None:
        raise Fail("-l/--selector goes with a k8s:NAMESPACE target")
    if namespace is not None:
        raise Fail("-n/--namespace goes with a k8s: target")

    if is_endpoint(target):
        from kvaudit.collect.endpoint import base_url

        try:
            base_url(target)
        except ValueError as exc:
            raise Fail(str(exc)) from None
        return
    if endpoint_only:
        raise Fail(f"--endpoint {target}: give the server's http://HOST:PORT")
    if "/" in target and not Path(target, "capture.json").is_file():  # host names hold no "/": a path was meant
        raise Fail(f"{target}: not a kvaudit capture directory (no capture.json); targets are user@host[:port], "
                   "an ssh_config alias, 'local', a capture directory, or http://HOST:PORT")


CONTAINER = _opt(WHERE, None, "--container", "-c",
                 help="A pod's container, as kubectl's -c: k8s:NS/POD -c NAME is k8s:NS/POD/NAME.")


def _with_container(target: str, container: str, selector: str | None) -> str:
    """``k8s:NS/POD -c NAME`` as kubectl means it: the pod's container. Anything else given -c is said: the model's
    config.json is -m/--model-config (an older kvaudit took -c for it)."""
    if container.endswith(".json") or "/" in container:
        raise Fail(f"-c {container}: -c is a pod's container, as in kubectl; the model's config.json is "
                   "-m/--model-config")
    if not target.startswith("k8s:") or selector is not None or target.count("/") != 1:
        raise Fail("-c names the container of one pod target (k8s:NAMESPACE/POD -c NAME), as kubectl's -c; the "
                   "model's config.json is -m/--model-config")
    return f"{target}/{container}"


@app.command()
def check(
    target: str = typer.Argument("local", help=TARGET_HELP),
    ssh_config: Optional[Path] = SSH_CONFIG,
    accept_new_host_key: bool = ACCEPT_NEW_HOST_KEY,
    unit: Optional[str] = _opt(WHERE, None, "--unit", help="The engine's systemd unit (default: found on the host)."),
    source: Optional[str] = SOURCE,
    journal_directory: Optional[str] = JOURNAL_DIRECTORY,
    model_config: Optional[Path] = _opt(ASSUME, None, "--model-config", "-m",
            help="A local config.json (default: read from model_path on the host)."),
    container: Optional[str] = CONTAINER,
    mem_fraction_static: Optional[float] = _opt(ASSUME, None, "--mem-fraction-static", min=0.01, max=1.0,
                                                 help="The fraction the server ran with, when the log has none."),
    timeout: Optional[float] = TIMEOUT,
    connect_timeout: Optional[float] = CONNECT_TIMEOUT,
    fmt: str = FORMAT,
    startup: Optional[int] = STARTUP,
    threshold: list[str] = THRESHOLD,
    color: str = COLOR,
    output: Optional[Path] = OUTPUT,
    textfile_dir: Optional[Path] = _opt(OUT, None, "--textfile-dir",
            help="Also write a Prometheus node_exporter textfile (kvaudit-check-HOST.prom) here."),
    endpoint: Optional[str] = _opt(WHERE, None, "--endpoint",
            help="The server's http://HOST:PORT: cross-check its live KV pool with the startup's."),
    kubeconfig: Optional[Path] = KUBECONFIG,
    context: Optional[str] = CONTEXT,
    namespace: Optional[str] = NAMESPACE,
    selector: Optional[str] = _opt(
        "Where to read", None, "--selector", "-l",
                help="k8s:NAMESPACE -l SELECTOR: every pod of a multi-node group, merged."),
    ignore: list[str] = IGNORE,
    baseline: Optional[Path] = BASELINE,
    config: Optional[Path] = CONFIG,
    no_config: bool = NO_CONFIG,
    health_check: bool = _opt(OUT, False, "--health-check",
            help="Print a health verdict (node or config problems) and exit on --exit-codes' scale: a status "
                 "line of <= 80 bytes (Nagios: with perfdata and one line per problem), or JSON with --format "
                 "json; deadline 4 s unless --timeout."),
    verbose: bool = _opt(OUT, False, "--verbose", "-v",
            help="Say on stderr what was tried: each command run on the host, its exit status, bytes and seconds."),
    nvsentinel_events: Optional[Path] = _opt(OUT, None, "--nvsentinel-events",
            help="Also write NVIDIA NVSentinel health events (HealthEvents JSON) to this file (docs/fleet.md)."),
    exit_codes: str = _opt(OUT, "nagios", "--exit-codes",
            help="With --health-check: nagios (0 ok, 1 config warning, 2 node problem, 3 unknown) or npd (0 ok or "
                 "config only, 1 node problem, 2 unknown)."),
) -> int:
    """Audit a live server: its startup log, its GPUs now, and what does not add up."""
    from kvaudit.check import check as run_check
    from kvaudit.report.formats import choose
    from kvaudit.verdict import judge_host

    chosen = choose(fmt)
    from kvaudit.health import SCALES, HEALTH_DEADLINE_S

    if exit_codes not in SCALES:
        raise Fail(f"--exit-codes {exit_codes!r}: choose one of {', '.join(SCALES)}")
    if health_check and (fmt not in ("text", "json") or output is not None):
        raise Fail("--health-check prints its verdict on stdout, as a status line or with --format json: drop "
                   "--output and other formats")
    if container is not None:
        target = _with_container(target, container, selector)
    _check_target(target, selector=selector, namespace=namespace)
    st = _host_settings(config, no_config, ssh_config=ssh_config, unit=unit, source=source,
                        journal_directory=journal_directory, accept_new_host_key=accept_new_host_key,
                        timeout=timeout if timeout is not None or not health_check else HEALTH_DEADLINE_S,
                        connect_timeout=connect_timeout, textfile_dir=textfile_dir)
    ssh_config = Path(st.ssh_config) if st.ssh_config else None
    unit, source, journal_directory = st.unit, st.source, st.journal_directory
    accept_new_host_key, timeout, connect_timeout = st.accept_new_host_key, st.timeout, st.connect_timeout
    textfile_dir = Path(st.textfile_dir) if st.textfile_dir else None
    threshold = [f"{k}={v}" for k, v in (st.thresholds or {}).items()] + list(threshold)
    rules = _ignore_rules(list(st.ignore or ()) + list(ignore),
                          baseline or (Path(st.baseline) if st.baseline else None))
    from kvaudit.fleet import preflight

    preflight.check(output=str(output) if output else None,
                    textfile_dir=str(textfile_dir) if textfile_dir else None,
                    ssh_config=str(ssh_config) if ssh_config else None)
    if endpoint is not None:
        _check_target(endpoint, endpoint_only=True)
    opts = _check_options(model_config, mem_fraction_static, unit, source, journal_directory, ssh_config,
                          accept_new_host_key, timeout, connect_timeout, startup, threshold)
    opts = replace(opts, kubeconfig=str(kubeconfig) if kubeconfig else None, selector=selector, context=context,
                   namespace=namespace)
    import time as _time

    t0 = _time.time()
    h = run_check(target, opts)
    if endpoint is not None:
        from kvaudit.check import cross_check

        h = cross_check(h, endpoint, opts)
    from kvaudit import ignores

    # a host is the name it was given, never what it reports (issue 21, item 5): a compromised host answering
    # "gpu-02" must not take gpu-02's acknowledgements or overwrite gpu-02's textfile. Only this machine's own
    # hostname ("check local", a node auditing itself) and a capture's recorded host (a replay stands in for
    # the host it recorded, by the operator's choice of directory) name the host.
    from kvaudit.check import is_local
    from kvaudit.collect import capture as capture_mod

    named_by_itself = is_local(target) or capture_mod.is_capture(target)
    own = h.collected.host if (h.collected and h.collected.host and named_by_itself) else None
    h = ignores.apply(h, rules, target, *([own] if own else []))
    if textfile_dir is not None:
        from kvaudit.report import prometheus

        name = own or target
        filename = prometheus.filename("check", name)
        # one file per host name: a check of another target under that name (a second capture of gpu-07, a
        # node auditing itself) replaces it, and says so (ux-audit2 item 7: it replaced it silently). The
        # comment line names the target a file came from (node_exporter's parser skips comments)
        said = f"# kvaudit check of {printable(target)}"
        try:
            before = (textfile_dir / filename).read_text(encoding="utf-8", errors="replace").split("\n", 1)[0]
        except OSError:
            before = ""
        if before.startswith("# kvaudit check of ") and before != said:
            _env.stderr.write(f"kvaudit: note: {textfile_dir / filename} (host {printable(name)}) was written from "
                              f"{before[len('# kvaudit check of '):]}; now from {printable(target)}: one textfile "
                              "per host name\n")
        try:
            prometheus.write(str(textfile_dir),
                             said + "\n" + prometheus.render([(name, h)], t0, _time.time() - t0, "check"), filename)
        except OSError as exc:
            raise Fail(f"cannot write the textfile to {textfile_dir}: {exc.strerror or exc}") from None
    if nvsentinel_events is not None:
        from kvaudit.report import nvsentinel
        from kvaudit.report.files import write_atomic

        try:
            write_atomic(nvsentinel_events, nvsentinel.render([(own or target, h)], _time.time()))
        except OSError as exc:
            raise Fail(f"cannot write the NVSentinel events to {nvsentinel_events}: {exc.strerror or exc}") from None
    if verbose:
        _say_what_was_tried(target, h)
    if health_check:
        from kvaudit.health import assess
        from kvaudit.report.json import dumps

        verdict = assess(own or target, h)
        if fmt == "json":
            _env.stdout.write(dumps(verdict.as_dict(exit_codes)))
        else:
            from kvaudit.health import render as render_health

            _env.stdout.write(render_health(verdict, exit_codes, _time.time() - t0))
        return verdict.exit_status(exit_codes)
    if h.error is not None:
        _env.stderr.write(f"kvaudit: {printable(target)}: {h.error.reason}: {printable(str(h.error))}\n")
    text = chosen.hosts([h], color=_color(color) and output is None, width=_width(output))
    if h.error is None or chosen.name == "json" or h.collected is not None:  # what was read, even without an audit
        _write(text, output)
    return int(judge_host(h).exit_status)


@app.command()
def capture(
    target: str = typer.Argument("local", help="user@host[:port], an ssh_config alias, 'local', or a pod (k8s:...)."),
    output: Path = _opt(OUT, ..., "--output", "-o", help="Directory to write the capture into."),
    ssh_config: Optional[Path] = SSH_CONFIG,
    accept_new_host_key: bool = ACCEPT_NEW_HOST_KEY,
    unit: Optional[str] = _opt(WHERE, None, "--unit", help="The engine's systemd unit."),
    source: Optional[str] = SOURCE,
    journal_directory: Optional[str] = JOURNAL_DIRECTORY,
    timeout: Optional[float] = TIMEOUT,
    connect_timeout: Optional[float] = CONNECT_TIMEOUT,
    kubeconfig: Optional[Path] = KUBECONFIG,
    context: Optional[str] = CONTEXT,
    namespace: Optional[str] = NAMESPACE,
    selector: Optional[str] = _opt(WHERE, None, "--selector", "-l", help="k8s:NAMESPACE -l SELECTOR: a pod group."),
    container: Optional[str] = CONTAINER,
    config: Optional[Path] = CONFIG,
    no_config: bool = NO_CONFIG,
) -> int:
    """Save everything check reads from a host into a directory (attach it to a ticket; check DIR replays it)."""
    from kvaudit.check import capture as run_capture
    from kvaudit.collect.interface import CollectError
    from kvaudit.status import for_error
    from kvaudit.targets import is_endpoint

    if is_endpoint(target):
        raise Fail(f"{target}: a live endpoint is not captured (its documents are small and change): "
                   "'kvaudit check URL --format json' keeps every figure it read (ranks[].logged)")
    if container is not None:
        target = _with_container(target, container, selector)
    _check_target(target, selector=selector, namespace=namespace)
    _not_another_hosts_capture(output, target)
    st = _host_settings(config, no_config, ssh_config=ssh_config, unit=unit, source=source,
                        journal_directory=journal_directory, accept_new_host_key=accept_new_host_key,
                        timeout=timeout, connect_timeout=connect_timeout)
    opts = _check_options(None, None, st.unit, st.source, st.journal_directory, st.ssh_config,
                          st.accept_new_host_key, st.timeout, st.connect_timeout, None, [])
    opts = replace(opts, kubeconfig=str(kubeconfig) if kubeconfig else None, selector=selector, context=context,
                   namespace=namespace)
    try:
        c, path = run_capture(target, opts, str(output))
    except CollectError as exc:
        _env.stderr.write(f"kvaudit: {printable(target)}: {exc.reason}: {printable(str(exc))}\n")
        return int(for_error(exc.reason))
    except OSError as exc:
        raise Fail(f"cannot write the capture to {output}: {exc.strerror or exc}") from None
    _env.stdout.write(f"captured {target}: {len(c.log_lines)} log lines, {len(c.gpus)} GPUs, "
                      f"{c.bytes_received:,} bytes received -> {path}\n")
    for p in c.partial:
        _env.stdout.write(f"  partial: {p}\n")
    return int(ExitStatus.PARTIAL_DATA if c.partial else ExitStatus.OK)


def _not_another_hosts_capture(output: Path, target: str) -> None:
    """``capture -o DIR`` replaces an earlier capture of the same target (a refresh), never another host's: that one
    may be the evidence attached to a ticket (issue 38, item 5). Said before the host is contacted."""
    import json

    meta = output / "capture.json"
    if output.is_symlink() or not meta.is_file():
        return  # a new or empty directory; anything else is the capture writer's to refuse
    try:
        with meta.open("rb") as fh:
            doc = json.loads(fh.read(1 << 20))
        earlier, earlier_host = doc.get("target"), doc.get("host")
    except (OSError, ValueError, AttributeError):
        earlier = earlier_host = None
    if earlier == target == "local":
        # every node's own capture is of "local": the machine it was taken on tells them apart
        import socket

        here = socket.gethostname()
        if isinstance(earlier_host, str) and earlier_host != here:
            raise Fail(f"-o {output}: holds the capture of {printable(earlier_host)[:200]} (local there); this is "
                       f"{printable(here)[:200]}: capture into another directory (or remove that one)")
    elif earlier != target:
        said = f"the capture of {printable(str(earlier))[:200]}" if isinstance(earlier, str) else "another capture"
        raise Fail(f"-o {output}: holds {said}; capture {target} into another directory (or remove that one)")


@app.command()
def fleet(
    inventory: Optional[str] = typer.Argument(
        None, help="Hosts file, Ansible inventory (INI or YAML); or omit and use --ssh-config with --hosts."),
    hosts: Optional[str] = _opt(WHERE, None, "--hosts", "--limit",
                                help="Ansible's --limit: a,b  gpu-*  GROUP  GROUP[0:3]  ~REGEX  !excluded  &required."),
    list_hosts: bool = _opt(WHERE, False, "--list-hosts", help="Print the hosts --limit selects (as ansible "
                                                              "--list-hosts does) and audit none."),
    config: Optional[Path] = CONFIG,
    no_config: bool = NO_CONFIG,
    ssh_config: Optional[Path] = SSH_CONFIG,
    parallel: Optional[int] = _opt(TIME, None, "--parallel", "-j", min=1, max=1024, help="Hosts at a time (8)."),
    timeout: Optional[float] = TIMEOUT,
    run_timeout: Optional[float] = _opt(TIME, None, "--run-timeout", min=1.0, help="Deadline for the run (1800)."),
    connect_timeout: Optional[float] = CONNECT_TIMEOUT,
    unit: Optional[str] = _opt(WHERE, None, "--unit", help="The engine's unit on every host."),
    source: Optional[str] = _opt(WHERE, None, "--source", help="docker:NAME or file:PATH on every host."),
    journal_directory: Optional[str] = JOURNAL_DIRECTORY,
    accept_new_host_key: bool = ACCEPT_NEW_HOST_KEY,
    fmt: str = FORMAT,
    output: Optional[Path] = OUTPUT,
    html: Optional[Path] = _opt(OUT, None, "--html", help="Also write a self-contained HTML report."),
    csv: Optional[Path] = _opt(OUT, None, "--csv", help="Also write one row per GPU as CSV."),
    parquet: bool = _opt(OUT, False, "--parquet", help="Write --csv's table as Parquet instead (needs pyarrow)."),
    textfile_dir: Optional[Path] = _opt(OUT, None, "--textfile-dir", help="Write a Prometheus textfile here."),
    history: Optional[Path] = _opt(OUT, None, "--history", help="SQLite file keeping every run (drift)."),
    threshold: list[str] = THRESHOLD,
    quiet: bool = _opt(OUT, False, "--quiet", "-q", help="No progress bar."),
    color: str = COLOR,
    kubeconfig: Optional[Path] = KUBECONFIG,
    context: Optional[str] = CONTEXT,
    namespace: Optional[str] = NAMESPACE,
    selector: Optional[str] = _opt(
        "Where to read", None, "--selector", "-l", help="With a k8s:NAMESPACE inventory: the pods to audit (one server "
                                                        "per pod or LeaderWorkerSet group)."),
    ignore: list[str] = IGNORE,
    baseline: Optional[Path] = BASELINE,
    model_config: Optional[Path] = _opt(ASSUME, None, "--model-config",
            help="The model's config.json for every host (a host's kvaudit_model_config wins): for pods and "
                 "endpoints, whose config.json kvaudit cannot read."),
    node: Optional[str] = _opt(WHERE, None, "--node",
            help="With k8s:NAMESPACE -l SELECTOR: only the servers on this node (a DaemonSet auditing its own "
                 "node: --node $(NODE_NAME)); a multi-node group where its leader runs."),
) -> int:
    """Audit many hosts in parallel; report, remember, and say what changed since the last run."""
    from kvaudit.fleet import inventory as inv
    from kvaudit.fleet import job, preflight, settings
    from kvaudit.report.formats import choose

    chosen = choose(fmt, "fleet")
    file_settings, _ = settings.load(str(config) if config else None, no_config, _announce)
    st = settings.merge(file_settings, parallel=parallel, timeout=timeout, run_timeout=run_timeout,
                        connect_timeout=connect_timeout, unit=unit, source=source,
                        journal_directory=journal_directory, ssh_config=str(ssh_config) if ssh_config else None,
                        accept_new_host_key=accept_new_host_key, history=str(history) if history else None,
                        textfile_dir=str(textfile_dir) if textfile_dir else None, html=str(html) if html else None,
                        csv=str(csv) if csv else None)
    rules = _ignore_rules(list(st.ignore or ()) + list(ignore),
                          baseline or (Path(st.baseline) if st.baseline else None))
    preflight.check(output=str(output) if output else None, html=st.html, csv=st.csv, parquet=parquet,
                    history=st.history, textfile_dir=st.textfile_dir, ssh_config=st.ssh_config)
    if inventory and inventory.startswith("k8s:"):
        fleet_hosts = inv.from_kubernetes(inventory, selector, str(kubeconfig) if kubeconfig else None,
                                          st.timeout, context, namespace, node)
    elif selector is not None:
        raise Fail("-l/--selector goes with a k8s:NAMESPACE inventory")
    elif namespace is not None:
        raise Fail("-n/--namespace goes with a k8s: inventory (k8s: -l SELECTOR)")
    elif node is not None:
        raise Fail("--node goes with a k8s:NAMESPACE -l SELECTOR inventory")
    elif inventory:
        fleet_hosts = inv.load(inventory, hosts, timeout=st.run_timeout)
    elif st.ssh_config and hosts:
        fleet_hosts = inv.from_ssh_config(st.ssh_config, hosts)
    else:
        raise Fail("name an inventory, or --ssh-config FILE with --hosts PATTERN")
    if list_hosts:
        from kvaudit.report.fleet import list_hosts_text

        _env.stdout.write(list_hosts_text(fleet_hosts))
        return 0
    pairs = [f"{k}={v}" for k, v in (st.thresholds or {}).items()] + list(threshold)
    opts = _check_options(model_config, None, st.unit, st.source, st.journal_directory, st.ssh_config,
                          st.accept_new_host_key, st.timeout, st.connect_timeout, None, pairs)
    opts = replace(opts, kubeconfig=str(kubeconfig) if kubeconfig else None, context=context)
    width = _width(output)
    outputs = job.Outputs(chosen, str(output) if output else None, st.html, st.csv, parquet, st.textfile_dir,
                          st.history, color=_color(color), width=width)
    provenance = {"kvaudit": __version__, "command": " ".join(["kvaudit", *map(str, sys.argv[1:])])
                  if sys.argv and sys.argv[0].endswith("kvaudit") else "kvaudit fleet",
                  "inventory": str(inventory or f"--ssh-config {st.ssh_config} --hosts {hosts}")}
    request = job.FleetJob(tuple(fleet_hosts), opts, st.parallel, st.run_timeout, outputs, rules,
                           _fleet_subject(inventory, st.ssh_config, hosts), provenance)
    progress = None
    if not quiet and _env.stderr_isatty:
        from kvaudit.report.progress import FleetProgress

        progress = FleetProgress(len(fleet_hosts), _env.stderr)
    return job.run(request, _env.stdout, _env.stderr, progress)


def _say_what_was_tried(target: str, h) -> None:  # noqa: ANN001
    """check -v: the commands run on the host (as recorded: no output), then where the log came from."""
    c = h.collected
    records = c.commands if c else ()
    _env.stderr.write(f"kvaudit: {printable(target)}: {len(records)} command(s) run"
                      + (f", {c.bytes_received:,} bytes received" if c else "") + "\n")
    for r in records:
        rc = "timed out" if r.rc is None else f"rc {r.rc}"
        _env.stderr.write(f"  {printable(r.command)[:300]}  ({rc}, {r.bytes_received:,} B, {r.seconds:.2f} s"
                          + (", cut" if r.truncated else "") + ")\n")
    if c is not None:
        _env.stderr.write(f"  log: {printable(c.source)}; GPUs: {printable(c.gpu_source or 'none')}; "
                          f"config: {printable(c.config_source or 'none')}\n")
    if h.error is not None:
        _env.stderr.write(f"  stopped: {h.error.reason}\n")


def _width(output: Optional[Path] = None) -> int:
    """The report's width, as gpustat, nvitop and kubectl take it: $COLUMNS when set (also when piped, as
    `COLUMNS=200 kvaudit fleet ... | less`); on a terminal its own width; piped, the width of the terminal the
    command was started from (its controlling terminal); else, and for a file (-o), 80. Never under 60."""
    cols = _env.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(60, int(cols))
    if output is not None:
        return 80
    if _env.stdout_isatty:
        import shutil

        return max(60, shutil.get_terminal_size((80, 24)).columns)
    if _env.stdout is sys.stdout:  # the process's own stdout, piped: the controlling terminal says the width
        return max(60, _controlling_terminal_columns() or 80)
    return 80


def _controlling_terminal_columns() -> int | None:
    """The width of the process's controlling terminal (/dev/tty), None without one (cron, CI, a service)."""
    import struct

    try:
        import fcntl
        import termios

        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            _, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        finally:
            os.close(fd)
        return cols or None
    except (OSError, ImportError, struct.error):
        return None


def _text_width() -> int:
    """A text report's width: $COLUMNS when set, the terminal's on a terminal, else 80 (as gpustat and kubectl);
    never under 60."""
    cols = _env.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(60, int(cols))
    if _env.stdout_isatty:
        import shutil

        return max(60, shutil.get_terminal_size((80, 24)).columns)
    return 80


def _announce(line: str) -> None:
    _env.stderr.write(f"kvaudit: {line}\n")


def _settings(config: Optional[Path], no_config: bool):
    """kvaudit.toml for check, capture and history (fleet reads it itself, with its own keys)."""
    from kvaudit.fleet import settings

    st, _ = settings.load(str(config) if config else None, no_config, _announce)
    return st


def _host_settings(config: Optional[Path], no_config: bool, **flags):
    """kvaudit.toml under the command's own flags (given flags win), as fleet merges them."""
    from kvaudit.fleet import settings

    return settings.merge(_settings(config, no_config),
                          **{k: str(v) if isinstance(v, Path) else v for k, v in flags.items()})


def _ignore_rules(ignore: list[str], baseline: Optional[Path]):
    if not ignore and not baseline:
        return ()  # nothing acknowledged: kvaudit.ignores (and the findings' codes) need not load
    from kvaudit import ignores

    return ignores.parse(list(ignore), str(baseline) if baseline else None)


def _fleet_subject(inventory: str | None, ssh_config: str | None, hosts: str | None) -> str:
    """What a fleet run audits, for its textfile's name and ``invocation`` label: the inventory's stem, the
    k8s namespace, or the ssh_config host pattern."""
    if inventory and inventory.startswith("k8s:"):
        return inventory[4:].split("/")[0]
    if inventory:
        return Path(inventory).stem
    return f"{Path(ssh_config or 'ssh_config').name}-{hosts or 'all'}"


@app.command("diff")
def diff_cmd(
    a: str = typer.Argument(..., help="A startup log (or a capture directory); alone: its last two startups. With "
                                      "--history: HOST@RUN, or HOST alone for its last two startups."),
    b: Optional[str] = typer.Argument(None, help="The other startup's log or capture directory (or HOST@RUN)."),
    model_config: Optional[Path] = _opt(ASSUME, None, "--model-config", "-m", help="The model's config.json."),
    history: Optional[str] = _opt(ASSUME, None, "--history",
                                  help="The fleet's history: A and B are startups it recorded (HOST@RUN)."),
    fmt: str = _opt(OUT, "text", "--format", "-f", metavar="[text|json]", help="text or json."),
) -> int:
    """Two startups side by side: every formula term and ledger item, and which terms moved the KV tokens."""
    from kvaudit.diff import as_dict, diff, render_text
    from kvaudit.report.formats import choose

    chosen = choose(fmt, "diff").name
    if history:
        left, right, labels = _recorded_pair(history, a, b)
    else:
        left, right, labels = _logged_pair(a, b, _geometry(model_config))
    d = diff(left, right, *labels)
    if chosen == "json":
        from kvaudit.report.json import dumps

        _env.stdout.write(dumps(as_dict(d)))
    else:
        _env.stdout.write(render_text(d, _text_width()))
    return 0


def _logged_pair(a: str, b: str | None, geom):
    """Two startups from logs or captures: A's last and B's last, or A's last two."""
    from kvaudit.explain import audit
    from kvaudit.reconcile.interface import AuditOptions

    def audits_of(where: str) -> list:
        from kvaudit.collect import capture as capture_mod

        if capture_mod.is_capture(where):
            from kvaudit.check import CheckOptions, check

            h = check(where, CheckOptions(AuditOptions(source=where, model_geometry=geom)))
            if h.audit is None:
                raise Fail(f"{where}: no startup could be audited ({h.error or 'no engine log'})")
            return [h.audit]
        return audit(_open_log(where), AuditOptions(source=where, model_geometry=geom), None, b is None)

    first = audits_of(a)
    if b is None:
        if len(first) < 2:
            raise Fail(f"{a}: one startup; give a second log (kvaudit diff A B), or a log with two startups")
        left, right = first[-2], first[-1]
        return left, right, (f"{a} startup {left.startup_index}", f"{a} startup {right.startup_index}")
    return first[-1], audits_of(b)[-1], (a, b)


@app.command("plan")
def plan_cmd(
    model: Optional[str] = typer.Argument(None, help="The model: its directory (config.json and the safetensors "
                                                     "headers, read for the exact weight bytes) or its config.json."),
    engine: Optional[str] = _opt(ASSUME, None, "--engine", help="The engine and its release, e.g. sglang==0.5.9."),
    gpu: Optional[str] = _opt(ASSUME, None, "--gpu", help="The card: a key (h100, a10g, l4, mi300x, ...) or its "
                                                         "nvidia-smi name; an unknown one names the keys."),
    gpu_memory_gib: Optional[float] = _opt(ASSUME, None, "--gpu-memory-gib",
                                           help="A card not in the list: its memory.total / 1024."),
    tp: int = _opt(ASSUME, 1, "--tp", help="Tensor-parallel size."),
    pp: int = _opt(ASSUME, 1, "--pp", help="Pipeline-parallel size."),
    dp_attention: int = _opt(ASSUME, 1, "--dp-attention", help="SGLang's data-parallel attention size."),
    fraction: Optional[float] = _opt(ASSUME, None, "--fraction",
                                     help="The engine's own fraction: SGLang mem_fraction_static, vLLM "
                                          "gpu_memory_utilization, TensorRT-LLM free_gpu_memory_fraction, LMDeploy "
                                          "cache_max_entry_count (default: the release's own)."),
    kv_dtype: str = _opt(ASSUME, "auto", "--kv-dtype", help="auto (the model's dtype), fp8_e4m3, ..."),
    context_length: Optional[int] = _opt(ASSUME, None, "--context-length", min=1,
                                         help="The requests' length, for the concurrency."),
    max_running_requests: Optional[int] = _opt(ASSUME, None, "--max-running-requests", min=1,
                                               help="SGLang max_running_requests, vLLM max_num_seqs, LMDeploy "
                                                    "max_batch_size: caps the concurrency."),
    page_size: Optional[int] = _opt(ASSUME, None, "--page-size", min=1,
                                    help="SGLang's page, vLLM's block_size, TensorRT-LLM's tokens_per_block, "
                                         "LMDeploy's block length."),
    backend: Optional[str] = _opt(ASSUME, None, "--backend", help="LMDeploy: turbomind (default) or pytorch."),
    draft: Optional[str] = _opt(ASSUME, None, "--draft", help="SGLang: the speculative draft model (its directory, "
                                                              "for its weights, or its config.json)."),
    speculative_algorithm: Optional[str] = _opt(ASSUME, None, "--speculative-algorithm",
                                                help="EAGLE (the default with --draft), EAGLE3 or STANDALONE."),
    max_total_tokens: Optional[int] = _opt(ASSUME, None, "--max-total-tokens", min=1,
                                           help="SGLang --max-total-tokens, TensorRT-LLM max_tokens: the pool's cap."),
    max_num_batched_tokens: Optional[int] = _opt(ASSUME, None, "--max-num-batched-tokens", min=1,
                                                 help="vLLM: the profile run's dummy batch (default: the release's)."),
    sampler: Optional[str] = _opt(ASSUME, None, "--sampler",
                                  help="vLLM: flashinfer or native (the sampler the profile run peaks in)."),
    post_capture_kv_sizing: bool = _opt(ASSUME, False, "--post-capture-kv-sizing",
                                        help="SGLang 0.5.16+: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 is set."),
    dtype: Optional[str] = _opt(ASSUME, None, "--dtype", help="The engine's --dtype (16-bit types are planned)."),
    quantization: Optional[str] = _opt(ASSUME, None, "--quantization",
                                       help="Runtime quantization: not modelled, refused by name."),
    cpu_offload_gib: Optional[float] = _opt(ASSUME, None, "--cpu-offload-gib",
                                            help="CPU offload of the weights: not modelled, refused by name."),
    history: Optional[str] = _opt(ASSUME, None, "--history",
                                  help="The fleet's history (SQLite): its startups calibrate the terms."),
    validate: Optional[str] = _opt(ASSUME, None, "--validate",
                                   help="Leave-one-out over a history's startups: the error of each prediction."),
    fmt: str = _opt(OUT, "text", "--format", "-f", metavar="[text|json|markdown]", help="text, json or markdown."),
) -> int:
    """Size a deployment before it exists: KV tokens, concurrency, and whether it starts, by the engine's own
    formula, every term calibrated on the fleet's history or said to be assumed."""
    from kvaudit.report.formats import choose

    chosen = choose(fmt, "plan")
    _needs_pandas("--validate" if validate else "--history" if history else None)
    if validate:
        from kvaudit.plan.validate import validate_history
        from kvaudit.plan_inputs import validation_rows
        from kvaudit.report.plan import render_validation

        _env.stdout.write(render_validation(validate_history(validate, validation_rows(validate)), fmt))
        return 0
    if model is None or engine is None:
        raise Fail("plan needs the model (a directory or its config.json) and --engine NAME==RELEASE")
    from kvaudit.plan.build import PlanRequest, exit_status, run
    from kvaudit.plan_inputs import history_rows

    p = run(PlanRequest(engine=engine, model=model, gpu=gpu, gpu_memory_gib=gpu_memory_gib, tp=tp, pp=pp,
                        dp_attention=dp_attention, fraction=fraction, kv_dtype=kv_dtype, context_length=context_length,
                        max_running_requests=max_running_requests, page_size=page_size,
                        max_total_tokens=max_total_tokens, history=history, backend=backend, draft=draft,
                        speculative_algorithm=speculative_algorithm, max_num_batched_tokens=max_num_batched_tokens,
                        sampler=sampler, dtype=dtype, quantization=quantization, cpu_offload_gib=cpu_offload_gib,
                        post_capture_kv_sizing=post_capture_kv_sizing),
            history_rows(history))
    _env.stdout.write(chosen.plan(p, width=_width()))
    return exit_status(p)  # 0 starts, 1 at risk or unknown, 3 will not start (docs/plan.md, "Exit status")


def _needs_pandas(flag: str | None) -> None:
    """plan calibrates on the history with pandas, which the default install leaves out (157 MB; issue 38, item 7):
    without it, one line says which extra brings it."""
    import importlib.util

    if flag is not None and importlib.util.find_spec("pandas") is None:
        raise Fail(f"plan {flag} analyses the fleet's history with pandas: pip install 'kvaudit[history]'")


def _recorded_pair(history: str, a: str, b: str | None):
    """Two startups the history recorded: HOST@RUN and HOST@RUN, or HOST alone (its last two startups)."""
    from kvaudit.diff import audit_of_record, recorded_at, recorded_last_two

    def at(ref: str):
        host, sep, run = ref.rpartition("@")
        if not sep or not run.isdigit() or not host or len(run) > 18:
            raise Fail(f"{ref!r}: a recorded startup is HOST@RUN (the run's number, as kvaudit history lists them)")
        return recorded_at(history, host, int(run))

    if b is None and "@" not in a:
        x, y = recorded_last_two(history, a)
    elif b is None:
        raise Fail("give the second startup: HOST@RUN (or HOST alone for its last two startups)")
    else:
        x, y = at(a), at(b)
    return (audit_of_record(x), audit_of_record(y), (f"{x.host}@{x.run_id}", f"{y.host}@{y.run_id}"))


@app.command("history")
def history_cmd(
    host: Optional[str] = typer.Argument(None, help="The host's name as the fleet report shows it (omit: list "
                                                    "the hosts and runs)."),
    history: Optional[Path] = _opt(OUT, None, "--history",
                                   help="The SQLite file fleet --history writes (default: kvaudit.toml's history)."),
    limit: int = _opt(OUT, 30, "--limit", min=1, help="How many runs back."),
    fmt: str = _opt(OUT, "text", "--format", "-f", metavar="[text|json]", help="text or json."),
    config: Optional[Path] = CONFIG,
    no_config: bool = NO_CONFIG,
) -> int:
    """A host's trend across fleet runs: status, tokens, free memory, findings."""
    import json as _json

    from kvaudit.fleet import history as hist
    from kvaudit.report.formats import choose

    fmt = choose(fmt, "history").name
    st = _settings(config, no_config)
    history = history or (Path(st.history) if st.history else None)
    if history is None:
        raise Fail("name the history file: --history FILE (or history = \"...\" in kvaudit.toml)")
    if not history.exists():
        raise Fail(f"history file {history} does not exist")
    if host is None:
        hosts, runs = hist.overview(str(history))
        if fmt == "json":
            _env.stdout.write(_json.dumps({"runs": runs, "hosts": hosts}, indent=2) + "\n")
            return 0
        from kvaudit.report.text import table

        _env.stdout.write(f"{history}: {len(runs)} run(s), {len(hosts)} host(s)\n")
        _env.stdout.write("\n".join(table(("run", "started", "hosts", "seconds"),
                                           [(str(r["id"]), r["started_at"], str(r["hosts"]), f"{r['duration_s']:.1f}")
                                            for r in runs[-10:]])) + "\n\n")
        _env.stdout.write("\n".join(table(("host", "runs", "last status", "last run"),
                                           [(h["host"], str(h["runs"]), h["status"], h["last_run"]) for h in hosts]))
                          + "\n")
        return 0
    rows = hist.host_history(str(history), host, limit)
    if not rows:
        raise Fail(f"{host}: not in {history}")
    if fmt == "json":
        _env.stdout.write(_json.dumps({"host": host, "runs": rows}, indent=2) + "\n")
        return 0
    from kvaudit.report.text import table

    def f(v, nd=2):  # noqa: ANN001
        return "-" if v is None else (f"{v:,}" if isinstance(v, int) else f"{v:.{nd}f}")

    # the run's number first: what ``diff HOST@RUN --history`` takes
    body: list[tuple[str, ...]] = [(str(r["run_id"]), str(r["started_at"]), str(r["status"]), f(r["tokens"]),
                                    str(r["verdict"] or "-"), f(r["free_min_gib"]), f(r["weights_gib"]),
                                    ",".join(r["findings"]) or "-") for r in rows]
    _env.stdout.write(f"{host}: {len(rows)} run(s); compare two with kvaudit diff {host}@RUN {host}@RUN "
                      f"--history {history}\n")
    _env.stdout.write("\n".join(table(("run", "started", "status", "tokens", "verdict", "free min", "weights",
                                        "findings"), body)) + "\n")
    return 0


class _Deferred(type):
    """A class standing in for one of rich's in typer.rich_utils (see :func:`_help_renderer`): calling it, or
    reading any attribute of it (``Traceback.from_exception``), loads the real class and hands over to it."""

    module: str

    def _real(cls) -> Any:
        from importlib import import_module

        return getattr(import_module(cls.module), cls.__name__)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls._real()(*args, **kwargs)

    def __getattr__(cls, attr: str) -> Any:
        return getattr(cls._real(), attr)


def _help_renderer() -> None:
    """typer renders --help through typer.rich_utils, whose first lines import rich.markdown (markdown_it) and
    rich.traceback (pygments, rich.pretty) for markdown markup and pretty tracebacks: kvaudit uses neither (rich
    markup; pretty_exceptions_enable=False), and they were a quarter of what --help executes (bench/README.md).
    rich_utils is imported here with stand-ins for those two classes, each loading the real one when first used; the
    help is the same."""
    if "typer.rich_utils" in sys.modules or not typer.core.HAS_RICH:
        return
    from importlib import import_module
    from types import ModuleType

    placed = []
    for module, name in (("rich.markdown", "Markdown"), ("rich.traceback", "Traceback")):
        if module not in sys.modules:
            stand_in = ModuleType(module)
            setattr(stand_in, name, _Deferred(name, (), {"module": module}))
            sys.modules[module] = stand_in
            placed.append((module, stand_in))
    try:
        import_module("typer.rich_utils")
    except ImportError:
        pass  # a typer that takes more from them: it imports the real modules when it renders, as without this
    finally:
        for module, stand_in in placed:
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]  # a later import of it loads the real module


def _invoked(argv: list[str]) -> typer.Typer:
    """The app with only the command ``argv`` names, when it names one: typer turns every command's signature into
    click parameters when it builds the group (a sixth of what ``explain`` of a small log executed, issue 40), and
    one command's run needs only its own. The root takes no option with a value, so the first word that is not an
    option is the command. Anything else (no command, an unknown one, the root's --help, completion) gets them all."""
    word = next((a for a in argv if not a.startswith("-")), None)
    for info in app.registered_commands:
        if word == _name(info):
            narrowed = copy(app)
            narrowed.registered_commands = [info]
            return narrowed
    if word is None and not any(k.endswith("_COMPLETE") or k.startswith("_TYPER_") for k in os.environ):
        # the root's --help (or a root option): the commands are listed, never run, so each is built from its name
        # and help alone, not its parameters; shell completion reads the parameters: it gets them all
        listed = copy(app)
        listed.registered_commands = [_listed(info) for info in app.registered_commands]
        return listed
    return app


def _name(info: Any) -> str:
    return info.name or typer.main.get_command_name(getattr(info.callback, "__name__", ""))


def _listed(info: Any) -> Any:
    """``info`` with a callback that takes no parameters and carries the command's docstring (typer's help for the
    command, as before): what the root's --help shows of a command, built without its ~15 options."""
    def listed_only() -> None:
        raise Fail(f"{info.name}: listed in --help only")  # never runs: a command word builds the real command

    listed_only.__doc__ = info.callback.__doc__
    stand_in = copy(info)
    stand_in.name, stand_in.callback = _name(info), listed_only
    return stand_in


def run(argv: list[str], env: Environment | None = None) -> int:
    """Run the CLI in-process and return its exit status; never raises, never prints a traceback
    (set KVAUDIT_DEBUG=1 to see one)."""
    global _env
    _env = env or Environment()
    if not argv or "--help" in argv:
        _help_renderer()
    command = typer.main.get_command(_invoked(argv))
    try:
        result = command.main(args=argv, prog_name="kvaudit", standalone_mode=False)
    except KvauditError as exc:  # every module's explained failure, with the exit status it means
        _env.stderr.write(f"kvaudit: error: {printable(str(exc))}\n")
        return _unless_health_check(argv, int(exc.status), str(exc))
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0))
    except typer.Abort:
        _env.stderr.write("kvaudit: aborted\n")
        return int(ExitStatus.INTERRUPTED)
    except _UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            ctx = getattr(exc, "ctx", None)
            _env.stdout.write((ctx.get_help() if ctx is not None else exc.format_message()) + "\n")
            return 0
        said = _usage_words(exc)
        _env.stderr.write(f"kvaudit: error: {printable(said)}\n")
        return _unless_health_check(argv, int(ExitStatus.BAD_INPUT), said)
    except _CliError as exc:
        _env.stderr.write(f"kvaudit: error: {printable(exc.format_message())}\n")
        return _unless_health_check(argv, int(ExitStatus.BAD_INPUT), exc.format_message())
    except KeyboardInterrupt:
        return int(ExitStatus.INTERRUPTED)
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: one line, unless debugging
        if _env.environ.get("KVAUDIT_DEBUG"):
            raise
        _env.stderr.write(f"kvaudit: internal error: {type(exc).__name__}: {printable(str(exc))} "
                          "(a bug; please report it with the input, KVAUDIT_DEBUG=1 shows the traceback)\n")
        return _unless_health_check(argv, int(ExitStatus.INTERNAL_ERROR), f"internal error: {type(exc).__name__}")
    return int(result) if isinstance(result, int) else 0


#: options of other tools that people type for kvaudit's: what kvaudit calls them
OTHER_TOOLS_OPTIONS = {"--forks": "--parallel (-j): hosts at a time (Ansible's --forks)",
                       "-c": "-m/--model-config for the model's config.json (-c is a pod's container, as in kubectl)"}


def _usage_words(exc: typer.BadParameter) -> str:
    """click's usage message, with kvaudit's own hint where an option of another tool was typed: the hint only for
    the option that was not found (issue 38, item 5: never appended to unrelated errors), in place of click's
    guess from spelling (``--forks`` is not ``--format``)."""
    said = exc.format_message()
    name = getattr(exc, "option_name", None)
    if type(exc).__name__ == "NoSuchOption" and isinstance(name, str):
        hint = OTHER_TOOLS_OPTIONS.get(name)
        if hint is not None:
            return f"No such option: {name}; use {hint}"
    return said


def _unless_health_check(argv: list[str], status: int, cause: str = "") -> int:
    """A health check that did not run (a usage error, a bad setting, a bug) is *unknown* on its scale, never
    a status the scheduler reads as a node problem (2 is CRITICAL on the Nagios scale), and it still prints its
    verdict on stdout in the scale's contract (``KVAUDIT UNKNOWN - not run: <cause>``, or the JSON document
    with --format json): Nagios shows "(No output on stdout)" and NPD an empty condition message otherwise."""
    if "--health-check" not in argv or not argv or argv[0] != "check":
        return status
    from kvaudit.health import SCALES, not_run, render

    def value(*names: str) -> str | None:
        got = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a in names), None)
        return next((a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] in names and "=" in a), got)

    scale = value("--exit-codes")
    scale = scale if scale in SCALES else "nagios"
    # the target as typed right after the command word (after an option it could be that option's value)
    target = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else ""
    verdict = not_run(printable(target), printable(" ".join(cause.split())) or "kvaudit did not run")
    if value("--format", "-f") == "json":
        from kvaudit.report.json import dumps

        _env.stdout.write(dumps(verdict.as_dict(scale)))
    else:
        _env.stdout.write(render(verdict, scale))
    return SCALES[scale][3]


def main() -> None:
    code = run(sys.argv[1:])
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    sys.exit(code)
