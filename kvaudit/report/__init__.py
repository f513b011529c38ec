"""Renderers: an :class:`~kvaudit.reconcile.interface.Audit` in, text out. No computation of new numbers.

The formats and which renderer each command uses are in :mod:`kvaudit.report.formats`."""
