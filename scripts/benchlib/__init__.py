"""The benchmark harness, beside the scripts that run it and outside the installed package (the library works from
a wheel without it): `rlhf` (this project's RLHF step against TRL's trainers, run through `scripts/peers/`),
`floor` (each phase's FLOPs from the model's weights and the machine's matmul rate: its compute floor) and
`cartpole` (CartPole against Stable-Baselines3, and populations).

The scripts import it as `benchlib` (`python scripts/bench_rlhf.py` puts `scripts/` on the path); the tests as
`scripts.benchlib`. A run in a subprocess imports it by path (`SCRIPTS`)."""

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]  # scripts/: the peers' runners live in scripts/peers/
