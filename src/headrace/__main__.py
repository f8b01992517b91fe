"""`python -m headrace` is the `headrace` command."""

from headrace.service.cli import main

main()
