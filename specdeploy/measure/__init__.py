"""Measurement on hosts: arms, the sampling harness on fresh servers, the compare/tune plans and
the predict-then-confirm tune flow. The verdicts are decide/'s; the reports report/'s."""
