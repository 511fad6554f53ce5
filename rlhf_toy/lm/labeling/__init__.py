"""Human feedback from a browser: `rlhf-toy label` serves pairs of replies, a person picks the better one, and
each choice is appended to `run_dir/human_preferences.jsonl`, which `reward --preferences_file` trains on.

- `store`: the label log (append-only JSONL, locked appends, retractions, resume) and the pairs it yields.
- `app`: the pairs sampled ahead, the labeling session, the web app (FastAPI, the 'label' extra) and the command.
- `browser`: headless Chromium through Playwright (the 'browser' extra): the tests' browser and a simulated
  labeler that lets a judge press the keys.
"""
