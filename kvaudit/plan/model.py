"""The plan's data types, kept in :mod:`kvaudit.planning.model` (below the engines' planners); re-exported here for
the modules that name them by the plan command's package (the fleet's history)."""

from kvaudit.planning.model import (ASSUMED, CALIBRATED, FORMULA, GIVEN, Draft, Observed, Plan, PlanInput, Term,
                                    model_key)

__all__ = ["ASSUMED", "CALIBRATED", "FORMULA", "GIVEN", "Draft", "Observed", "Plan", "PlanInput", "Term", "model_key"]
