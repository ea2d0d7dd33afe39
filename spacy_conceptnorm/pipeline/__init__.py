"""The spaCy components, one module per registered factory (and the settings for clinical notes)."""
