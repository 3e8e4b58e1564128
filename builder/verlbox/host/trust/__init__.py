"""Trust: locks from build records, verify, bundles and their checks, clamped offline images, `build --check` against
upstreams. May import building/ and recipes/.
"""
