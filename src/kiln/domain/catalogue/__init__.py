"""Views over every recipe: the catalogue behind `kiln list` and `kiln show`, and the
README's recipe table. May use every other domain package; none uses it.
"""
