"""The library function behind every CLI command: it runs, measures and returns a JSON-able
report; the CLI parses, calls it and prints."""
