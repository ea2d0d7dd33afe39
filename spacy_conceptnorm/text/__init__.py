"""Pure string algorithms (no spaCy types): name normalization."""
