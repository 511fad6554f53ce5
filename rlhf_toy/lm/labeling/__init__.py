"""Human feedback from a browser: `rlhf-toy label` serves pairs of replies, a person picks the better one, and
each choice is appended to `run_dir/human_preferences.jsonl`, which `reward --preferences_file` trains on.

- `store`: the label log (append-only JSONL, locked appends, retractions, resume) and the pairs it yields.
- `session`: the pairs sampled ahead and the labeling session; `app`: the web app (FastAPI, the 'label' extra).
  The `label` command that serves them is `pipeline.label` (this folder sits below `pipeline`).
- `browser`: headless Chromium through Playwright (the 'browser' extra): the tests' browser and a simulated
  labeler that lets a judge press the keys.
"""
