"""The fleet: many hosts audited in parallel, reported together, remembered between runs."""
