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


def right(text):
    """A checker that marks every reply right (1.0): every group is all right."""
    return 1.0
