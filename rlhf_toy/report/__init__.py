"""A run explains itself: `report.html` (page.py) with its curves, sampled replies, settings and alarms
(alarms.py: what a bad run looks like, each with a detector and a plain explanation). The LM stages and CartPole
write the same page; `rlhf-toy report` and `cartpole report` rebuild it from a run directory."""
