"""The recipe catalogue: each recipe's entry behind `kiln list` and `kiln show`
(`entries`), and the README's recipe table (`readme_table`). May use every other domain
package; none uses it.
"""
