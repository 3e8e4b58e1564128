"""Training: the image's entrypoint and everything a run needs (preflight, the command verl runs, the supervisor, the
watched console, checkpoints, records, profiles, overrides, the verl patch set, model and data). May import steps/.
"""
