"""Renderers: an :class:`~kvaudit.reconcile.interface.Audit` in, text out. No computation of new numbers."""

from __future__ import annotations

from typing import Callable

from kvaudit.reconcile.interface import Audit

FORMATS = ("text", "json", "markdown")


def renderer(fmt: str) -> Callable[..., str]:
    if fmt == "json":
        from kvaudit.report.json import render
    elif fmt == "markdown":
        from kvaudit.report.markdown import render
    else:
        from kvaudit.report.text import render
    return render


__all__ = ["Audit", "FORMATS", "renderer"]
