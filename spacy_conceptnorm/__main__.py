"""`python -m spacy_conceptnorm <command>`: the command line (spacy_conceptnorm.cli)."""

if __name__ == "__main__":
    from .cli import main

    main()
