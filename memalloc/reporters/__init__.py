"""Reporters on plain data: the leak report's types, its JSON and HTML
renderings. They take dataclasses and dicts, never the allocator, so a report
read back from a file renders the same as one just measured."""
