"""kvaudit plan: a deployment sized before it exists, by the engine's own formula, with every term that is not
a formula calibrated on the fleet's own startups (the history) or said to be assumed."""
