"""Checks: the smoke checks an image runs on itself, the tiny model and data they use, the learning check. May import
training/ and steps/.
"""
