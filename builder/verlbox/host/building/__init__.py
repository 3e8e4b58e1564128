"""Building: the plan, the Dockerfile text (templating.py, render.py, templates/), the build context, BuildKit through
the engine, bootstrapped bases, staging tags, source archives, disk room. May import recipes/.
"""
