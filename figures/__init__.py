"""Figures rebuilt from theory and from saved results (issue 5).

Empty until the figure functions land; the gallery will sit in figures/README.md.
"""
