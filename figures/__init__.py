"""Figures rebuilt from the theory (``theory.py``, shared ``style.py``); gallery in figures/README.md.

Figures from saved simulation and validation results are issue 5's remaining work.
"""
