"""Pure string algorithms (no spaCy types): name normalization, abbreviation detection, composite-mention splitting."""
