"""Tasks and data: prompts, SFT pairs, preference pairs and gold judges."""
