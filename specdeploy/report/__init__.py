"""Where reports land and what they say: run directories, a bench result's summary,
summary.md/json and their charts."""
