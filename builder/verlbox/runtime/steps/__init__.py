"""Build steps: what a Dockerfile's RUN executes (build_steps.py and its records, Apex's reproducible compile, the one
URL rule, placed-file hashes). Standard library only where a step runs before verlbox is installed; imports no other
runtime folder.
"""
