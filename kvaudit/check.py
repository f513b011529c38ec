"""``kvaudit check``: collect from a host (SSH, this machine, or a capture), then explain the startup and
reconcile it with the GPUs' live readings. Orchestration only."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from kvaudit.collect import capture as capture_mod
from kvaudit.collect.interface import CollectError, Collected, HostTimeout, JournalDenied, NoEngineFound, Runner
from kvaudit.collect.session import NO_CONFIG, CollectOptions, HostSession
from kvaudit.engines import all_anchors, process_names, startup_window
from kvaudit.platforms import detect
from kvaudit.explain import NoStartupError, ParsedLog, parse_lines, select, with_input_notes
from kvaudit.parse.lines import Line, clean
from kvaudit.reconcile.interface import Audit, AuditOptions
from kvaudit.reconcile.live import reconcile_gpus
from kvaudit.results import HostAudit
from kvaudit.record import record

if TYPE_CHECKING:
    from kvaudit.collect.endpoint import EndpointCapture


@record
class CheckOptions:
    audit: AuditOptions
    unit: str | None = None
    source: str | None = None
    journal_directory: str | None = None
    ssh_config: str | None = None
    accept_new_host_key: bool = False
    deadline_s: float = 120.0
    connect_timeout: float | None = None
    command_timeout: float = 60.0
    startup: int | None = None
    kubeconfig: str | None = None  # k8s: targets
    identity_file: str | None = None  # a key to try first (an inventory's ansible_ssh_private_key_file)
    selector: str | None = None  # k8s:NAMESPACE -l SELECTOR
    context: str | None = None  # k8s: the kubeconfig context (kubectl's --context)
    namespace: str | None = None  # k8s:/POD: the namespace (kubectl's -n); else the context's


def is_local(target: str) -> bool:
    return target in ("local", "localhost-local", "")


def collect(target: str, opts: CheckOptions) -> tuple[Collected, ParsedLog | None, list[str]]:
    """Read everything from the host. Raises CollectError subclasses for hosts that cannot be audited."""
    if capture_mod.is_capture(target):
        c = capture_mod.read(target)
        return c, _parse(c), []
    from kvaudit.targets import is_pod_target

    if is_pod_target(target):
        return _collect_pod(target, opts)
    from kvaudit.collect.commands import setting_problem
    from kvaudit.collect.interface import BadSetting

    problem = setting_problem(opts.unit, opts.journal_directory, opts.source)
    if problem is not None:
        raise BadSetting(problem)
    notes: list[str] = []
    copts = CollectOptions(all_anchors(), opts.unit, opts.source, opts.journal_directory, opts.command_timeout,
                           engine_names=process_names(), window=startup_window())
    runner: Runner
    if is_local(target):
        from kvaudit.collect.local import LocalRunner

        runner = LocalRunner()
    else:
        from kvaudit.collect.ssh import SSHRunner

        ssh = SSHRunner(target, opts.ssh_config, opts.accept_new_host_key, opts.deadline_s, opts.connect_timeout,
                        opts.identity_file)
        if ssh.policy_note:
            notes.append(ssh.policy_note)
        runner = ssh
    session = HostSession(runner, target, copts)
    try:
        if is_local(target) and not opts.source and _has_systemd_python():
            session.prefetch_start()  # the journal is read through systemd-python here, not by the script
        else:
            session.prefetch_host()
        session.hostname()
        lines: list[tuple[int, str]] = []
        try:
            journal = _local_journal(session, opts) if is_local(target) else None
            lines = journal if journal is not None else session.log_lines()
            log = _parse_lines(target, lines, session)
        except (NoEngineFound, JournalDenied) as exc:
            # no engine log: what else was read (GPUs, processes, the commands) is still the host's evidence
            exc.collected = _evidence(session, target, lines or [], str(exc))
            raise
        # what a request could have written (a startup line printed again) was set aside in parsing: the
        # config.json read is the one the audited startup names (kvaudit.parse.request_time)
        (startup,) = select(log, opts.startup)
        model_path = startup.model_path
        config, config_source = (None, None)
        if opts.audit.model_geometry is None:
            config, config_source = session.config(model_path if isinstance(model_path, str) else None)
        pids = session.server_pids()
        gpus, apps, gpu_source = _gpu_readings(session, target)
        if getattr(runner, "reconnected", False):
            notes.append("the SSH connection closed between two commands and was opened again (once)")
        return session.result(lines, gpus, apps, config, config_source, pids, gpu_source), log, notes
    finally:
        runner.close()


def _collect_pod(target: str, opts: CheckOptions) -> tuple[Collected, ParsedLog, list[str]]:
    """A pod's (or a pod group's) container log through the Kubernetes API."""
    from kvaudit.collect import kube

    reader = kube.KubeReader(opts.kubeconfig, opts.deadline_s, context=opts.context)
    t = kube.with_namespace(kube.parse_target(target, opts.selector, opts.namespace), reader)
    anchors = all_anchors()

    def has_startup(lines: list[tuple[int, str]]) -> bool:
        try:
            parse_lines(_cleaned(lines))
            return True
        except NoStartupError:
            return False

    log = kube.read_logs(reader, t, process_names(), anchors, has_startup)
    lines = list(log.lines)
    try:
        parsed = parse_lines(_cleaned(lines))
    except NoStartupError:
        raise kube.no_startup(t, log) from None
    gpus, apps, config, config_source, partial, records, gpu_pods = _pod_readings(reader, t, log, parsed, opts)
    c = kube.collected(str(t), log, lines, reader.records + records, partial)
    c = replace(c, gpus=tuple(gpus), apps=tuple(apps), config_json=config, config_source=config_source,
                gpu_source="nvidia-smi (pods/exec)" if gpus else None, pod_namespace=t.namespace,
                pod_container=log.container, pods=tuple(p.metadata.name for p in log.pods), gpu_pods=tuple(gpu_pods))
    return c, parsed, list(log.notes)


def _pod_readings(reader, t, log, parsed: ParsedLog, opts: CheckOptions):
    """nvidia-smi and the model's config.json from inside the engine's container(s), through pods/exec (the
    same gated commands as over SSH); when RBAC does not allow it, the audit says so. A group's pods are read
    in name order and their GPUs numbered on (the ranks run in that order)."""
    from kvaudit.collect import kube

    gpus: list = []
    apps: list = []
    partial: list[str] = []
    records: list = []
    gpu_pods: list[str] = []  # the pod each reading came from
    config = config_source = None
    copts = CollectOptions(all_anchors(), None, None, None, opts.command_timeout, engine_names=process_names())
    model_path = select(parsed, opts.startup)[0].model_path
    for i, pod in enumerate(log.pods):
        session = HostSession(kube.PodExecRunner(reader, t.namespace, pod.metadata.name, log.container),
                              f"{t.namespace}/{pod.metadata.name}", copts)
        try:
            wants_config = i == 0 and opts.audit.model_geometry is None and isinstance(model_path, str)
            session.prefetch_host(model_path if wants_config else None, read_log=False)  # one exec, when sh is there
            g, a = session.gpus()
            if i == 0 and opts.audit.model_geometry is None:
                config, config_source = session.config(model_path if isinstance(model_path, str) else None)
        except kube.ExecForbidden as exc:
            partial.append(str(exc))
            break
        except HostTimeout as exc:  # the log is read and audited; the readings ran out of the host's deadline
            partial.append(f"no GPU readings: {exc}")
            break
        finally:
            records += session.records
        offset = len(gpus)
        gpus += [replace(x, index=x.index + offset) for x in g]
        gpu_pods += [pod.metadata.name] * len(g)
        apps += a
        partial += [p for p in session.partial if p not in partial]
    if not gpus and not any("GPU readings" in p for p in partial):
        partial.append(kube.NO_GPU_READINGS)
    if opts.audit.model_geometry is None and config is None and not any(p.startswith(NO_CONFIG) for p in partial):
        partial.append(f"{NO_CONFIG}: the model's config.json is inside the pod (give --model-config); "
                       "bytes per token from the KV line")
    return gpus, apps, config, config_source, partial, records, gpu_pods


def _gpu_readings(session: HostSession, target: str):
    """The GPUs now: NVML on this machine when it answers, else nvidia-smi (on the host or here)."""
    gpus, apps, gpu_source = [], [], None
    if is_local(target):
        gpus, apps, gpu_source = _nvml(session)
    if not gpus and gpu_source is None:
        gpus, apps = session.gpus()
        gpu_source = "nvidia-smi" if gpus else None
    return gpus, apps, gpu_source


def _evidence(session: HostSession, target: str, lines: list[tuple[int, str]], why: str) -> Collected:
    gpus, apps, gpu_source = [], [], None
    try:
        gpus, apps, gpu_source = _gpu_readings(session, target)
        pids = session.server_pids()
    except CollectError:  # the host went away meanwhile: keep what there is
        pids = ()
    session.partial.insert(0, f"no engine log: {why}")
    return session.result(lines, gpus, apps, None, None, pids, gpu_source)


def _local_journal(session: HostSession, opts: CheckOptions) -> list[tuple[int, str]] | None:
    """On the host itself, read the journal through systemd-python when it is installed."""
    if opts.source:
        return None
    from kvaudit.collect.local import journal_python

    try:
        unit = opts.unit or session.discover_unit()
    except CollectError:
        return None
    session.unit = unit
    gen = journal_python(unit, None, opts.journal_directory, session.opts.anchors)
    if gen is None:
        return None
    lines = list(gen)
    session.source_desc = f"journal (systemd-python) unit={unit}" + (
        f" directory={opts.journal_directory}" if opts.journal_directory else "")
    return lines or None


def _has_systemd_python() -> bool:
    import importlib.util

    return importlib.util.find_spec("systemd") is not None


def _nvml(session: HostSession):
    from kvaudit.collect.nvml import NvmlUnavailable, read

    try:
        gpus, apps, version = read()
    except NvmlUnavailable:
        return [], [], None
    return gpus, apps, f"nvml ({version} memory info)"


def _cleaned(pairs) -> list[Line]:
    """Host-filtered lines arrive raw (ANSI, \r progress bars): the same cleaning as a local file gets."""
    return [Line(n, piece) for n, t in pairs for piece in clean(t)]


def _parse(c: Collected) -> ParsedLog | None:
    try:
        return parse_lines(_cleaned(c.log_lines))
    except NoStartupError:
        return None


def _parse_lines(target: str, lines: list[tuple[int, str]], session: HostSession) -> ParsedLog:
    try:
        return parse_lines(_cleaned(lines))
    except NoStartupError as exc:
        raise NoEngineFound(f"{target}: {exc} in {session.source_desc or 'the log'} "
                            f"({sum(r.bytes_received for r in session.records):,} bytes received)") from None


def audit_collected(c: Collected, log: ParsedLog | None, opts: CheckOptions,
                    notes: list[str] | None = None) -> HostAudit:
    notes = list(notes or [])
    if log is None:
        exc = NoEngineFound(f"{c.target}: no engine startup in the collected log ({len(c.log_lines)} lines)")
        exc.collected = c  # a capture made without the log still holds the GPUs and processes
        raise exc
    (startup,) = select(log, opts.startup)
    aopts = replace(opts.audit, source=c.source)
    if aopts.model_geometry is None and c.config_json is not None:
        from kvaudit.model_config import ConfigError, geometry_from_text

        try:
            aopts = replace(aopts, model_geometry=geometry_from_text(c.config_json, c.config_source or "config.json"))
        except ConfigError as exc:
            notes.append(f"remote config.json unusable: {exc}")
    if aopts.platform is None:  # the GPUs' own names (nvidia-smi, NVML), else the log's lines
        aopts = replace(aopts, platform=detect(g.name for g in c.gpus) or log.platform)
    audit = with_input_notes(log.engine.audit(startup, aopts, len(log.startups)), log, startup)
    if (audit.formula.bytes_per_token_source or "").startswith("log") and any(
            p.startswith(NO_CONFIG) for p in c.partial):
        # the log itself states bytes per token (TensorRT-LLM's "kv size per token"): the config is not needed
        c = replace(c, partial=tuple(p for p in c.partial if not p.startswith(NO_CONFIG)))
        notes.append("no config.json read: the log states the bytes per token")
    base = 0
    if startup.server_args and isinstance(startup.server_args.get("base_gpu_id"), int):
        base = startup.server_args["base_gpu_id"]
    gpus, findings = reconcile_gpus(audit, c, base, opts.audit.thresholds, process_names())
    return HostAudit(c.target, c, audit, gpus, findings, None, tuple(notes))


#: what an audit from a live endpoint lacks, always (the partial reason scripts see)
NO_GPU_READINGS_ENDPOINT = ("no GPU readings: an HTTP endpoint does not give them (kvaudit check HOST reads them "
                            "over SSH)")


#: what an engine's release string is made of (0.5.9, 0.6.3.post1, 0.10.1+cu128, 0.6.4.dev12+g1a2b3c)
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")


def endpoint_audit(target: str, opts: CheckOptions) -> tuple[Audit, "EndpointCapture"]:
    """Fetch a live server's documents and audit them with the engine they belong to."""
    from kvaudit.collect.endpoint import NotAnEndpoint, fetch
    from kvaudit.engines import audit_endpoint, endpoint_documents, endpoint_paths

    cap = fetch(target, endpoint_paths(), opts.deadline_s)
    docs = {d.path: d.body for d in cap.documents if d.status == 200}
    a = audit_endpoint(docs, cap.url, opts.audit)
    if a is not None and not _VERSION.fullmatch(a.engine_version or "unknown"):
        # the server's words are data (issue 39): a version string with an escape or Markdown is no version
        a = replace(a, engine_version="unknown", version_evidence=(
            "the endpoint's version string is not a version (letters, digits and . + _ - only): not shown",))
    if a is None:
        answered = ", ".join(sorted(docs)) or "nothing"
        raise NotAnEndpoint(f"{cap.url}: answers {answered}, but none of it is an engine's KV pool ("
                            f"{endpoint_documents()}); audit its startup log instead")
    return a, cap


def check_endpoint(target: str, opts: CheckOptions) -> HostAudit:
    """A live server from its own HTTP endpoints: what they establish, and what they cannot, said."""
    try:
        a, cap = endpoint_audit(target, opts)
    except CollectError as exc:
        return HostAudit(target, None, None, (), (), exc)
    partial = [NO_GPU_READINGS_ENDPOINT]
    if opts.audit.model_geometry is None and a.formula.bytes_per_token is None:
        partial.append(f"{NO_CONFIG} (give --model-config: an endpoint does not serve the model's config.json)")
    c = Collected(target=target, host=None, source=f"endpoint {cap.url}", log_lines=(),
                  gpus=(), apps=(), config_json=None, config_source=None, server_pids=(), commands=cap.requests,
                  partial=tuple(partial), collected_at=cap.collected_at)
    return HostAudit(target, c, a, (), (), None)


def cross_check(h: HostAudit, endpoint: str, opts: CheckOptions) -> HostAudit:
    """``check HOST --endpoint URL``: the live pool must be the one the startup log sized."""
    if h.audit is None:
        return h
    from kvaudit.reconcile import findings as F

    try:
        live, cap = endpoint_audit(endpoint, opts)
    except CollectError as exc:
        return replace(h, notes=h.notes + (f"endpoint {endpoint} not cross-checked: {exc}",))
    logged, now = h.audit.formula.logged_tokens, live.formula.logged_tokens
    if logged is None or now is None:
        return replace(h, notes=h.notes + (f"endpoint {cap.url}: no token count to compare with the startup's",))
    if logged == now:
        return replace(h, notes=h.notes + (f"live pool at {cap.url} = the startup's: {now:,} tokens",))
    return replace(h, findings=h.findings + (F.live_pool_changed(now, logged, live.source),))


def check(target: str, opts: CheckOptions) -> HostAudit:
    """One host, start to finish; a host that cannot be audited comes back as data (``error``), not raised."""
    from kvaudit.targets import is_endpoint

    if is_endpoint(target):
        return check_endpoint(target, opts)
    try:
        c, log, notes = collect(target, opts)
        return audit_collected(c, log, opts, notes)
    except CollectError as exc:
        if exc.collected is not None:  # no audit, but the GPUs and processes read are still shown
            gpus, live = reconcile_gpus(None, exc.collected, 0, opts.audit.thresholds, process_names())
            return HostAudit(target, exc.collected, None, gpus, live, exc)
        return HostAudit(target, None, None, (), (), exc)
    except NoStartupError as exc:
        return HostAudit(target, None, None, (), (), NoEngineFound(f"{target}: {exc}"))


def capture(target: str, opts: CheckOptions, directory: str) -> tuple[Collected, Path]:
    try:
        c, log, notes = collect(target, opts)
    except CollectError as exc:
        if exc.collected is None:
            raise
        # no engine log: the evidence is written anyway (GPUs, processes, commands), and says what is missing
        return exc.collected, capture_mod.write(exc.collected, directory)
    path = capture_mod.write(c, directory)
    try:  # what is partial depends on the log (one that states bytes per token needs no config.json)
        c = audit_collected(c, log, opts, notes).collected or c
    except (CollectError, NoStartupError):
        pass
    return c, path
