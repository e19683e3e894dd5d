"""The ``cloudtrain`` command. Importing it loads argparse only; each command imports what it needs."""
