#!/bin/bash
# Finish the draft-choice branch once the queued live run of tests/integration/test_choose_draft.py
# (log /tmp/draft-live.log) has PASSED: its recordings become the fast tier's replay, the manual's
# chart is drawn from them, and everything is committed on draft-choice. Run: bash /tmp/draft-finish.sh
set -euo pipefail
cd /work/w-draft
LOG=${DRAFT_LIVE_LOG:-/tmp/draft-live.log}
grep -q "^rc=0 " "$LOG" || { echo "the live run has not passed (see /tmp/draft-live.log)"; exit 1; }
for r in trained_choose_draft trained_choose_draft_record; do
  test -f tests/unit/data/replays/$r/provenance.json || { echo "no recording $r"; exit 1; }
done
export PYTHONPATH=/work/w-draft PATH=/work/main/.venv/bin:$PATH
python benchmarks/docs_figures.py draft
python3 - <<'EOF'
from pathlib import Path
p = Path("docs/guides/measure.md"); s = p.read_text()
old = ("on repetitive, code-like requests prompt lookup can beat every draft, on chat it seldom does. A\n"
       "chart from a live run will be added here once the sandbox's run is recorded.\n")
new = ("on repetitive, code-like requests prompt lookup can beat every draft, on chat it seldom does.\n\n"
       "![Which draft on the sandbox: each candidate's TPOT predicted over k with its proven median "
       "and the baseline's, and its acceptance by position](../assets/draft-tpot.png)\n")
assert old in s; p.write_text(s.replace(old, new))
p = Path("tests/unit/project/test_docs_figures.py"); s = p.read_text()
s = s.replace('for replay in ("trained_compare", "trained_tune"):',
              'for replay in ("trained_compare", "trained_tune", "trained_choose_draft"):')
s = s.replace('"load_ratio.png"}  # fmt: skip', '"load_ratio.png", "draft_tpot.png"}  # fmt: skip')
p.write_text(s)
EOF
python -m ruff check . && python -m ruff format --check . >/dev/null
nice -n 19 python -m pytest -q -p no:cacheprovider tests/unit/measure/test_draft_choice_replay.py \
  tests/unit/measure/test_draft_choice.py tests/unit/project/test_docs_figures.py \
  tests/unit/project/test_docs_text.py tests/unit/project/test_wings.py
[ -n "${NO_COMMIT:-}" ] && { echo "checked, not committed"; exit 0; }
git add tests/unit/data/replays/trained_choose_draft tests/unit/data/replays/trained_choose_draft_record \
  tests/unit/measure/test_draft_choice_replay.py docs/assets/draft-tpot.png docs/guides/measure.md \
  benchmarks/docs_figures.py tests/unit/project/test_docs_figures.py
git commit -m "choose_draft: the live run's recordings (trained_choose_draft, _record) replayed in the fast tier (the flow asks for the recorded runs and records the recorded choice, the report and the record's choice replay through the rules, the winner's p recomputed, the ranking follows the recorded evidence); the measure guide's chart drawn from them"
git log --oneline -1
