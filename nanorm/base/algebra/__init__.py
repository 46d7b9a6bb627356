"""
The exact algebra under verifiable.py: two answers are equal when their canonical keys are,
computed with Fractions, surds and symbols, never floats and never eval. verifiable.py is the
idea (extract, compare, reward); these files are the machinery it compares with, read when a
case needs them: extract.py (which part of a completion is the answer), exact.py (the key of an
answer), values.py, roots.py, logs.py, trig.py, integers.py, polynomials.py, matrices.py,
intervals.py, named.py, decimals.py, units.py, spellings.py, brackets.py. They import nothing
of the project outside this folder.
"""
