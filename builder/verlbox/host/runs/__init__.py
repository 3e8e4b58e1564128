"""Runs: run folders (`init`), `shell`, `doctor`, `report`: what a user does with a built image. May import trust/,
building/ and recipes/.
"""
