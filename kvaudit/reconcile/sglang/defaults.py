"""SGLang's default ``mem_fraction_static`` per release, when ``--mem-fraction-static`` is not given.

``srt/server_args.py``: ``ServerArgs.__post_init__`` (0.3.0-0.4.7), ``_handle_gpu_memory_settings`` (0.4.8+).
``gpu_mem`` is ``get_device_memory_capacity()``: nvidia-smi's memory.total in MiB, the minimum over the visible
GPUs (the card's physical size, not T). ``p`` is tp x pp where the release uses it.

- 0.3.0-0.4.5: by tp_size: >=16 0.79, >=8 0.83 (0.3.0-0.3.4) / 0.82 (0.3.6) / 0.81 (0.4.0+), >=4 0.85, >=2 0.87,
  else 0.88.
- 0.4.6: that table up to 81,920 MiB, else (gpu_mem - 13 GiB) / gpu_mem.
- 0.4.7: the table (by p) up to 80 GiB, else 0.88; over 180,000 MiB 0.79; over 96 GiB
  min(f + 48 GiB x (1 - f) / gpu_mem, (gpu_mem - 18 GiB) / gpu_mem).
- 0.4.8-0.5.2 (PR #7054): round((gpu_mem - reserved) / gpu_mem, 3), reserved (MiB) (2.8 + p/10) GiB under 35 GiB,
  (9.5 + p/2) GiB under 90, (12 + p/2) GiB under 160, else 32 GiB; +4 GiB with DP attention.
- 0.5.3-0.5.9 (PR #10975): chunked_prefill_size and cuda_graph_max_bs by gpu_mem, then
  reserved = 512 + max(chunked, 2048) x 1.5 + max_bs x 2 + p / 8 x 1024 (+ DP-attention terms), at least 10 GiB on
  cards over 60 GiB; round((gpu_mem - reserved) / gpu_mem, 3).
- 0.5.10-0.5.17: the same with the piecewise CUDA graph on by default: MLA models +1.5 GiB; other models
  + len(piecewise capture sizes) x 8 MiB (their default maximum is not established here: not modelled).
- post-capture KV sizing (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``, opt-in, default off; 0.5.16+, and only where
  ``post_capture_kv_sizing_planned`` admits it: CUDA, no MLA, no FP4 KV, no DP attention, graphs on): the graph and
  activation reserve is skipped, reserved = R + p / 8 x 1024 MiB with R = 512 (0.5.16-0.5.17) or 1536 (0.5.18+,
  server_args.py, then ``arg_groups/memory_hook.py`` from 0.5.19), no 10 GiB floor; round((gpu_mem - reserved) /
  gpu_mem, 3). Multimodal models are then adjusted by the vision tower (not modelled).
- 0.5.18+ without post-capture sizing (``memory_hook.py`` from 0.5.19), multimodal models
  (``adjust_mem_fraction_for_vlm`` needs the vision tower's size) and speculative decoding: not modelled; the plan
  asks for --fraction.

Source: kvaudit's reading of server_args.py per release (docs/plan.md, "SGLang's default fraction"); the
0.5.3-0.5.9 rule was checked against ``_handle_gpu_memory_settings`` as published.
"""

from __future__ import annotations

from kvaudit.versions import parse_version

GIB_MIB = 1024


def _by_tp(tp: int, v: tuple[int, ...]) -> float | None:
    if tp >= 16:
        return 0.79
    if tp >= 8:
        if v < (0, 3, 5):
            return 0.83
        if v[:2] == (0, 3):
            return 0.82 if v >= (0, 3, 6) else None  # 0.3.5: not established
        return 0.81
    return 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88


def _graph_defaults(gpu_mem: float, tp: int, v: tuple[int, ...]) -> tuple[int, int] | None:
    """(chunked_prefill_size, cuda_graph_max_bs) by the card's memory (0.5.3+)."""
    if gpu_mem < 20 * GIB_MIB:
        return 2048, 8
    if gpu_mem < 35 * GIB_MIB:
        if tp >= 4:
            return 2048, 80
        if v <= (0, 5, 3):
            return 2048, 16
        return (2048, 24) if v >= (0, 5, 9) else None  # 16 or 24 between 0.5.4 and 0.5.8: not established
    if gpu_mem < 60 * GIB_MIB:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem < 160 * GIB_MIB:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_fraction(version: str, gpu_mem_mib: float, tp: int, pp: int, dp_attention: int, mla: bool,
                     multimodal: bool, speculative: str | None = None,
                     post_capture: bool = False) -> tuple[float | None, str]:
    """(the default, how it was formed) or (None, why it is not modelled). ``speculative``: the algorithm, when a
    draft runs (its reserve: 0.4.7 20 GiB instead of 18, or x 0.95; 0.4.8-0.5.2 +2 GiB; 0.5.3-0.5.9 +2 GiB,
    STANDALONE +6; 0.5.10-0.5.13 EAGLE +4 GiB, STANDALONE +6; none from 0.5.14, where the draft is counted).
    ``post_capture``: SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is set (0.5.16+)."""
    v = parse_version(version)
    p = tp * pp
    if post_capture:
        return _post_capture_default(version, v, gpu_mem_mib, p, dp_attention, mla, multimodal)
    if speculative and v < (0, 4, 7):
        return None, f"SGLang {version}'s default with a speculative draft is not established"
    if multimodal and v >= (0, 3, 0):
        return None, ("a multimodal model's default is scaled by its vision tower (adjust_mem_fraction_for_vlm), "
                      "which kvaudit does not size")
    if v < (0, 3, 0):
        return None, f"SGLang {version} predates the releases kvaudit reads"
    if v < (0, 4, 6):
        f = _by_tp(tp, v)
        return (f, f"SGLang {version}'s default by TP {tp} (server_args.py)") if f else (
            None, f"SGLang {version}'s TP-8 default is not established")
    if v < (0, 4, 7):
        if gpu_mem_mib <= 81920:
            return _by_tp(tp, v), f"SGLang 0.4.6's default by TP {tp} (cards up to 80 GiB)"
        f = (gpu_mem_mib - 13 * GIB_MIB) / gpu_mem_mib
        return f, f"SGLang 0.4.6: ({gpu_mem_mib:,.0f} - 13 GiB) / {gpu_mem_mib:,.0f} MiB"
    if v < (0, 4, 8):
        by_tp = _by_tp(p, v) if gpu_mem_mib <= 80 * GIB_MIB else 0.88
        if by_tp is None:
            return None, f"SGLang 0.4.7's default for {p} ranks is not established"
        f = by_tp
        if gpu_mem_mib > 180_000:
            f = 0.79
        elif gpu_mem_mib > 96 * GIB_MIB:
            keep = (20 if speculative else 18) * GIB_MIB
            f = min(f + 48 * GIB_MIB * (1 - f) / gpu_mem_mib, (gpu_mem_mib - keep) / gpu_mem_mib)
        elif speculative:
            f *= 0.95
        return f, f"SGLang 0.4.7's default for {gpu_mem_mib:,.0f} MiB and {p} ranks" + (
            f" with {speculative}" if speculative else "")
    if v < (0, 5, 3):
        gib = gpu_mem_mib / GIB_MIB
        reserved = ((2.8 + p / 10) if gib < 35 else (9.5 + p / 2) if gib < 90 else (12 + p / 2) if gib < 160
                    else 32) * GIB_MIB
        if dp_attention > 1:
            reserved += 4096
        if speculative:
            reserved += 2048
        f = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
        return f, (f"SGLang {version}: round(({gpu_mem_mib:,.0f} - {reserved:,.0f} reserved) / {gpu_mem_mib:,.0f}, 3) "
                   "(server_args.py, PR #7054)")
    if v >= (0, 5, 18):
        return None, f"SGLang {version}'s default (arg_groups/memory_hook.py) is not modelled by plan yet"
    if v >= (0, 5, 10) and not mla:
        return None, (f"SGLang {version} reserves the piecewise CUDA graphs' capture sizes x 8 MiB by default, "
                      "whose default maximum kvaudit has not established for a non-MLA model")
    defaults = _graph_defaults(gpu_mem_mib, tp, v)
    if defaults is None:
        return None, f"SGLang {version}'s cuda_graph_max_bs for this card is not established (16 or 24)"
    chunked, max_bs = defaults
    parts = [512.0, max(chunked, 2048) * 1.5, max_bs * 2.0, p / 8 * 1024]
    words = f"512 + max({chunked}, 2048) x 1.5 + {max_bs} x 2 + {p}/8 x 1024"
    if dp_attention > 1:
        parts.append(max_bs * dp_attention * 3.0)
        words += f" + {max_bs} x {dp_attention} x 3"
        if max_bs > 300:
            parts.append(max_bs * dp_attention * 1.5)
            words += f" + {max_bs} x {dp_attention} x 1.5"
    if v >= (0, 5, 10):  # mla: the piecewise prefill graphs
        parts.append(1.5 * GIB_MIB)
        words += " + 1.5 GiB (MLA piecewise graphs)"
    reserved = sum(parts)
    if gpu_mem_mib > 60 * GIB_MIB and reserved < 10 * GIB_MIB:
        reserved, words = 10 * GIB_MIB, words + ", at least 10 GiB"
    if speculative and v < (0, 5, 14):
        extra = 6 if speculative == "STANDALONE" else 4 if v >= (0, 5, 10) else 2
        reserved += extra * GIB_MIB
        words += f", + {extra} GiB for the {speculative} draft"
    f = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return f, (f"SGLang {version}: round(({gpu_mem_mib:,.0f} - {reserved:,.0f}) / {gpu_mem_mib:,.0f}, 3), reserved = "
               f"{words} MiB (server_args.py _handle_gpu_memory_settings)")


def _post_capture_default(version: str, v: tuple[int, ...], gpu_mem_mib: float, p: int, dp_attention: int,
                          mla: bool, multimodal: bool) -> tuple[float | None, str]:
    """The default under post-capture KV sizing (server_args.py 0.5.16-0.5.18, arg_groups/memory_hook.py 0.5.19+:
    the ``post_capture_kv_sizing_planned`` branch)."""
    if v < (0, 5, 16):
        return None, f"SGLang {version} has no post-capture KV sizing (0.5.16+)"
    if mla:
        return None, ("post-capture KV sizing is off for MLA models (post_capture_kv_sizing_planned): the usual "
                      "default applies")
    if dp_attention > 1:
        return None, ("post-capture KV sizing with DP attention depends on the prefill graphs' coverage in later "
                      "releases: not modelled")
    if multimodal:
        return None, ("a multimodal model's default is then adjusted by its vision tower "
                      "(adjust_mem_fraction_for_vlm), which kvaudit does not size")
    base = 512 if v < (0, 5, 18) else 1536
    reserved = base + p / 8 * 1024
    f = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    return f, (f"SGLang {version} with post-capture KV sizing: round(({gpu_mem_mib:,.0f} - ({base} + {p}/8 x 1024)) / "
               f"{gpu_mem_mib:,.0f}, 3) ({'server_args.py' if v < (0, 5, 19) else 'arg_groups/memory_hook.py'}: "
               "the graph and activation reserve is skipped, measured after capture instead)")
