"""Judges for the tests of `--judge module:function`."""


def length(text):
    return float(len(text))


def prompt_overlap(prompt, response):
    return float(len(set(prompt.split()) & set(response.split())))


def broken(text):
    return "very good"


def constant(text):
    """A gold judge that likes nothing better than anything else."""
    return 0.0
