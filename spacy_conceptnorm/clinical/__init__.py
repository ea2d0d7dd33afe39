"""Clinical documents: the assertion status of each linked entity (medspaCy's ConText, sectionizer and PyRuSH
sentence splitter) and its evaluation on annotated clinical text."""
