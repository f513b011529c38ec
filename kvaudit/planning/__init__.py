"""The plan's vocabulary, below the engines' planners (kvaudit/reconcile/<engine>/planner.py) and the plan command
(kvaudit/plan/): what a plan asks and answers (``model``), the terms every engine's plan shares (``terms``), and the
calibration of those terms on the fleet's recorded startups (``calibrate``). It imports no command package (plan,
fleet, explain, report), so the engines' planners can use it without an import running up a layer or in a circle."""
