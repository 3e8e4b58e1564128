"""Recipes: a recipe file parsed, validated and completed (schema.py, recipe.py), one component per image part
(components/), image references and build sources (mirrors, indexes, CA). Imports no other host folder.
"""
