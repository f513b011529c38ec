"""The engines' formulas and ledgers: pure functions from a startup's events to an Audit (a package per engine)."""
