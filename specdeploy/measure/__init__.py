"""Measurement: arms, the sampling harness, the compare/tune/predict plans, statistics and
decisions, reports, and the speculation gate. Imports the server lifecycle and the steps, never the
reverse."""
