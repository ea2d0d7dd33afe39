"""Text preparation: name normalization, abbreviation resolution, composite-mention splitting."""
