"""Clients: the host's ways out, the Docker engine (engine.py), HTTP upstreams (upstream.py: one-line
failures, the registry's token exchange, logins kept to their host) and the image reference grammar they
share. Import no other host folder.
"""
