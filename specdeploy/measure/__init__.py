"""Measurement on hosts: arms, the compare/tune plans and their harness (the plan run through
sampling/, the room below steps that the gate uses too), the predict-then-confirm tune flow. The
verdicts are decide/'s; the reports report/'s."""
